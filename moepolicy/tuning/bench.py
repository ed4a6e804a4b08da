"""The measurement interface shared by the live DeepEP bench and the calibrated model bench.

A bench answers one question: how long do dispatch and combine take for this config on this
workload. Failures are raised as :class:`TrialFailed` and become FAIL trials, never crashes.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Optional

from moepolicy.names import TUNED_REGIMES
from moepolicy.deepep.configs import ChunkConfig

Chunk = ChunkConfig  # nvl_send, nvl_recv, rdma_send, rdma_recv (effective)


class TrialFailed(Exception):
    """A measurement did not produce a usable number; the reason goes into the trial."""


@dataclass(frozen=True)
class Workload:
    hidden: int
    num_experts: int
    top_k: int
    ep_size: int
    payload: str = "bf16"  # what goes on the wire: bf16 | fp8 (block-128 float32 scales)
    routing: str = "uniform"
    both_orders: bool = False  # also time quant_then_dispatch and dispatch_then_quant
    # which of the two is timed first (rounds alternate it)
    orders_first: str = "quant_then_dispatch"
    # host: each call timed as an eager engine runs it, the host's launches and waits on the critical
    # path (vLLM's DeepEP high-throughput path: eager, CUDA graphs off with DP > 1); gpu: the GPU's own
    # time, the host enqueued ahead (a CUDA-graph or run-ahead engine)
    regime: str = "host"
    internode: bool = False  # EP above the NVLink domain: RDMA chunks are searched too


REGIMES = tuple(r.value for r in TUNED_REGIMES)  # a tune times in these (bench also: runahead)


@dataclass(frozen=True)
class Envelope:
    """Where a modelled bench's answers are trusted: the ranges its fit saw. Outside them a tune keeps
    DeepEP's defaults, labelled ``extrapolated``."""

    sms: tuple[int, int]
    tokens: tuple[int, int]
    hidden: tuple[int, int]
    regime: str
    # False: chunk effects are not fitted from measurements, so chunks are not chosen
    chunks_fitted: bool

    def problem(self, workload: Workload, tokens: list[int]) -> Optional[str]:
        lo, hi = self.hidden
        if not lo <= workload.hidden <= hi:
            return f"hidden {workload.hidden} is outside the calibrated range {lo}-{hi}"
        if workload.regime != self.regime:
            return f"the calibration was timed in the {self.regime} regime, not {workload.regime}"
        lo, hi = self.tokens
        outside = [t for t in tokens if not lo <= t <= hi]
        if outside:
            return f"token bucket {outside[0]} is outside the calibrated {lo}-{hi} tokens per rank"
        return None


@dataclass(frozen=True)
class TunePoint:
    num_sms: int
    tokens: int
    dispatch: ChunkConfig
    combine: ChunkConfig

    def __post_init__(self) -> None:
        # plain 4-tuples (a study's JSON, a script) become ChunkConfigs
        object.__setattr__(self, "dispatch", ChunkConfig(*self.dispatch))
        object.__setattr__(self, "combine", ChunkConfig(*self.combine))


@dataclass(frozen=True)
class Measurement:
    dispatch_us: float  # the call serving makes (layout + dispatch without a cached handle)
    dispatch_cached_us: float  # the kernel alone with a cached handle
    combine_us: float
    source: str  # measured | modelled
    # {"quant_then_dispatch": us, "dispatch_then_quant": us}
    orders: dict = field(default_factory=dict)

    def objective(self, region: str = "full") -> float:
        return (
            self.dispatch_us if region == "full" else self.dispatch_cached_us
        ) + self.combine_us

    def as_dict(self) -> dict:
        return asdict(self)


def check_measurement(m: Measurement) -> Measurement:
    """Refuse nonsense: NaN, infinite, negative, or absurdly small times."""
    for name in ("dispatch_us", "dispatch_cached_us", "combine_us"):
        value = getattr(m, name)
        if not isinstance(value, (int, float)) or math.isnan(value) or math.isinf(value):
            raise TrialFailed(f"{name} is not a finite number ({value!r})")
        if value <= 0.5:
            raise TrialFailed(f"{name} = {value} us is not a plausible DeepEP time (<= 0.5 us)")
    return m


class Bench(ABC):
    """One method to implement; ``start``/``close`` default to no-ops."""

    name = "bench"
    source = "measured"
    noise_free = False  # a model answers the same every time: one re-measurement round says all
    restarts_fresh = True  # ``restart`` gives new processes (not so where torchrun owns the ranks)
    # why its times are no performance figure (EP ranks sharing a GPU); empty for a measurement
    functional = ""

    def start(self, workload: Workload) -> None:  # noqa: B027 (optional hook)
        """Called once before the first measurement."""

    @abstractmethod
    def measure(self, workload: Workload, point: TunePoint) -> Measurement:
        """Time dispatch and combine for ``point``; raise :class:`TrialFailed` when it cannot."""

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Release workers or GPUs."""

    def restart(self) -> None:
        """Start afresh before a re-measurement (new worker processes, a new ``deep_ep.Buffer``): the
        next measurement starts the bench again (see ``restarts_fresh``)."""
        self.close()

    def identity(self) -> str:
        """The hardware this bench measures on (recorded on every trial)."""
        return self.name

    def in_envelope(self, workload: Workload, gpu: str) -> Optional[str]:
        """None when this bench's answers are trusted for the workload; else why not."""
        return None

    def envelope(self, workload: Workload) -> Optional[Envelope]:
        """The fitted ranges of a modelled bench; None for a bench that measures (no limits)."""
        return None
