"""The search space (``moepolicy/data/tuning/space-ht.yaml``): feasible points only, DeepEP's rounding applied."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from moepolicy._resources import data_dir
from moepolicy.errors import TuningError
from moepolicy.deepep.buffers import effective_rdma_recv, nvl_bytes_hint
from moepolicy.tuning.bench import Chunk


@dataclass(frozen=True)
class Space:
    raw: dict[str, Any]
    sha256: str
    path: str

    @property
    def sms_grid(self) -> list[int]:
        return list(self.raw["num_sms"]["grid"])

    def sms_candidates(self, sm_count: int, max_sms: Optional[int]) -> list[int]:
        cap = min(sm_count, max_sms) if max_sms else sm_count
        grid = [s for s in self.sms_grid if s <= cap and s % 2 == 0]
        if max_sms:
            budget = max_sms - max_sms % 2
            if budget > 0 and budget not in grid:
                grid.append(budget)
        if not grid:
            raise TuningError(
                f"no even SM count fits the budget: max_sms {max_sms}, GPU has {sm_count}"
            )
        return sorted(grid)

    def suggest(
        self,
        trial,
        kind: str,
        internode: bool,
        max_nvl_recv: int,
        rdma_default: tuple[int, int] = (6, 132),
    ) -> Chunk:
        """One feasible chunk config; intranode keeps the default RDMA fields (unused there)."""
        spec = self.raw[kind]
        recv_choices = [c for c in spec["nvl_recv"]["choices"] if c <= max_nvl_recv]
        if not recv_choices:
            raise TuningError(f"no {kind} NVLink receive capacity fits the buffer budget")
        nvl_recv = trial.suggest_categorical(f"{kind}.nvl_recv", recv_choices)
        nvl_send = trial.suggest_int(
            f"{kind}.nvl_send",
            spec["nvl_send"]["low"],
            min(spec["nvl_send"]["high"], nvl_recv - 1),
        )
        if not internode:
            return Chunk(nvl_send, nvl_recv, *rdma_default)
        r = spec["rdma_send"]
        rdma_send = trial.suggest_int(
            f"{kind}.rdma_send", r["low"], r["high"], step=r.get("step", 1)
        )
        rdma_recv = trial.suggest_categorical(f"{kind}.rdma_recv", spec["rdma_recv"]["choices"])
        rdma_recv = max(effective_rdma_recv(rdma_send, rdma_recv), 2 * rdma_send)
        return Chunk(nvl_send, nvl_recv, rdma_send, rdma_recv)

    def max_nvl_recv(self, num_sms: int, hidden: int, ep_size: int, max_buffer_bytes: int) -> int:
        """Largest receive capacity whose NVLink buffer (bf16 rows) fits the budget."""
        best = 0
        for kind in ("dispatch", "combine"):
            for recv in self.raw[kind]["nvl_recv"]["choices"]:
                if nvl_bytes_hint(num_sms, recv, hidden * 2, ep_size) <= max_buffer_bytes:
                    best = max(best, recv)
        return best


def load_space(path: Optional[str] = None) -> Space:
    import hashlib

    # the sheets' readers (YAML, Pydantic) load when a sheet is read
    from moepolicy.datasheets import read_yaml

    p = Path(path) if path else data_dir("tuning") / "space-ht.yaml"
    raw = read_yaml(p)
    for key in ("num_sms", "dispatch", "combine"):
        if not isinstance(raw, dict) or key not in raw:
            raise TuningError(f"{p}: search space needs '{key}'")
    return Space(raw=raw, sha256=hashlib.sha256(p.read_bytes()).hexdigest(), path=str(p))


def load_objective(path: Optional[str] = None) -> dict[str, Any]:
    # the sheets' readers (YAML, Pydantic) load when a sheet is read
    from moepolicy.datasheets import read_yaml

    p = Path(path) if path else data_dir("tuning") / "objective.yaml"
    raw = read_yaml(p)
    if raw.get("timed_region") not in ("full", "cached"):
        raise TuningError(f"{p}: timed_region must be full or cached")
    return raw
