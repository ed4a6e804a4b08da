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
        verdicts = {t.verdict for t in timings}
        return verdicts.pop() if len(verdicts) == 1 else UNMEASURED
    qtd = sum(t.quant_then_dispatch_us for t in timings)
    dtq = sum(t.dispatch_then_quant_us for t in timings)
    return (Order.QUANT_THEN_DISPATCH if qtd <= dtq else Order.DISPATCH_THEN_QUANT).value
