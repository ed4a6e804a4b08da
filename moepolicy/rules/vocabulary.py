"""The facts rules may name: a closed, typed vocabulary.

Each fact has a type (``int``, ``bool``, ``enum`` with its values, ``str``, ``set``) and a one-line
meaning. :func:`layer_facts` computes the values for one layer and target; rule packs are checked
against this table when they load, and ``explain`` replays rules over the values stored in a policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from moepolicy.expert_kernel import Execution, mode_for
from moepolicy.names import UNMEASURED
from moepolicy.schema.facts import LayerFacts

DTYPES = ("fp8_e4m3", "fp8_e5m2", "int8", "int4", "nvfp4", "mxfp4", "mxfp8", "none", "unknown")
GRANULARITIES = ("block", "group", "token", "tensor", "channel", "none", "unknown")


@dataclass(frozen=True)
class FactType:
    kind: str  # int | bool | enum | str | set
    values: tuple[str, ...] = ()
    doc: str = ""


VOCABULARY: dict[str, FactType] = {
    "layer.index": FactType("int", doc="decoder layer index as in the checkpoint"),
    "layer.kind": FactType("enum", ("moe", "dense"), "MoE or dense layer"),
    "layer.is_mtp": FactType("bool", doc="multi-token-prediction layer past num_hidden_layers"),
    "layer.hidden_size": FactType("int", doc="hidden size (row length dispatched)"),
    "layer.num_experts": FactType("int", doc="routed experts"),
    "layer.top_k": FactType("int", doc="experts per token"),
    "layer.experts_ignored": FactType("bool", doc="the ignore list excludes this layer's experts"),
    "ckpt.quant_method": FactType(
        "str", doc="checkpoint format (fp8, compressed-tensors, modelopt, ...)"
    ),
    "ckpt.weight_dtype": FactType("enum", DTYPES, "expert weight dtype in the checkpoint"),
    "ckpt.weight_granularity": FactType("enum", GRANULARITIES, "expert weight scale granularity"),
    "ckpt.act_dtype": FactType("enum", DTYPES, "expert input activation dtype in the checkpoint"),
    "ckpt.act_granularity": FactType("enum", GRANULARITIES, "activation scale granularity"),
    "ckpt.act_group": FactType("int", doc="activation group length (0 when not grouped)"),
    "ckpt.act_dynamic": FactType(
        "enum",
        ("dynamic", "static", "none", "unknown"),
        "scale computed at run time or calibrated",
    ),
    "ckpt.act_scale_format": FactType(
        "enum", ("float32", "ue8m0", "e4m3", "e8m0", "none", "unknown"), "activation scale format"
    ),
    "ckpt.act_known": FactType("bool", doc="every activation fact is known (none is 'unknown')"),
    "target.gpu": FactType("str", doc="hardware profile name"),
    "target.arch": FactType("enum", ("sm80", "sm90", "sm100"), "GPU architecture"),
    "target.backend": FactType("enum", ("deepep_ht", "deepep_ll"), "DeepEP kernels"),
    "target.layout": FactType(
        "enum", ("intranode", "internode"), "EP within one NVLink domain or across nodes"
    ),
    "target.ep_size": FactType("int", doc="expert-parallel ranks"),
    "target.engine": FactType("enum", ("vllm", "sglang"), "serving engine conventions"),
    "target.deepep_api": FactType("enum", ("legacy", "v2"), "DeepEP API generation"),
    "target.static_scale": FactType(
        "enum",
        ("global-max", "per-expert"),
        "static input scale convention: one global max for all experts, or each expert's own",
    ),
    "target.options": FactType("set", doc="the opt-ins the target was given"),
    "kernel.name": FactType("str", doc="expert kernel consuming the dispatched tokens"),
    "kernel.default": FactType(
        "str", doc="the engine's own pick of expert kernel for this GPU, scheme and path"
    ),
    "kernel.asked": FactType("str", doc="the expert kernel asked for (--expert-kernel), or none"),
    "kernel.supported": FactType("bool", doc="the kernel runs this layer's scheme on this GPU"),
    "kernel.act_dtype": FactType(
        "enum",
        ("fp8_e4m3", "int8", "nvfp4", "mxfp8", "bf16", "unknown"),
        "activation dtype the kernel consumes",
    ),
    "kernel.act_granularities": FactType(
        "set", doc="activation scale granularities the kernel accepts"
    ),
    "kernel.act_group": FactType(
        "int", doc="activation group length the kernel wants (0 if none)"
    ),
    "kernel.scale_dtype": FactType(
        "enum",
        ("float32", "ue8m0", "e4m3", "e8m0", "none", "unknown"),
        "scale dtype the kernel wants",
    ),
    "kernel.scale_layout": FactType(
        "enum", ("row", "col_tma", "swizzled", "none", "unknown"), "scale layout the kernel wants"
    ),
    "kernel.evidence": FactType(
        "enum", ("measured", "code", "inferred", "none"), "how the kernel's mode is known"
    ),
    "kernel.fuses_communication": FactType(
        "bool", doc="the kernel does dispatch, GEMMs and combine in one (no DeepEP order)"
    ),
    "measured.faster_order": FactType(
        "enum",
        ("quant_then_dispatch", "dispatch_then_quant", "unmeasured"),
        "the order measured faster for this layer's wire on this target (tune, live)",
    ),
    "measured.faster_kernel": FactType(
        "str",
        doc="the expert kernel whose MoE step a tune measured faster beyond noise than the "
        "engine's pick (kernel.default), or unmeasured",
    ),
}


def kernel_choice_facts(
    layer: LayerFacts, default: str, asked: str | None, faster_kernel: str = UNMEASURED
) -> dict[str, Any]:
    """What an expert-kernel rule sees for one layer (the layer's index and kind, and the three
    kernel-choice facts)."""
    return {
        "layer.index": layer.index,
        "layer.kind": layer.kind,
        "kernel.default": default if layer.kind == "moe" else "none",
        "kernel.asked": asked or "none",
        "measured.faster_kernel": faster_kernel,
    }


def layer_facts(
    layer: LayerFacts,
    target: Any,
    execution: Execution,
    faster_order: str = UNMEASURED,
    choice: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The vocabulary's values for one layer on ``target`` (a :class:`~moepolicy.target.Target`);
    ``faster_order`` is a measured fact (``tune`` times both orders), else ``unmeasured``;
    ``choice`` the kernel-choice facts the layer's kernel was chosen from (``kernel_choice_facts``)."""
    moe = layer.kind == "moe"
    return {
        **_layer_part(layer, target),
        **kernel_part(execution.kernel if moe else "none", execution.mode),
        "kernel.default": (choice or {}).get(
            "kernel.default", execution.kernel if moe else "none"
        ),
        "kernel.asked": (choice or {}).get("kernel.asked", "none"),
        "measured.faster_order": faster_order,
        "measured.faster_kernel": (choice or {}).get("measured.faster_kernel", UNMEASURED),
    }


def kernel_part(name: str, mode: Any) -> dict[str, Any]:
    """The ``kernel.*`` facts of an expert kernel's mode (None: the kernel does not run the layer)."""
    acts = mode.activations if mode else None
    return {
        "kernel.name": name,
        "kernel.supported": mode is not None,
        "kernel.act_dtype": acts.dtype if acts else "unknown",
        "kernel.act_granularities": sorted(acts.granularity) if acts else [],
        "kernel.act_group": (acts.group or 0) if acts else 0,
        "kernel.scale_dtype": acts.scale_dtype if acts else "unknown",
        "kernel.scale_layout": acts.scale_layout if acts else "unknown",
        "kernel.evidence": mode.evidence if mode else "none",
        "kernel.fuses_communication": bool(mode and mode.fuses_communication),
    }


def with_kernel(facts: dict[str, Any], kernel: str) -> dict[str, Any]:
    """Stored facts of a MoE layer with another expert kernel's ``kernel.*`` facts (from the sheet, by
    the checkpoint facts they hold): what the rules see for the same layer on that kernel. A fact
    the stored set lacks reads as unknown, as the rules read it: no mode matches it."""

    def fact(name: str) -> str:
        return str(facts.get(name, "unknown"))

    mode = mode_for(
        kernel,
        fact("target.arch"),
        (fact("ckpt.weight_dtype"), fact("ckpt.weight_granularity")),
        (fact("ckpt.act_dtype"), fact("ckpt.act_granularity")),
    )
    return {**facts, **kernel_part(kernel, mode)}


def _layer_part(layer: LayerFacts, target: Any) -> dict[str, Any]:
    w, a = layer.weights, layer.activations
    return {
        "layer.index": layer.index,
        "layer.kind": layer.kind,
        "layer.is_mtp": layer.is_mtp,
        "layer.hidden_size": layer.hidden_size,
        "layer.num_experts": layer.num_experts,
        "layer.top_k": layer.top_k,
        "layer.experts_ignored": layer.experts_ignored is not None,
        "ckpt.quant_method": layer.quant_method,
        "ckpt.weight_dtype": w.dtype,
        "ckpt.weight_granularity": w.granularity,
        "ckpt.act_dtype": a.dtype,
        "ckpt.act_granularity": a.granularity,
        "ckpt.act_group": a.group or 0,
        "ckpt.act_dynamic": a.dynamic,
        "ckpt.act_scale_format": a.scale_format,
        "ckpt.act_known": a.is_known,
        "target.gpu": target.gpu,
        "target.arch": target.arch,
        "target.backend": target.backend,
        "target.layout": target.layout,
        "target.ep_size": target.ep_size,
        "target.engine": target.engine,
        "target.deepep_api": target.deepep.api,
        "target.static_scale": target.static_scale,
        "target.options": sorted(target.options),
    }
