"""Where a tune gets the per-rank expert stage's times: one rank's own compute in a MoE step, per
(expert kernel, order) arm, at one token bucket.

An arm is ``kernel/order``: ``deepgemm/quant_then_dispatch`` quantizes the T tokens it sends and runs
DeepGEMM on the fp8 rows it receives; ``deepgemm/dispatch_then_quant`` quantizes the bf16 rows it
receives, then runs the same stage (``measure.expert_stage``). The dispatch between is not in these
times: ``tuning.expert_choice`` adds the communication of each arm's wire.

- :class:`LiveExpertBench` times the arms on this process's GPU, rounds rotating over the arms
  (measured).
- :class:`RecordedExpertBench` answers from the H200 campaign that ships with the package
  (``data/tuning/expert_stage``, derived from ``benchmarks/raw``): only at the model shapes and EP
  sizes it recorded, token counts inside the recorded buckets (log-log interpolation between them),
  with its error (modelled).

Both say per kernel whether it can answer (``schema.measured.KernelStatus``): a kernel that cannot
be timed is listed as not measured, with why; no stand-in is ever timed in its place.
"""

from __future__ import annotations

import math
import statistics
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from moepolicy._resources import data_dir
from moepolicy.measure.routing import ExpertShape, check_shape, rank_view
from moepolicy.names import LAUNCH_MODE
from moepolicy.schema.measured import KernelStatus

ORDERS = ("quant_then_dispatch", "dispatch_then_quant")
# The kernels the stage can be timed with, and the orders each runs: DeepGEMM reads fp8 rows, so
# either side may quantize; FlashInfer's CUTLASS MoE quantizes bf16 rows itself (bf16 on the wire).
KERNEL_ORDERS = {"deepgemm": ORDERS, "flashinfer_cutlass": ("no_quant",)}


def arm_name(kernel: str, order: str) -> str:
    return f"{kernel}/{order}"


@dataclass(frozen=True)
class StageTimes:
    """Per-round compute times (us) of each arm at one bucket; a modelled bench gives one value
    per arm and its relative ``error``."""

    per_round: dict[str, list[float]]
    error: float = 0.0  # relative error of a modelled figure (0 for a measurement)


class ExpertBench(ABC):
    """The expert stage's times for a target's shape at a token bucket."""

    name: str = ""
    source: str = "measured"  # measured | modelled
    noise_free: bool = False  # a model answers the same every time: no rounds, an error instead

    @abstractmethod
    def kernels(self, names: Sequence[str]) -> tuple[KernelStatus, ...]:
        """For each expert kernel: whether this bench can time its stage, and where or why not."""

    def problem(self, shape: ExpertShape, tokens: int) -> Optional[str]:
        """Why the bench cannot answer at this shape and bucket (None when it can)."""
        return None

    @abstractmethod
    def times(
        self, shape: ExpertShape, tokens: int, arms: Sequence[str], rounds: int
    ) -> StageTimes:
        """Each arm's compute, ``rounds`` rotated rounds (a modelled bench: one value each)."""

    def describe(self) -> str:
        return self.name


def live_stage_problem() -> Optional[str]:
    """Why this process cannot time the expert stage (None when it can): torch with a Hopper GPU
    and DeepGEMM, found the way vLLM finds it."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU visible"
    # torch: the live stage only
    from moepolicy.measure import expert_stage

    status = expert_stage.kernel_status(["deepgemm"])[0]
    return None if status.runs else status.detail


class LiveExpertBench(ExpertBench):
    """The arms timed on this process's GPU with the real expert GEMMs (``measure.expert_stage``)."""

    name = "live expert stage"
    source = "measured"

    def __init__(self, regime: str = "host", reps: int = 10, seed: int = 0):
        self.mode = LAUNCH_MODE[regime]
        self.regime, self.reps, self.seed = regime, reps, seed
        self._gpu = ""

    def kernels(self, names: Sequence[str]) -> tuple[KernelStatus, ...]:
        from moepolicy.measure import expert_stage

        return expert_stage.kernel_status(names)

    def problem(self, shape: ExpertShape, tokens: int) -> Optional[str]:
        from moepolicy.measure import expert_stage

        return check_shape(shape) or expert_stage.stage_shape_ok(shape)

    def times(
        self, shape: ExpertShape, tokens: int, arms: Sequence[str], rounds: int
    ) -> StageTimes:
        import torch

        from moepolicy.measure import expert_stage

        device = torch.device("cuda", torch.cuda.current_device())
        self._gpu = torch.cuda.get_device_name(device)
        experts = expert_stage.DeepGemmExperts(shape, device, seed=self.seed)
        inputs = experts.inputs(rank_view(shape, tokens, self.seed), self.seed)
        fns = expert_stage.step_arms(experts, inputs)
        chosen = {a: fns[a.split("/", 1)[1]] for a in arms}
        per_round = expert_stage.time_arms(chosen, rounds, self.reps, self.mode, device)
        del experts, inputs
        torch.cuda.empty_cache()
        return StageTimes(per_round)

    def describe(self) -> str:
        on = f" on this {self._gpu}" if self._gpu else " on this GPU"
        return f"expert stage measured{on} ({self.regime} regime, {self.reps} repetitions a round)"


@dataclass(frozen=True)
class RecordedCell:
    shape: ExpertShape
    regime: str
    tokens: int
    per_round: dict[str, tuple[float, ...]]  # order -> recorded per-round us

    def median(self, order: str) -> float:
        return statistics.median(self.per_round[order])

    def halves_error(self) -> float:
        """How far the medians of the first and second halves of the recorded rounds disagree
        (relative, largest over the orders): the figure's own reproduction error."""
        worst = 0.0
        for xs in self.per_round.values():
            half = len(xs) // 2
            a, b = statistics.median(xs[:half]), statistics.median(xs[half:])
            worst = max(worst, abs(a - b) / min(a, b))
        return worst


def _shape(raw: dict, ep: int) -> ExpertShape:
    groups = raw.get("groups")
    return ExpertShape(
        int(raw["hidden"]),
        int(raw["intermediate"]),
        int(raw["experts"]),
        int(raw["top_k"]),
        ep,
        tuple(groups) if groups else None,
    )


def load_recorded(folder: Optional[str] = None) -> tuple[dict, tuple[RecordedCell, ...]]:
    """The shipped expert-stage campaign: its provenance and cells."""
    # the sheets' readers (YAML, Pydantic) load when a sheet is read
    from moepolicy.datasheets import read_yaml

    root = Path(folder) if folder else data_dir("tuning") / "expert_stage"
    provenance, cells = {}, []
    for path in sorted(root.glob("*.yaml")):
        raw = read_yaml(path)
        provenance = {**raw["provenance"], "file": path.name}
        for c in raw["cells"]:
            cells.append(
                RecordedCell(
                    _shape(c, int(c["ep"])),
                    c["regime"],
                    int(c["tokens"]),
                    {o: tuple(float(v) for v in c["us"][o]) for o in ORDERS},
                )
            )
    return provenance, tuple(cells)


def _interpolate(x: float, points: list[tuple[int, float]]) -> float:
    """Log-log interpolation between the two recorded buckets either side of ``x``."""
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= x <= x1:
            f = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return math.exp(math.log(y0) + f * (math.log(y1) - math.log(y0)))
    raise ValueError(f"{x} is outside the recorded buckets")


class RecordedExpertBench(ExpertBench):
    """The expert stage as the H200 campaign recorded it (modelled: a replay of the recorded
    medians, interpolated between recorded buckets), only where it recorded."""

    name = "recorded expert stage"
    source = "modelled"
    noise_free = True

    def __init__(self, gpu: str, regime: str = "host", folder: Optional[str] = None):
        self.gpu, self.regime = gpu, regime
        self.provenance, self.cells = load_recorded(folder)

    def _recorded_gpu(self) -> str:
        return str(self.provenance.get("gpu", ""))

    def kernels(self, names: Sequence[str]) -> tuple[KernelStatus, ...]:
        kernel = self.provenance.get("kernel", "")
        out = []
        for name in names:
            if name == kernel and self.gpu == self._recorded_gpu():
                out.append(
                    KernelStatus(
                        name,
                        True,
                        f"the campaign on {self.provenance['recorded_on']}, "
                        f"{self.provenance.get('date', '?')}",
                    )
                )
            elif name == kernel:
                out.append(
                    KernelStatus(
                        name, False, f"recorded on {self._recorded_gpu()} only, not {self.gpu}"
                    )
                )
            else:
                out.append(KernelStatus(name, False, f"no recorded expert-stage times for {name}"))
        return tuple(out)

    def _series(self, shape: ExpertShape) -> list[RecordedCell]:
        return sorted(
            (c for c in self.cells if c.shape == shape and c.regime == self.regime),
            key=lambda c: c.tokens,
        )

    def problem(self, shape: ExpertShape, tokens: int) -> Optional[str]:
        series = self._series(shape)
        if not series:
            return f"the recorded campaign has no cell at {shape.label()} ({self.regime} regime)"
        lo, hi = series[0].tokens, series[-1].tokens
        if not lo <= tokens <= hi:
            return f"{tokens} tokens per rank is outside the recorded {lo}-{hi}"
        return None

    def error(self, shape: ExpertShape, tokens: int) -> float:
        """At a recorded bucket, how far the two halves of its rounds disagree; between buckets, the
        larger of that and the series' leave-one-out interpolation error (each inner bucket
        predicted from its neighbours)."""
        series = self._series(shape)
        exact = [c for c in series if c.tokens == tokens]
        if exact:
            return exact[0].halves_error()
        loo = [c.halves_error() for c in series]
        for i in range(1, len(series) - 1):
            for order in ORDERS:
                pts = [(series[j].tokens, series[j].median(order)) for j in (i - 1, i + 1)]
                got, want = _interpolate(series[i].tokens, pts), series[i].median(order)
                loo.append(abs(got - want) / want)
        return max(loo)

    def times(
        self, shape: ExpertShape, tokens: int, arms: Sequence[str], rounds: int
    ) -> StageTimes:
        why = self.problem(shape, tokens)
        if why:
            raise ValueError(why)
        series = self._series(shape)
        out = {}
        for arm in arms:
            order = arm.split("/", 1)[1]
            points = [(c.tokens, c.median(order)) for c in series]
            out[arm] = [_interpolate(tokens, points)]
        return StageTimes(out, self.error(shape, tokens))

    def describe(self) -> str:
        p = self.provenance
        return (
            f"expert stage modelled from the {p.get('recorded_on', '?')} campaign of "
            f"{p.get('date', '?')} ({p.get('source', '?')}; {self.regime} regime)"
        )
