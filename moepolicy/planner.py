"""checkpoint facts + target (+ measured facts) → feasibility → per-layer decisions → policy document.

The document carries DeepEP's default configs (provenance ``default``) until ``tune`` replaces them.
Measured order timings (``tune`` on the live bench) enter as facts: the rules decide again with
``measured.faster_order``, per token bucket; a layer whose decision they change keeps the rules'
decision without them (``unmeasured``) for a runtime whose tuning key does not match.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from moepolicy._resources import sheets_sha256
from moepolicy.errors import InfeasibleError
from moepolicy.expert_kernel import (
    Deployment,
    Execution,
    default_kernel,
    engine_words,
    execution_for,
)
from moepolicy.feasibility import model_problems, wire_problem
from moepolicy.document.builder import assemble, section
from moepolicy.rules.engine import Decision, KernelChoice, choose_kernel, decide
from moepolicy.rules.grammar import RulePack
from moepolicy.rules.vocabulary import (
    UNMEASURED,
    kernel_choice_facts,
    layer_facts,
    with_kernel,
)
from moepolicy.deepep.buffers import ht_buffer_bytes, low_latency_bytes_hint
from moepolicy.deepep.configs import ChunkConfig, default_num_sms
from moepolicy.deepep.kept import KeptDeepEP, deepep_defaults
from moepolicy.document.deepep_section import deepep_section
from moepolicy.document.experts_section import experts_section
from moepolicy.document.model import DeepEPDoc, LayerDoc, ModelDoc, PackRefDoc, TargetDoc
from moepolicy.schema.facts import LayerFacts, ModelFacts
from moepolicy.schema.measured import ExpertChoice, OrderTiming, overall_faster
from moepolicy.target import Target

LL_MAX_TOKENS_DEFAULT = 128


@dataclass(frozen=True)
class LayerPlan:
    layer: LayerFacts
    facts: dict[str, Any]
    execution: Execution
    decision: Decision
    unmeasured: Optional[Decision] = (
        None  # the rules' decision without measured facts, where it differs
    )
    bucket_decisions: tuple[
        tuple[Optional[int], Decision], ...
    ] = ()  # per bucket, where they differ
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


def buffer_bytes(
    target: Target,
    hidden: int,
    num_experts: int,
    num_sms: int,
    configs: Sequence[ChunkConfig],
    ll_tokens: int = LL_MAX_TOKENS_DEFAULT,
) -> tuple[int, int]:
    """(num_nvl_bytes, num_rdma_bytes) for bf16 rows of ``hidden`` under the given configs."""
    if target.backend == "deepep_ll":
        return 0, low_latency_bytes_hint(ll_tokens, hidden, num_experts)
    return ht_buffer_bytes(num_sms, configs, hidden, target.ep_size)


def _shapes(plan: Plan) -> tuple[int, int]:
    """The largest MoE layer's hidden size and expert count: what DeepEP's buffers are sized for."""
    moe = plan.model.moe_layers
    return (
        max((layer.hidden_size for layer in moe), default=plan.model.hidden_size),
        max((layer.num_experts for layer in moe), default=0),
    )


def default_deepep(plan: Plan) -> KeptDeepEP:
    """DeepEP's built-in configs for the plan's target (what ``plan`` writes until ``tune``)."""
    target = plan.target
    hidden, experts = _shapes(plan)
    note = (
        f"DeepEP's built-in Config table for {target.ep_size} ranks and Buffer.num_sms "
        f"{default_num_sms(target.deepep)} ({target.deepep.name}); buffers sized with DeepEP's hint "
        f"formulas for bf16 rows of hidden {hidden}"
    )
    if target.deepep.api == "v2":
        note = (
            "DeepEP v2 sizes its own buffers; deepep.v2 holds its defaults (num_sms 0: its analytical "
            "count; ElasticBuffer's prefer_overlap_with_compute and allow_multiple_reduction, "
            "deep_ep/buffers/elastic.py:241-242 at dd758ca); the legacy fields are unused"
        )
    elif target.backend == "deepep_ll":
        note = (
            f"low-latency: RDMA buffer by DeepEP's low-latency size hint for {LL_MAX_TOKENS_DEFAULT} "
            f"tokens per rank and {experts} experts, hidden {hidden}; its kernels have no chunk settings"
        )
    return deepep_defaults(target.deepep, target.ep_size, note)


def _deepep_doc(plan: Plan, kept: KeptDeepEP) -> DeepEPDoc:
    """The ``deepep`` section: ``kept`` with buffers sized for the plan's shapes, a low-latency
    target's settings and the order timings the layers were decided with."""
    target = plan.target
    hidden, experts = _shapes(plan)
    configs = [c for b in kept.buckets for c in (b.dispatch, b.combine)]
    low_latency = None
    if target.backend == "deepep_ll":
        low_latency = {
            "num_max_dispatch_tokens_per_rank": LL_MAX_TOKENS_DEFAULT,
            "num_qps_per_rank": max(experts // target.ep_size, 1),
        }
    return deepep_section(
        kept,
        buffer_bytes(target, hidden, experts, kept.num_sms, configs),
        low_latency,
        plan.timings,
    )


def stored_facts(facts: dict[str, Any]) -> dict[str, Any]:
    """The facts written into the document: all but the layer index (the entry's own ``index``)."""
    return {k: v for k, v in facts.items() if k != "layer.index"}


def replay_facts(index: int, stored: dict[str, Any]) -> dict[str, Any]:
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


def vllm_decisions(doc, kernel: str = "chosen") -> dict[int, Decision]:
    """What vLLM alone decides for each MoE layer of a policy document (a validated ``PolicyDoc``):
    the ``vllm`` pack replayed on the stored facts, on the kernel the policy's launch builds
    (``chosen``: the export's comparison) or vLLM's own pick (``engine``: bench's vLLM arm). The one
    home of "what vLLM does" for a written policy (``plan`` compares on the facts it just read)."""
    from moepolicy.rules.packs import vllm_stack
    from moepolicy.target import target_from_doc

    return replayed_decisions(doc.layers, target_from_doc(doc.target), vllm_stack(), kernel)


def _decision_fields(d: Decision) -> dict[str, Any]:
    return {
        "order": d.order,
        "wire": d.wire.as_dict(),
        "numerics": d.numerics,
        "rule": d.rule,
        "reason": d.reason,
    }


def _layer_entry(lp: LayerPlan) -> LayerDoc:
    """A layer's entry with its facts (the YAML writer puts each distinct set once in a table)."""
    fields: dict[str, Any] = {
        "index": lp.layer.index,
        "kind": lp.layer.kind,
        **_decision_fields(lp.decision),
        "facts": stored_facts(lp.facts),
    }
    if lp.layer.kind == "moe":
        fields["combine"] = {"dtype": lp.decision.combine}
    if lp.bucket_decisions:
        fields["orders"] = [
            {"max_tokens": bound, "order": b.order, "wire": b.wire.as_dict(), "rule": b.rule}
            for bound, b in lp.bucket_decisions
        ]
    if lp.unmeasured is not None:
        fields["unmeasured"] = _decision_fields(lp.unmeasured)
    return section(LayerDoc, f"layers[{lp.layer.index}]", **fields)


def tuned_document(
    plan: Plan,
    deepep: KeptDeepEP,
    timings: Sequence[OrderTiming] = (),
    command: str = "",
    experts: Optional[ExpertChoice] = None,
) -> dict[str, Any]:
    """The composer: the plan, decided again with the timings a tune measured (the expert
    kernel's, where the expert stage was measured; else DeepEP's), and what it kept."""
    return build_document(decided_plan(plan, timings, experts), deepep, command)


def decided_plan(
    plan: Plan, timings: Sequence[OrderTiming] = (), experts: Optional[ExpertChoice] = None
) -> Plan:
    """``plan`` decided again with what a tune measured: the expert kernel and that kernel's order
    timings where the expert stage was measured, else DeepEP's order timings."""
    if experts is not None:
        plan, kernel_timings = with_expert_choice(plan, experts)
        timings = kernel_timings or timings
    return with_measurements(plan, timings)


def build_document(
    plan: Plan, deepep: Optional[KeptDeepEP] = None, command: str = ""
) -> dict[str, Any]:
    """The policy document: the plan's model, target, rules and layers, and ``deepep`` (DeepEP's
    defaults where None)."""
    facts, target = plan.model, plan.target
    first = facts.first_moe
    return assemble(
        model=section(
            ModelDoc,
            "model",
            name=facts.name,
            facts_sha256=facts.sha256(),
            hidden_size=facts.hidden_size,
            num_layers=facts.num_hidden_layers,
            num_experts=first.num_experts if first else 0,
            top_k=first.top_k if first else 0,
        ),
        target=section(
            TargetDoc,
            "target",
            gpu=target.gpu,
            arch=target.arch,
            sm_count=target.profile.sm_count,
            ep_size=target.ep_size,
            gpus_per_node=target.gpus_per_node,
            layout=target.layout,
            backend=target.backend,
            expert_kernel=plan.kernel_label,
            engine=target.engine,
            deep_ep={
                "api": target.deepep.api,
                "version": target.deepep.version,
                "evidence": target.deepep_evidence,
                "sheet": target.deepep.name,
            },
            options=sorted(target.options),
            static_scale=target.static_scale,
            sheets_sha256=sheets_sha256(target.deepep.name),
        ),
        packs=[
            section(PackRefDoc, f"rules.packs[{i}]", **pack.ref())
            for i, pack in enumerate(plan.packs)
        ],
        deepep=_deepep_doc(plan, deepep or default_deepep(plan)),
        layers=[_layer_entry(lp) for lp in plan.layers],
        command=command,
        experts=None if plan.experts is None else experts_section(plan.experts, plan.kernel_label),
    )
