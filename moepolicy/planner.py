"""checkpoint facts + target (+ measured facts) → feasibility → per-layer decisions.

The planner only decides: :mod:`moepolicy.document.compose` writes a plan as the policy document.
Measured order timings (``tune`` on the live bench) enter as facts: the rules decide again with
``measured.faster_order``, per token bucket; a layer whose decision they change keeps the rules'
decision without them (``unmeasured``) for a runtime whose tuning key does not match.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from moepolicy.errors import InfeasibleError
from moepolicy.expert_kernel import (
    Deployment,
    Execution,
    default_kernel,
    engine_words,
    execution_for,
)
from moepolicy.feasibility import model_problems, wire_problem
from moepolicy.rules.engine import Decision, KernelChoice, choose_kernel, decide
from moepolicy.rules.grammar import RulePack
from moepolicy.rules.packs import vllm_stack
from moepolicy.rules.vocabulary import (
    UNMEASURED,
    kernel_choice_facts,
    layer_facts,
    with_kernel,
)
from moepolicy.schema.facts import LayerFacts, ModelFacts
from moepolicy.schema.measured import ExpertChoice, OrderTiming, overall_faster
from moepolicy.target import Target, target_from_doc


@dataclass(frozen=True)
class LayerPlan:
    layer: LayerFacts
    facts: dict[str, Any]
    execution: Execution
    decision: Decision
    # the rules' decision without measured facts, where it differs
    unmeasured: Optional[Decision] = None
    # per bucket, where they differ
    bucket_decisions: tuple[tuple[Optional[int], Decision], ...] = ()
    kernel_choice: Optional[KernelChoice] = None  # the expert-kernel rule that chose (MoE layers)


@dataclass(frozen=True)
class Plan:
    model: ModelFacts
    target: Target
    packs: tuple[RulePack, ...]
    layers: tuple[LayerPlan, ...]
    timings: tuple[OrderTiming, ...] = ()  # measured facts the layers were decided with
    experts: Optional[ExpertChoice] = None  # the expert kernels' MoE steps a tune compared

    @property
    def kernel_label(self) -> str:
        if self.target.expert_kernel:
            return self.target.expert_kernel
        kernels = sorted({lp.execution.kernel for lp in self.layers if lp.layer.kind == "moe"})
        return (
            kernels[0]
            if len(kernels) == 1
            else ("auto: " + "+".join(kernels) if kernels else "none")
        )


def choose_layer_kernel(
    layer: LayerFacts, target: Target, packs: Sequence[RulePack], faster_kernel: str = UNMEASURED
) -> tuple[Execution, dict[str, Any], Optional[KernelChoice]]:
    """The expert kernel a layer runs, chosen by the packs' expert-kernel rules from the engine's
    pick, the kernel asked for and the kernel a tune measured faster (dense layers: none)."""
    where = Deployment(target.engine, target.backend, target.deepep.api)
    default = default_kernel(layer, target.arch, where)
    choice_facts = kernel_choice_facts(layer, default, target.expert_kernel, faster_kernel)
    if layer.kind != "moe":
        return execution_for(layer, target.arch, None, where), choice_facts, None
    choice = choose_kernel(choice_facts, packs)
    why = (
        engine_words(where)
        if choice.kernel == default and choice.rule.endswith("engine-default")
        else f"{choice.rule}: {choice.reason}"
    )
    return execution_for(layer, target.arch, choice.kernel, where, why), choice_facts, choice


def decide_layer(
    layer: LayerFacts,
    target: Target,
    packs: Sequence[RulePack],
    faster_order: str = UNMEASURED,
    faster_kernel: str = UNMEASURED,
) -> LayerPlan:
    execution, choice_facts, kernel_choice = choose_layer_kernel(
        layer, target, packs, faster_kernel
    )
    facts = layer_facts(layer, target, execution, faster_order, choice_facts)
    decision = decide(
        facts,
        packs,
        target.deepep,
        lambda then, f: wire_problem(then, f, target),
        allow_inferred="inferred-capabilities" in target.options,
    )
    return LayerPlan(layer, facts, execution, decision, kernel_choice=kernel_choice)


def _measured_layer(
    plain: LayerPlan, target: Target, packs: Sequence[RulePack], timings: Sequence[OrderTiming]
) -> LayerPlan:
    """Decide again with the measured facts: overall, and per bucket where the faster order changes."""
    kernel = plain.facts.get("measured.faster_kernel", UNMEASURED)
    overall = decide_layer(plain.layer, target, packs, overall_faster(timings), kernel)
    per_bucket = [
        (
            None if i == len(timings) - 1 else t.tokens,
            decide_layer(plain.layer, target, packs, t.faster, kernel).decision,
        )
        for i, t in enumerate(timings)
    ]
    differ = len({(d.order, str(d.wire)) for _, d in per_bucket}) > 1
    changed = (overall.decision.order, overall.decision.wire) != (
        plain.decision.order,
        plain.decision.wire,
    )
    return LayerPlan(
        plain.layer,
        overall.facts,
        overall.execution,
        overall.decision,
        unmeasured=plain.decision if changed or differ else None,
        bucket_decisions=tuple(per_bucket) if differ else (),
    )


def measured_wire(plan: LayerPlan) -> bool:
    """Whether ``tune``'s both-order timing applies to this layer: block-128 fp8 quantized first."""
    d = plan.decision
    scale = d.wire.scale
    return (
        d.order == "quant_then_dispatch"
        and scale is not None
        and scale.granularity == "block"
        and scale.group == 128
    )


def with_measurements(plan: "Plan", timings: Sequence[OrderTiming]) -> "Plan":
    """``plan`` decided again with measured order timings as facts (layers whose wire was timed)."""
    if not timings:
        return plan
    layers = tuple(
        _measured_layer(lp, plan.target, plan.packs, timings) if measured_wire(lp) else lp
        for lp in plan.layers
    )
    return Plan(plan.model, plan.target, plan.packs, layers, tuple(timings), plan.experts)


def with_expert_choice(
    plan: "Plan", experts: ExpertChoice
) -> tuple["Plan", tuple[OrderTiming, ...]]:
    """``plan`` decided again with the kernel a tune measured faster (a measured fact: the
    experts pack's rule uses it), and the order timings of the kernel its MoE layers now run, where
    the expert stage was measured (a modelled comparison is reported, never decided on)."""
    measured = experts.source == "measured"
    faster = experts.faster_kernel if measured else UNMEASURED
    layers = tuple(
        decide_layer(lp.layer, plan.target, plan.packs, faster_kernel=faster)
        if lp.layer.kind == "moe"
        else lp
        for lp in plan.layers
    )
    decided = Plan(plan.model, plan.target, plan.packs, layers, plan.timings, experts)
    kernels = {lp.execution.kernel for lp in layers if lp.layer.kind == "moe"}
    timings = experts.orders_for(kernels.pop()) if measured and len(kernels) == 1 else ()
    return decided, timings


def _kernel_problems(layers: Sequence[LayerPlan], target: Target) -> list[str]:
    if target.expert_kernel is None:
        return []
    problems = []
    for lp in layers:
        w = lp.layer.weights
        if lp.layer.kind == "moe" and not lp.execution.supported and w.is_known:
            problems.append(
                f"expert kernel {target.expert_kernel} does not run {w.dtype}/{w.granularity} expert "
                f"weights on {target.arch} (layer {lp.layer.index}; moepolicy/data/sheets/expert_kernels.yaml)"
            )
    return list(dict.fromkeys(problems))[:1]


def make_plan(facts: ModelFacts, target: Target, packs: Sequence[RulePack]) -> Plan:
    """Decide every layer, or raise :class:`InfeasibleError` naming why the target cannot serve."""
    problems = model_problems(facts, target)
    if problems:
        raise InfeasibleError(
            f"infeasible: {facts.name} on {target.gpu} EP{target.ep_size} {target.layout} "
            f"{target.backend}: " + "; ".join(problems)
        )
    layers = tuple(decide_layer(layer, target, packs) for layer in facts.layers)
    kernel_problems = _kernel_problems(layers, target)
    if kernel_problems:
        raise InfeasibleError("infeasible: " + kernel_problems[0])
    return Plan(facts, target, tuple(packs), layers)


def replay_facts(index: int, stored: dict[str, Any]) -> dict[str, Any]:
    """A stored layer's facts as the rules read them (``document.compose.stored_facts`` reversed)."""
    return {"layer.index": index, **stored}


def replayed_decisions(
    layers, target: Target, packs: Sequence[RulePack], kernel: str = "chosen"
) -> dict[int, Decision]:
    """Each MoE layer's decision by ``packs``, replayed from the facts a document stored (what the
    ``vllm`` pack says vLLM does, for ``bench`` and the vLLM export: one copy of that knowledge).
    ``kernel``: ``chosen`` replays the kernel the policy chose (the one its launch builds);
    ``engine`` the engine's own pick (or the kernel asked for), as the engine runs without moepolicy."""
    out = {}
    for layer in layers:
        if layer.kind != "moe":
            continue
        facts = replay_facts(layer.index, layer.facts)
        if kernel == "engine":
            asked = facts.get("kernel.asked", "none")
            own = (
                asked if asked != "none" else facts.get("kernel.default", facts.get("kernel.name"))
            )
            if isinstance(own, str):  # a hand-edited set without its kernel keeps the facts it has
                facts = with_kernel(facts, own)
        out[layer.index] = decide(
            facts,
            packs,
            target.deepep,
            lambda then, f: wire_problem(then, f, target),
            allow_inferred=False,
        )
    return out


def vllm_plan(plan: Plan) -> Optional[Plan]:
    """What vLLM alone decides for ``plan``'s model and target: the :func:`vllm_stack` decided on
    the facts the plan read (``plan`` and ``tune`` compare their policy with it); None when ``plan``
    is vLLM's own (its stack holds the ``vllm`` pack)."""
    if any(p.name == "vllm" for p in plan.packs):
        return None
    return make_plan(plan.model, plan.target, vllm_stack())


def vllm_decisions(doc, kernel: str = "chosen") -> dict[int, Decision]:
    """What vLLM alone decides for each MoE layer of a policy document (a validated ``PolicyDoc``):
    the ``vllm`` pack replayed on the stored facts, on the kernel the policy's launch builds
    (``chosen``: the export's comparison) or vLLM's own pick (``engine``: bench's vLLM arm). With
    :func:`vllm_plan` (a plan's model, before it is written) the one home of "what vLLM does", on one
    pack stack (:func:`moepolicy.rules.packs.vllm_stack`)."""
    return replayed_decisions(doc.layers, target_from_doc(doc.target), vllm_stack(), kernel)


def decided_plan(
    plan: Plan, timings: Sequence[OrderTiming] = (), experts: Optional[ExpertChoice] = None
) -> Plan:
    """``plan`` decided again with what a tune measured: the expert kernel and that kernel's order
    timings where the expert stage was measured, else DeepEP's order timings."""
    if experts is not None:
        plan, kernel_timings = with_expert_choice(plan, experts)
        timings = kernel_timings or timings
    return with_measurements(plan, timings)
