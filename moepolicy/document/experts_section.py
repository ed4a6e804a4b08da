"""The policy's ``experts`` section (schema 2.4), built in one place from a tune's
:class:`~moepolicy.schema.measured.ExpertChoice` and the kernel the plan's MoE layers run."""

from __future__ import annotations

from typing import Any

from moepolicy.document.builder import section
from moepolicy.document.deepep_section import order_timing_doc
from moepolicy.document.model import ExpertsDoc
from moepolicy.schema.measured import ArmTiming, ExpertChoice, KernelTest


def _arm(arm: ArmTiming) -> dict[str, Any]:
    out: dict[str, Any] = {"kernel": arm.kernel, "order": arm.order, "compute_us": arm.compute_us}
    if arm.dispatch_us is not None and arm.combine_us is not None:
        out.update({"dispatch_us": arm.dispatch_us, "combine_us": arm.combine_us})
    return out


def _test(test: KernelTest) -> dict[str, Any]:
    out: dict[str, Any] = {
        "contender": test.contender,
        "baseline": test.baseline,
        "verdict": test.verdict,
        "speedup": test.speedup,
    }
    if test.tokens:
        out["tokens"] = test.tokens
    if test.ci95 is not None:
        out["ci95"] = list(test.ci95)
    if test.correction:
        out["correction"] = test.correction
    return out


def _order(timing) -> dict[str, Any]:
    out = order_timing_doc(timing)
    if not timing.rounds:  # a modelled figure: no rounds
        out.pop("rounds", None)
    if out.get("ci95") is None:  # none exists (a model's figure): not written as null
        out.pop("ci95", None)
    return out


def experts_section(choice: ExpertChoice, kernel: str) -> ExpertsDoc:
    """``choice`` as the document records it; ``kernel``: what the policy's MoE layers run."""
    orders = [
        {"kernel": name, **_order(t)}
        for name, timings in choice.orders
        for t in timings
        if t.quant_then_dispatch_us > 0 and t.dispatch_then_quant_us > 0
    ]
    return section(
        ExpertsDoc,
        "experts",
        kernel=kernel,
        engine_default=choice.engine_default,
        faster_kernel=choice.faster_kernel,
        source=choice.source,
        basis=choice.basis,
        why=choice.why,
        rounds=choice.rounds,
        kernels=[
            {"kernel": s.kernel, "available": s.runs, "detail": s.detail} for s in choice.kernels
        ],
        buckets=[
            {"tokens": tokens, "arms": [_arm(a) for a in arms]} for tokens, arms in choice.arms
        ],
        orders=orders,
        tests=[_test(t) for t in choice.tests],
    )
