"""One token bucket of ``tune --overlap`` as a typed value, and its one serialised form.

The policy stores each bucket's row under ``deepep.buckets[].measured`` as flat keys (the form
schema 1.x documents carry); :meth:`OverlapBucketRow.to_doc` writes it and
:meth:`OverlapBucketRow.from_doc` reads it back, so the key names live here alone. Ratios are
derived from the stored times, never stored separately from them. The comparison with vLLM's split
that is printed is the paired one (:attr:`OverlapBucketRow.paired_vs_vllm`: the geometric mean of the
per-round speed-ups with the exact sign-flip test's 95 % interval); ``vs_vllm_split`` (a ratio of
medians) stays for older readers. From schema 2.2 the rows come from report rounds in fresh workers
(``rounds_from: report``); older rows came from the rounds that chose the split (``selection``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from moepolicy.tuning.protocol import Figure, figure

# the launch orders a row may carry, as they prefix its keys (``tuning.overlap.ORDER_ROWS``)
LAUNCH_ORDERS = ("gemm_first", "comm_first", "comm_first_no_wait")


def _r(x: Optional[float], digits: int = 1) -> Optional[float]:
    return None if x is None else round(float(x), digits)


@dataclass(frozen=True)
class SplitTimes:
    """One split's medians over the confirmation rounds."""

    overlapped_us: float  # in the order the split was chosen for
    spread_us: tuple[float, float]
    comm_us: float
    gemm_us: float
    gemm_kind: Optional[str] = None
    gemm_sms: Optional[int] = None
    by_order: Mapping[str, float] = field(default_factory=dict)  # LAUNCH_ORDERS -> overlapped us
    comm_no_wait_us: Optional[float] = None
    deepep_waited_rounds: Optional[int] = None

    def _to_doc(self, prefix: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            f"{order}_overlapped_us": _r(us) for order, us in self.by_order.items()
        }
        if self.comm_no_wait_us is not None:
            out["comm_no_wait_us"] = _r(self.comm_no_wait_us)
        if self.deepep_waited_rounds is not None:
            out["deepep_waited_for_gemm_rounds"] = self.deepep_waited_rounds
        return {prefix + k: v for k, v in out.items()}

    @classmethod
    def _orders_from_doc(cls, m: Mapping[str, Any], prefix: str) -> dict[str, Any]:
        return {
            "by_order": {
                o: m[f"{prefix}{o}_overlapped_us"]
                for o in LAUNCH_ORDERS
                if m.get(f"{prefix}{o}_overlapped_us") is not None
            },
            "comm_no_wait_us": m.get(f"{prefix}comm_no_wait_us"),
            "deepep_waited_rounds": m.get(f"{prefix}deepep_waited_for_gemm_rounds"),
        }


@dataclass(frozen=True)
class SplitBound:
    """The lowest floor, max(comm alone, GEMM alone), of every config the search measured."""

    floor_us: float
    split: int
    bound_by: str  # GEMM | communication


@dataclass(frozen=True)
class OverlapBucketRow:
    objective: str  # the launch order the split was chosen for
    rounds: int
    chosen: SplitTimes
    serial_us: float
    comm_region: str  # full | no-wait: the communication alone that bounds the pair
    comm_end_us: Optional[float] = None
    gemm_end_us: Optional[float] = None
    vllm: Optional[SplitTimes] = None  # vLLM's split, re-measured in the same rounds
    per_round_vs_vllm: tuple[float, ...] = ()
    bound: Optional[SplitBound] = None
    # report: fresh rounds that decided nothing; selection: the rounds that chose
    rounds_from: str = "selection"
    family: int = 1  # the buckets whose intervals are simultaneous (Bonferroni) with this one's

    @property
    def paired_vs_vllm(self) -> Optional[Figure]:
        """The kept split's speed-up over vLLM's split, paired per round (above 1: faster), with its
        interval simultaneous over ``family`` buckets."""
        if not self.per_round_vs_vllm:
            return None
        ratios = list(self.per_round_vs_vllm)
        return figure([1.0] * len(ratios), ratios, ("this split", "vLLM's split"), self.family)

    @property
    def floor_us(self) -> float:
        return max(self.chosen.comm_us, self.chosen.gemm_us)

    @property
    def vs_floor(self) -> float:
        return self.chosen.overlapped_us / self.floor_us

    @property
    def vs_vllm_split(self) -> Optional[float]:
        return self.chosen.overlapped_us / self.vllm.overlapped_us if self.vllm else None

    def vs_vllm_split_in(self, order: str) -> Optional[float]:
        """The ratio in another launch order (both sides measured in it), else None."""
        mine = self.chosen.by_order.get(order)
        theirs = self.vllm.by_order.get(order) if self.vllm else None
        return mine / theirs if mine and theirs else None

    @property
    def gemm_alone_vs_vllm_split(self) -> Optional[float]:
        """How the GEMM alone sped up from vLLM's split's SMs to this split's (measured)."""
        if not (self.vllm and self.vllm.gemm_us and self.chosen.gemm_sms and self.vllm.gemm_sms):
            return None
        return self.chosen.gemm_us / self.vllm.gemm_us

    @property
    def gemm_sm_ratio_vs_vllm_split(self) -> Optional[float]:
        """What the GEMM's speed-up would be if its time followed its SM count (arithmetic)."""
        if not (self.vllm and self.chosen.gemm_sms and self.vllm.gemm_sms):
            return None
        return self.vllm.gemm_sms / self.chosen.gemm_sms

    @property
    def best_floor_vs_vllm_split(self) -> Optional[float]:
        if not (self.bound and self.vllm):
            return None
        return self.bound.floor_us / self.vllm.overlapped_us

    def to_doc(self) -> dict[str, Any]:
        c = self.chosen
        out: dict[str, Any] = {
            "objective": self.objective,
            "overlapped_us": _r(c.overlapped_us),
            "overlapped_spread_us": [_r(c.spread_us[0]), _r(c.spread_us[1])],
            "rounds": self.rounds,
            "serial_us": _r(self.serial_us),
            "floor_us": _r(self.floor_us),
            "comm_us": _r(c.comm_us),
            "comm_region": self.comm_region,
            "gemm_us": _r(c.gemm_us),
            "comm_end_in_overlap_us": _r(self.comm_end_us),
            "gemm_end_in_overlap_us": _r(self.gemm_end_us),
            "vs_floor": _r(self.vs_floor, 3),
            "gemm": c.gemm_kind,
            "rounds_from": self.rounds_from,
            "simultaneous_over": self.family,
            "vllm_split_overlapped_us": None,
            "vs_vllm_split": None,
            **c._to_doc(""),
        }
        if c.gemm_sms is not None:
            out["gemm_sms"] = c.gemm_sms
        v = self.vllm
        if v is not None:
            out.update(
                {
                    "vllm_split_gemm": v.gemm_kind,
                    "vllm_split_gemm_us": _r(v.gemm_us),
                    "vllm_split_comm_us": _r(v.comm_us),
                    "vllm_split_overlapped_us": _r(v.overlapped_us),
                    "vllm_split_spread_us": [_r(v.spread_us[0]), _r(v.spread_us[1])],
                    "vs_vllm_split": _r(self.vs_vllm_split, 3),
                    "vs_vllm_split_per_round": [_r(x, 4) for x in self.per_round_vs_vllm],
                    "speedup_vs_vllm_split": (
                        None if self.paired_vs_vllm is None else self.paired_vs_vllm.to_doc()
                    ),
                    **v._to_doc("vllm_split_"),
                }
            )
            if v.gemm_sms is not None:
                out["vllm_split_gemm_sms"] = v.gemm_sms
            for order in LAUNCH_ORDERS:
                ratio = self.vs_vllm_split_in(order)
                if ratio is not None:
                    out[f"vs_vllm_split_{order}"] = _r(ratio, 3)
            if self.gemm_alone_vs_vllm_split is not None:
                out["gemm_alone_vs_vllm_split"] = _r(self.gemm_alone_vs_vllm_split, 3)
                out["gemm_sm_ratio_vs_vllm_split"] = _r(self.gemm_sm_ratio_vs_vllm_split, 3)
        if self.bound is not None:
            out.update(
                {
                    "best_floor_us": _r(self.bound.floor_us),
                    "best_floor_split": self.bound.split,
                    "best_floor_bound_by": self.bound.bound_by,
                }
            )
            if self.best_floor_vs_vllm_split is not None:
                out["best_floor_vs_vllm_split"] = _r(self.best_floor_vs_vllm_split, 3)
        return out

    @classmethod
    def from_doc(cls, m: Mapping[str, Any]) -> "OverlapBucketRow":
        """A stored row (any 1.x or 2.x policy written by ``tune --overlap``)."""
        spread = m.get("overlapped_spread_us") or [m["overlapped_us"]] * 2
        chosen = SplitTimes(
            m["overlapped_us"],
            tuple(spread),
            m.get("comm_us", 0.0),
            m.get("gemm_us", 0.0),
            m.get("gemm"),
            m.get("gemm_sms"),
            **SplitTimes._orders_from_doc(m, ""),
        )
        vllm = None
        if m.get("vllm_split_overlapped_us") is not None:
            vspread = m.get("vllm_split_spread_us") or [m["vllm_split_overlapped_us"]] * 2
            vllm = SplitTimes(
                m["vllm_split_overlapped_us"],
                tuple(vspread),
                m.get("vllm_split_comm_us") or 0.0,
                m.get("vllm_split_gemm_us") or 0.0,
                m.get("vllm_split_gemm"),
                m.get("vllm_split_gemm_sms"),
                **SplitTimes._orders_from_doc(m, "vllm_split_"),
            )
        bound = (
            SplitBound(m["best_floor_us"], m["best_floor_split"], m["best_floor_bound_by"])
            if m.get("best_floor_us") is not None
            else None
        )
        return cls(
            objective=m.get("objective", "gemm-first"),
            rounds=m.get("rounds", 0),
            chosen=chosen,
            serial_us=m.get("serial_us") or 0.0,
            comm_region=m.get("comm_region", "full"),
            comm_end_us=m.get("comm_end_in_overlap_us"),
            gemm_end_us=m.get("gemm_end_in_overlap_us"),
            vllm=vllm,
            per_round_vs_vllm=tuple(m.get("vs_vllm_split_per_round") or ()),
            bound=bound,
            rounds_from=m.get("rounds_from", "selection"),
            family=m.get("simultaneous_over", 1),
        )
