"""The composer: a :class:`~moepolicy.planner.Plan` (the planner's decisions) and the DeepEP settings
kept for it (DeepEP's defaults, or what a tune kept) become the policy document. The planner only
decides; here its decisions are mapped to the document's typed sections
(:mod:`moepolicy.document.model`), built by :func:`~moepolicy.document.builder.section`, the DeepEP
section by :mod:`.deepep_section`, the experts section by :mod:`.experts_section`, and assembled by
:func:`~moepolicy.document.builder.assemble`. The document carries DeepEP's default configs
(provenance ``default``) until ``tune`` replaces them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Sequence

from moepolicy._resources import sheets_sha256
from moepolicy.deepep.buffers import ht_buffer_bytes, low_latency_bytes_hint
from moepolicy.deepep.configs import ChunkConfig, default_num_sms
from moepolicy.deepep.kept import KeptDeepEP, deepep_defaults
from moepolicy.document.builder import assemble, section
from moepolicy.document.deepep_section import deepep_section
from moepolicy.document.experts_section import experts_section
from moepolicy.document.model import DeepEPDoc, LayerDoc, ModelDoc, PackRefDoc, TargetDoc

if TYPE_CHECKING:
    from moepolicy.planner import LayerPlan, Plan
    from moepolicy.rules.engine import Decision
    from moepolicy.target import Target

LL_MAX_TOKENS_DEFAULT = 128


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
