"""Measured facts that enter the rules: both dispatch orders timed at one token bucket.

A live ``tune`` produces them (``tuning.confirm.time_both_orders``); the planner decides again with
them (``measured.faster_order``); the document records them (``deepep.measured_orders``, written by
``document.deepep_section``). Here, below all three, so none imports another to share the type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from moepolicy.names import UNMEASURED, Order


@dataclass(frozen=True)
class OrderTiming:
    """Both orders timed at one token bucket (per rank), for the payload ``tune`` measured: medians
    over rotated rounds and the paired test's verdict (``verdict``: the order faster beyond noise, or
    ``unmeasured`` where neither is, so the rules' order stands). Without a verdict (a document written
    before schema 2.2: one sample each) the smaller time."""

    tokens: int
    quant_then_dispatch_us: float
    dispatch_then_quant_us: float
    rounds: int = 1
    speedup: Optional[float] = None  # quantizing first: dispatch_then_quant / quant_then_dispatch
    ci95: Optional[tuple[float, float]] = None
    verdict: Optional[str] = None  # quant_then_dispatch | dispatch_then_quant | unmeasured
    correction: str = ""
    # what was timed: "" for both orders through live DeepEP; else how the step was put together
    # (e.g. the rank's compute measured on one GPU, communication modelled)
    basis: str = ""

    @property
    def faster(self) -> str:
        if self.verdict is not None:
            return self.verdict
        return (
            Order.QUANT_THEN_DISPATCH
            if self.quant_then_dispatch_us <= self.dispatch_then_quant_us
            else Order.DISPATCH_THEN_QUANT
        ).value


def overall_faster(timings: Sequence[OrderTiming]) -> str:
    """The order for every token count: where the timings carry tests, the order every bucket found
    faster beyond noise, else ``unmeasured`` (the rules' order); without tests the smaller total."""
    if timings and all(t.verdict is not None for t in timings):
        verdicts = {t.verdict for t in timings if t.verdict is not None}  # all of them
        return verdicts.pop() if len(verdicts) == 1 else UNMEASURED
    qtd = sum(t.quant_then_dispatch_us for t in timings)
    dtq = sum(t.dispatch_then_quant_us for t in timings)
    return (Order.QUANT_THEN_DISPATCH if qtd <= dtq else Order.DISPATCH_THEN_QUANT).value


# The expert kernel as part of the policy: what a tune measured of each kernel's MoE step. The tuner
# (``tuning.expert_choice``) produces these values; the planner decides again with the chosen kernel
# (``measured.faster_kernel``) and each kernel's order timings; ``document.experts_section`` writes
# them as the document's ``experts`` section.


@dataclass(frozen=True)
class KernelStatus:
    """Whether an expert kernel's stage could be timed here, with where it was found or why not."""

    kernel: str
    runs: bool
    detail: str


@dataclass(frozen=True)
class ArmTiming:
    """One (expert kernel, order) arm of the MoE step at one token bucket, per rank, in us: the rank's
    own compute (its sender quantization and expert stage, the report rounds' median) and the
    communication of the arm's wire (None where no figure exists for this target)."""

    kernel: str
    order: str
    compute_us: float
    dispatch_us: Optional[float] = None
    combine_us: Optional[float] = None

    @property
    def name(self) -> str:
        return f"{self.kernel}/{self.order}"

    @property
    def step_us(self) -> Optional[float]:
        if self.dispatch_us is None or self.combine_us is None:
            return None
        return self.compute_us + self.dispatch_us + self.combine_us


@dataclass(frozen=True)
class KernelTest:
    """A kernel's step against the engine's pick at one bucket (or over the weighted buckets,
    ``tokens`` 0): the decision's verdict from its own rounds, the figure from report rounds."""

    tokens: int
    contender: str  # arm names, kernel/order
    baseline: str
    verdict: str  # faster | slower | within noise (the gate's, with ``correction``)
    speedup: float  # report rounds: baseline step over contender step (above 1: contender faster)
    ci95: Optional[tuple[float, float]] = None  # report rounds; None for a modelled bench
    correction: str = ""


@dataclass(frozen=True)
class ExpertChoice:
    """Which expert kernel's MoE step was faster for this target, and on what evidence."""

    engine_default: str  # the engine's own pick (kernel.default)
    faster_kernel: str  # the kernel measured faster beyond noise than it, or ``unmeasured``
    source: str  # measured | modelled: where the expert-stage times came from
    basis: str  # one sentence: what was measured, what modelled, what missing
    why: str  # one sentence a person can act on
    kernels: tuple[KernelStatus, ...] = ()
    arms: tuple[tuple[int, tuple[ArmTiming, ...]], ...] = ()  # per bucket: tokens, arms
    orders: tuple[tuple[str, tuple[OrderTiming, ...]], ...] = ()  # per kernel with both orders
    tests: tuple[KernelTest, ...] = ()
    rounds: int = 0  # rounds per phase (decide, report); 0 for a modelled bench

    def orders_for(self, kernel: str) -> tuple[OrderTiming, ...]:
        return next((timings for name, timings in self.orders if name == kernel), ())
