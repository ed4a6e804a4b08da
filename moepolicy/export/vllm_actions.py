"""What the plugin does for one MoE layer, decided from the policy's order and wire and what vLLM's
layer is (its quant config, its experts class), without vLLM objects: the plugin calls it with vLLM's
real experts, ``export --to vllm`` with the experts vLLM will run for the policy's expert kernel, and
both print the same lines (:func:`layer_lines`).

vLLM 0.33.0's DeepEP high-throughput path quantizes before dispatch only for block fp8
(deepep_ht.py:315), sends everything else as bf16 and re-quantizes on the receiver per tensor
(``per_act_token_quant=False``, deepep_ht.py:266-278); experts that quantize their own input
(``expects_unquantized_inputs``, modular_kernel.py:1287) get bf16 whatever the scheme. The plugin can
additionally send per-token fp8 with ``[T, 1]`` scales, send bare fp8 quantized with the static
per-tensor scale, send bf16 for a block layer and quantize on receive, and keep per-token precision
when quantizing on receive.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Mapping, Optional, Sequence

from moepolicy.names import Order, WireDtype
from moepolicy.text import index_ranges
from moepolicy.deepep.settings import source_words

# vLLM 0.33.0's experts class for each expert-kernel name of moepolicy/data/sheets/expert_kernels.yaml,
# as its oracles build them (oracle/fp8.py:148-268 backend_to_kernel_cls; nvfp4 for the NVFP4 ones)
KERNEL_EXPERTS = {
    "flashinfer_cutlass": "FlashInferExperts",
    "deepgemm": "TritonOrDeepGemmExperts",
    "triton": "TritonExperts",
    "cutlass": "TritonOrCutlassExperts",
    "marlin": "MarlinExperts",
    "flashinfer_trtllm": "TrtLlmFp8ExpertsModular",
    "flashinfer_cutedsl": "FlashInferCuteDSLExperts",
}
_NVFP4_EXPERTS = {"flashinfer_trtllm": "TrtLlmNvFp4ExpertsModular", "cutlass": "CutlassExpertsFp4"}

# vLLM 0.33's experts classes and the expert-kernel names they run
VLLM_EXPERTS = {
    "TritonExperts": ("triton",),
    "CutlassExpertsFp8": ("cutlass",),
    "DeepGemmExperts": ("deepgemm",),
    "BatchedDeepGemmExperts": ("deepgemm",),
    "TritonOrDeepGemmExperts": ("deepgemm", "triton"),
    "TritonOrCutlassExperts": ("cutlass", "triton"),
    "CutlassExpertsFp4": ("cutlass",),
    "MarlinExperts": ("marlin",),
    "FlashInferExperts": ("flashinfer_cutlass",),
    "FlashInferCuteDSLExperts": ("flashinfer_cutedsl",),
    "TrtLlmFp8ExpertsModular": ("flashinfer_trtllm",),
    "TrtLlmNvFp4ExpertsModular": ("flashinfer_trtllm",),
}

# experts that read per-token [T, 1] activation scales (triton_moe.py TritonExperts; the per-token
# CUTLASS path refuses DeepEP HT, cutlass_moe.py:416-425); per-tensor readers use one scale
PER_TOKEN_EXPERTS = frozenset({"TritonExperts", "TritonOrCutlassExperts", "CutlassExpertsFp8"})

# experts whose expects_unquantized_inputs is true for block fp8 (flashinfer_cutlass_moe.py:123-125)
BLOCK_DEFERRING_EXPERTS = frozenset({"FlashInferExperts"})

# what the plugin does (the hot path's branches)
VLLM = "vllm"  # vLLM's own prepare: its order and wire
# per-token fp8 + [T, 1] scales before dispatch; no re-quantization on receive
TOKEN_FIRST = "token_first"
# bare fp8 with the static per-tensor scale before dispatch; none on receive
TENSOR_FIRST = "tensor_first"
BF16_THEN_QUANT = "bf16_then_quant"  # bf16 on the wire, the receiver quantizes as the experts read


@dataclass(frozen=True)
class LayerQuant:
    """The facts of vLLM's layer that matter here (from its ``FusedMoEQuantConfig`` and experts)."""

    fp8: bool  # quant_dtype is fp8 e4m3
    block: bool  # is_block_quantized
    per_token: bool  # per_act_token_quant (dynamic per-token activations)
    experts: str  # the experts class vLLM chose
    defer_input_quant: bool = False  # the experts quantize their own input
    policy_kernel: str = ""  # the expert kernel the policy was made for ("" = not checked)
    static: bool = False  # a static per-tensor input scale (a1_scale)
    deepep_v2: bool = False  # vLLM's deepep_v2 path (ElasticBuffer)


@dataclass(frozen=True)
class Action:
    """``kind``: the plugin's branch; ``applied``: whether the policy's decision holds for the layer
    (with ``kind == VLLM`` it does when the decision is what vLLM does anyway); ``why``: one line."""

    kind: str
    why: str
    applied: bool = True


def _left(reason: str) -> Action:
    return Action(VLLM, f"left to vLLM: {reason}", applied=False)


def action_for(
    order: str, wire_dtype: str, scale_granularity: Optional[str], layer: LayerQuant
) -> Action:
    """The plugin's action for a layer whose policy decision is ``order`` with that wire."""
    mismatch = kernel_mismatch(layer.policy_kernel, layer.experts)
    if mismatch:
        return _left(mismatch)
    bf16 = wire_dtype == WireDtype.BF16 and order in (Order.DISPATCH_THEN_QUANT, Order.NO_QUANT)
    if layer.defer_input_quant:
        if not bf16:
            return _left(
                f"{layer.experts} quantize their own input (bf16 in); the policy sends {wire_dtype}"
            )
        return Action(
            VLLM, f"bf16 on the wire; {layer.experts} quantize it themselves, as in vLLM"
        )
    if not layer.fp8:
        if not bf16:
            return _left(
                f"the plugin sends bf16 or fp8 only; vLLM's layer is not fp8 and the policy sends {wire_dtype}"
            )
        return Action(VLLM, "bf16 on the wire, as in vLLM")
    if order == Order.QUANT_THEN_DISPATCH and wire_dtype == WireDtype.FP8_E4M3:
        return _quantized_first(scale_granularity, layer)
    if bf16:
        if layer.block:
            return Action(
                BF16_THEN_QUANT,
                "bf16 on the wire, quantized to block fp8 on receive "
                "(vLLM: block fp8 before dispatch)",
            )
        if layer.per_token:
            return Action(
                BF16_THEN_QUANT,
                "bf16 on the wire, quantized per token on receive "
                "(vLLM: one per-tensor scale on receive)",
            )
        return Action(VLLM, "bf16 on the wire, quantized after dispatch, as in vLLM")
    return _left(
        f"order {order} with a {wire_dtype} wire is not one the plugin applies on DeepEP high-throughput"
    )


def _quantized_first(scale_granularity: Optional[str], layer: LayerQuant) -> Action:
    if layer.deepep_v2 and scale_granularity != "block":
        return _left(
            "DeepEP v2: the plugin sends no fp8 of its own there (vLLM sizes the buffer for bf16 rows "
            "when the layer is not block fp8; scale room for other wires is unverified)"
        )
    if scale_granularity == "block":
        if layer.block:
            return Action(VLLM, "block fp8 quantized before dispatch, as in vLLM")
        return _left("the policy's block wire does not match vLLM's non-block layer")
    if layer.block:
        return _left("the policy's wire does not match vLLM's block fp8 layer")
    if scale_granularity == "token":
        if not layer.per_token:
            return _left(
                "the policy sends per-token scales but vLLM's layer is not per-token dynamic"
            )
        if layer.experts not in PER_TOKEN_EXPERTS:
            return _left(f"{layer.experts} do not read per-token [T,1] scales")
        return Action(
            TOKEN_FIRST,
            f"per-token fp8 with [T,1] scales before dispatch, read as sent by "
            f"{layer.experts} (vLLM: bf16, then one per-tensor scale)",
        )
    if scale_granularity is None:
        if not layer.static:
            return _left(
                "bare fp8 needs the checkpoint's static per-tensor scale; vLLM's layer has none"
            )
        return Action(
            TENSOR_FIRST,
            "fp8 with the static per-tensor scale before dispatch, no scales on the wire "
            "(vLLM: bf16, then the same quantization after)",
        )
    return _left("per-sender per-tensor scales would reach per-tensor experts as one rank's scale")


def kernel_mismatch(policy_kernel: str, experts: str) -> str:
    """Why vLLM's experts are not the kernel the policy decided for ("" when they are, or unchecked)."""
    if not policy_kernel or policy_kernel.startswith("auto") or policy_kernel == "none":
        return ""
    runs = VLLM_EXPERTS.get(experts)
    if runs is None:
        return f"vLLM's experts {experts} are not a kernel this plugin knows; the policy was made for {policy_kernel}"
    if policy_kernel not in runs:
        return f"the policy was made for {policy_kernel} experts; vLLM runs {experts}"
    return ""


def experts_for(kernel: str, weights_dtype: str) -> str:
    """The experts class vLLM 0.33 builds for an expert-kernel name and the layer's weights."""
    if weights_dtype == "nvfp4" and kernel in _NVFP4_EXPERTS:
        return _NVFP4_EXPERTS[kernel]
    return KERNEL_EXPERTS.get(kernel, kernel)


def layer_quant_from_facts(facts: Mapping[str, object]) -> LayerQuant:
    """What vLLM's layer is, from a policy layer's recorded facts (the export's view: the experts
    vLLM will run for the expert kernel the layer was decided for)."""
    kernel = str(facts.get("kernel.name") or "")
    experts = experts_for(kernel, str(facts.get("ckpt.weight_dtype")))
    fp8_acts = facts.get("ckpt.act_dtype") == "fp8_e4m3"
    block = (
        fp8_acts
        and facts.get("ckpt.act_granularity") == "group"
        and facts.get("ckpt.act_group") == 128
    )
    defer = block and experts in BLOCK_DEFERRING_EXPERTS
    weight_only = facts.get("kernel.act_dtype") == "bf16" and not defer
    dynamic = facts.get("ckpt.act_dynamic")
    return LayerQuant(
        fp8=fp8_acts and not weight_only,
        block=block,
        per_token=facts.get("ckpt.act_granularity") == "token" and dynamic == "dynamic",
        experts=experts,
        defer_input_quant=defer,
        policy_kernel=kernel,
        static=facts.get("ckpt.act_granularity") == "tensor" and dynamic == "static",
    )


@dataclass(frozen=True)
class BucketAction:
    """A layer's action for token counts up to ``max_tokens`` (None: every larger count)."""

    max_tokens: Optional[int]
    action: Action


def describe(actions: Sequence[BucketAction]) -> str:
    """One layer's action(s) as text: one line, or one part per token bucket where they differ."""
    if len({a.action for a in actions}) == 1:
        return actions[0].action.why
    parts = [
        f"{'>' + str(actions[i - 1].max_tokens) if a.max_tokens is None else '<=' + str(a.max_tokens)} "
        f"tokens: {a.action.why}"
        for i, a in enumerate(actions)
    ]
    return "per token bucket: " + "; ".join(parts)


def layer_lines(
    per_layer: Mapping[int, Sequence[BucketAction]], mtp: Collection[int] = ()
) -> tuple[list[str], list[str]]:
    """(applied, left to vLLM): ``layers 0-47: <what>``, one line per distinct action, in layer order;
    the MTP layers (``mtp``) on lines of their own, since vLLM builds them only with MTP speculation."""
    groups: dict[tuple[bool, bool, str], list[int]] = {}
    for index in sorted(per_layer):
        actions = per_layer[index]
        applied = all(a.action.applied for a in actions)
        groups.setdefault((index in mtp, applied, describe(actions)), []).append(index)

    def line(is_mtp: bool, idx: list[int], what: str) -> str:
        if is_mtp:
            return f"MTP layers {index_ranges(idx)} (built by vLLM only with --speculative-config): {what}"
        return f"layers {index_ranges(idx)}: {what}"

    applied_lines = [line(m, idx, what) for (m, ok, what), idx in groups.items() if ok]
    left_lines = [line(m, idx, what) for (m, ok, what), idx in groups.items() if not ok]
    return applied_lines, left_lines


def configs_line(source: str, num_buckets: int, kept: Sequence[Optional[str]] = ()) -> str:
    """What the DeepEP dispatch/combine configs are, from the policy's provenance (never "tuned" when
    nothing was measured); ``kept`` names what each bucket's tune kept (``engine``: vLLM's own)."""
    what = source_words(source)
    if source in ("measured", "modelled") and kept and set(kept) == {"engine"}:
        return (
            f"DeepEP dispatch/combine configs: DeepEP's defaults, as vLLM runs them (the {source} tune kept "
            f"them at all {num_buckets} token bucket(s): it found nothing better)"
        )
    return (
        f"DeepEP dispatch/combine configs of {num_buckets} token bucket(s), {what}, chosen per dispatch by "
        "the token count every rank agrees on"
    )


def summary_line(
    bound: Mapping[str, bool],
    per_layer: Mapping[int, Sequence[BucketAction]],
    unmatched: Mapping[str, str],
) -> str:
    """``N/M MoE layers applied; K left to vLLM: reasons`` (bound: vLLM layer prefix -> applied, for
    the layers matched to the policy; unmatched: prefix -> why it is left to vLLM)."""
    applied = sum(bound.values())
    total = len(bound) + len(unmatched)
    reasons = sorted(
        {
            describe(a).removeprefix("left to vLLM: ")
            for a in per_layer.values()
            if not all(b.action.applied for b in a)
        }
        | set(unmatched.values())
    )
    left = total - applied
    return f"{applied}/{total} MoE layers applied; {left} left to vLLM" + (
        f": {'; '.join(reasons)}" if left else ""
    )
