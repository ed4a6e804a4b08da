"""What the plugin does for one MoE layer: decided from the policy's order and wire and what vLLM's
layer is (its quant config, its experts), without vLLM objects, so that it is tested on its own.

vLLM 0.33's DeepEP high-throughput path quantizes before dispatch only for block fp8, sends
everything else as bf16 and re-quantizes on the receiver per tensor (``per_act_token_quant=False``,
deepep_ht.py ``_receiver``). The plugin can additionally send per-token fp8 with ``[T, 1]`` scales
(DeepEP carries them bit-exactly, measured), send bf16 for a block layer and quantize on receive,
and keep per-token precision when quantizing on receive.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

# experts that read per-token [T, 1] activation scales in vLLM 0.33 (triton_moe.py TritonExperts,
# fused_moe.py; cutlass_moe.py CutlassExpertsFp8); per-tensor experts read only row 0's scale
PER_TOKEN_EXPERTS = frozenset({"TritonExperts", "CutlassExpertsFp8"})

# vLLM 0.33's experts classes and the expert-kernel names of moepolicy/data/sheets/expert_kernels.yaml they run
VLLM_EXPERTS = {"TritonExperts": ("triton",), "CutlassExpertsFp8": ("cutlass",), "DeepGemmExperts": ("deepgemm",),
                "BatchedDeepGemmExperts": ("deepgemm",), "TritonOrDeepGemmExperts": ("deepgemm", "triton"),
                "MarlinExperts": ("marlin",), "FlashInferExperts": ("flashinfer_cutlass",),
                "FlashInferCuteDSLExperts": ("flashinfer_cutedsl",), "TrtLlmFp8ExpertsModular": ("flashinfer_trtllm",),
                "TrtLlmNvFp4ExpertsModular": ("flashinfer_trtllm",)}

VLLM = "vllm"  # leave the layer to vLLM
BLOCK_FIRST = "block_first"  # what vLLM does for block fp8
TOKEN_FIRST = "token_first"  # per-token fp8 + [T, 1] scales before dispatch; no re-quantization on receive
BF16_THEN_QUANT = "bf16_then_quant"  # bf16 on the wire, the receiver quantizes as the experts read


@dataclass(frozen=True)
class LayerQuant:
    """The facts of vLLM's layer that matter here (from its ``FusedMoEQuantConfig`` and experts)."""

    fp8: bool  # quant_dtype is fp8 e4m3
    block: bool  # is_block_quantized
    per_token: bool  # per_act_token_quant
    experts: str  # the experts class vLLM chose
    defer_input_quant: bool = False
    policy_kernel: str = ""  # the expert kernel the policy was made for ("" = not checked)


@dataclass(frozen=True)
class Action:
    kind: str
    why: str


def action_for(order: str, wire_dtype: str, scale_granularity: Optional[str], layer: LayerQuant) -> Action:
    """The plugin's action for a layer whose policy decision is ``order`` with that wire."""
    mismatch = kernel_mismatch(layer.policy_kernel, layer.experts)
    if mismatch:
        return Action(VLLM, mismatch)
    if layer.defer_input_quant:
        return Action(VLLM, "the experts quantize their own input (defer_input_quant): vLLM's path")
    if not layer.fp8:
        return Action(VLLM, "vLLM's layer is not fp8-quantized: its own path")
    if order == "quant_then_dispatch" and wire_dtype == "fp8_e4m3":
        if scale_granularity == "block":
            if layer.block:
                return Action(BLOCK_FIRST, "block fp8 quantized before dispatch, as vLLM does")
            return Action(VLLM, "the policy's block wire does not match vLLM's non-block layer")
        if scale_granularity == "token":
            if not layer.per_token or layer.block:
                return Action(VLLM, "the policy sends per-token scales but vLLM's layer is not per-token")
            if layer.experts not in PER_TOKEN_EXPERTS:
                return Action(VLLM, f"vLLM's experts {layer.experts} do not read per-token [T,1] scales")
            return Action(TOKEN_FIRST, "per-token fp8 with [T,1] scales quantized before dispatch")
        if scale_granularity is None:
            return Action(VLLM, "bare fp8 with the checkpoint's static scale is not one of the plugin's paths "
                                "(block or per-token scales)")
        return Action(VLLM, "per-sender per-tensor scales would reach per-tensor experts as row 0's scale")
    if order in ("dispatch_then_quant", "no_quant") and wire_dtype == "bf16":
        return Action(BF16_THEN_QUANT, "bf16 on the wire, quantized on the receiver as the experts read it")
    return Action(VLLM, f"order {order} is not one the plugin applies on DeepEP high-throughput")


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


def plugin_reach(order: str, wire_dtype: str, scale_granularity: Optional[str]) -> Action:
    """What the plugin can do for a policy layer at best (vLLM's layer matching it, experts that read
    per-token scales): the export's view, before vLLM's own layer is known."""
    best_case = LayerQuant(fp8=True, block=scale_granularity == "block", per_token=scale_granularity == "token",
                           experts=next(iter(sorted(PER_TOKEN_EXPERTS))))
    return action_for(order, wire_dtype, scale_granularity, best_case)
