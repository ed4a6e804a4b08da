"""Can DeepEP serve this model on this target at all, and is a given wire format feasible?

Runs before the rules. Where DeepEP would refuse (a host assert) or trap (a device assert, which
kills the CUDA context), the plan is ``infeasible`` with the reason. The safe fallback (bf16 on the
wire, bf16 combine) must itself be feasible, since the runtime falls back to it.
Limits come from the DeepEP capability sheet (``moepolicy/data/sheets/deepep/*.yaml``).
"""

from __future__ import annotations

from typing import Any, Optional

from moepolicy.names import QUANTIZED_ORDERS
from moepolicy.rules.grammar import Then
from moepolicy.schema.capability import DeepEPLimits
from moepolicy.schema.facts import ModelFacts
from moepolicy.target import Target


def _pad16(n: int) -> int:
    return (n + 15) // 16 * 16


def ht_row_problem(
    limits: DeepEPLimits,
    layout: str,
    hidden: int,
    elem_bytes: float,
    num_scales: int,
    top_k: int,
    label: str,
) -> Optional[str]:
    """Why a row of ``hidden`` elements of ``elem_bytes`` (0.5 for NVFP4) cannot go through HT
    dispatch, or None."""
    row = int(hidden * elem_bytes)
    if row % limits.ht_row_bytes_multiple:
        return (
            f"{label} rows of hidden {hidden} are {row} bytes; DeepEP needs a multiple of "
            f"{limits.ht_row_bytes_multiple} (deep_ep.cpp:510-511)"
        )
    if limits.ht_requires_hidden_multiple_128 and hidden % 128:
        return f"this DeepEP build needs hidden % 128 == 0 on the normal path; hidden is {hidden}"
    if layout == "intranode":
        if row % limits.ht_intranode_row_bytes_multiple:
            return (
                f"{label} rows of hidden {hidden} are {row} bytes; intranode dispatch needs a "
                f"multiple of {limits.ht_intranode_row_bytes_multiple} (intranode.cu:280-293)"
            )
        if (
            limits.ht_intranode_tma_bytes is not None
            and row // 2 + 8 > limits.ht_intranode_tma_bytes
        ):
            cap = int((limits.ht_intranode_tma_bytes - 8) * 2 // elem_bytes)
            return (
                f"{label} intranode dispatch traps above hidden {cap - cap % 16} (TMA staging "
                f"buffer, intranode.cu:290); hidden is {hidden}"
            )
        return None
    record = _pad16(row + 4 * num_scales + 8 + 4 * top_k + 4 * top_k)
    if limits.ht_internode_tma_bytes is not None and record + 8 > limits.ht_internode_tma_bytes:
        return (
            f"{label} internode dispatch record of {record} bytes exceeds the "
            f"{limits.ht_internode_tma_bytes}-byte TMA buffer (internode.cu:566-574)"
        )
    return None


def model_problems(facts: ModelFacts, target: Target) -> list[str]:
    """Every reason the target cannot serve the model at all (empty when it can)."""
    limits = target.deepep.limits
    problems: list[str] = []
    if not facts.moe_layers:
        problems.append(
            f"{facts.name} has no MoE layers: expert parallelism has nothing to dispatch (serve it "
            "without --enable-expert-parallel; no policy is needed)"
        )
    ep, layout = target.ep_size, target.layout
    if target.backend == "deepep_ht":
        if layout == "intranode" and ep not in limits.intranode_ranks:
            problems.append(
                f"DeepEP intranode kernels run on {limits.intranode_ranks} ranks; EP size is {ep}"
            )
        if layout == "internode":
            if target.gpus_per_node != limits.gpus_per_node:
                problems.append(
                    f"DeepEP internode kernels assume {limits.gpus_per_node} GPUs per node; "
                    f"gpus_per_node is {target.gpus_per_node}"
                )
            elif (
                ep % limits.gpus_per_node
                or ep // limits.gpus_per_node not in limits.internode_rdma_ranks
            ):
                ok = [n * limits.gpus_per_node for n in limits.internode_rdma_ranks]
                problems.append(f"DeepEP internode kernels run on {ok} ranks; EP size is {ep}")
        if ep > limits.max_ranks:
            problems.append(
                f"DeepEP's Buffer takes at most {limits.max_ranks} ranks; EP size is {ep}"
            )
    elif ep < 2:
        problems.append(f"expert parallelism needs at least 2 ranks; EP size is {ep}")
    for layer in _distinct_moe_shapes(facts):
        problems += layer_problems(layer.hidden_size, layer.num_experts, layer.top_k, target)
    return list(dict.fromkeys(problems))


def _distinct_moe_shapes(facts: ModelFacts):
    seen, out = set(), []
    for layer in facts.moe_layers:
        key = (layer.hidden_size, layer.num_experts, layer.top_k)
        if key not in seen:
            seen.add(key)
            out.append(layer)
    return out


def layer_problems(hidden: int, experts: int, top_k: int, target: Target) -> list[str]:
    limits, ep = target.deepep.limits, target.ep_size
    problems = []
    if experts % ep:
        problems.append(f"{experts} experts do not divide over EP size {ep} (deep_ep.cpp:521)")
    else:
        local = experts // ep
        if local > limits.max_local_experts:
            problems.append(
                f"{local} local experts per rank; DeepEP allows {limits.max_local_experts}"
            )
        if (
            target.backend == "deepep_ht"
            and target.layout == "intranode"
            and local > limits.intranode_max_local_experts
        ):
            problems.append(
                f"{local} local experts per rank; intranode notify allows "
                f"{limits.intranode_max_local_experts} (intranode.cu:153-154)"
            )
    if target.backend == "deepep_ht":
        if top_k > limits.ht_max_topk:
            problems.append(f"top-k {top_k} exceeds the normal kernels' {limits.ht_max_topk}")
        bf16 = ht_row_problem(limits, target.layout, hidden, 2, 0, top_k, "bf16")
        if bf16:
            problems.append(bf16 + "; bf16 is the safe fallback and combine is bf16 only")
        if target.layout == "internode" and (hidden * 2 // 16) % 32:
            problems.append(
                f"internode combine needs bf16 hidden % 256 == 0 (internode.cu:1583); "
                f"hidden is {hidden}"
            )
    else:
        if limits.ll_hidden_sizes and hidden not in limits.ll_hidden_sizes:
            problems.append(
                f"low-latency kernels support hidden sizes {limits.ll_hidden_sizes}; "
                f"hidden is {hidden}"
            )
        elif hidden % limits.ll_hidden_multiple:
            problems.append(
                f"low-latency kernels need hidden % {limits.ll_hidden_multiple} == 0; hidden is {hidden}"
            )
        if top_k > limits.ll_max_topk:
            problems.append(
                f"low-latency kernels take top-k <= {limits.ll_max_topk}; top-k is {top_k}"
            )
    return problems


def wire_problem(then: Then, facts: dict[str, Any], target: Target) -> Optional[str]:
    """Why ``then`` cannot run for this layer on ``target`` (None when it can)."""
    if then.combine == "logfmt" and target.backend != "deepep_ll":
        return "a LogFMT combine exists only in DeepEP's low-latency combine (use_logfmt)"
    if then.order not in QUANTIZED_ORDERS:
        return None
    limits = target.deepep.limits
    if limits.needs_sm90_for_fp8 and target.arch == "sm80":
        return (
            "DeepEP's fp8 path needs an SM90 build; an sm80 build has none (DISABLE_SM90_FEATURES)"
        )
    hidden, top_k = facts["layer.hidden_size"], facts["layer.top_k"]
    if then.order == "in_kernel_quant":
        if target.backend != "deepep_ll":
            return "in-kernel quantization exists only in DeepEP's low-latency kernels"
        if hidden % limits.ll_fp8_hidden_multiple:
            return (
                f"low-latency fp8 dispatch needs hidden % {limits.ll_fp8_hidden_multiple} == 0 "
                f"(deep_ep.cpp:1602); hidden is {hidden}"
            )
        return None
    if target.backend != "deepep_ht":
        return _ll_prequantized_problem(then, hidden, target)
    packing = packing_problem(then, hidden)
    if packing:
        return packing
    elem_bytes = 0.5 if then.wire.dtype == "nvfp4" else 1
    label = "nvfp4" if then.wire.dtype == "nvfp4" else "fp8"
    return ht_row_problem(
        limits, target.layout, hidden, elem_bytes, scale_columns(then, hidden), top_k, label
    )


def _ll_prequantized_problem(then: Then, hidden: int, target: Target) -> Optional[str]:
    """Why low-latency dispatch cannot carry this sender-quantized payload, or None."""
    limits = target.deepep.limits
    if then.wire.scale is None:
        # a bare fp8 row travels as bf16 of half the hidden (TensorRT-LLM's FP8 QDQ); the rule's
        # requires names the capability, this checks the viewed row against the kernels' hidden sizes
        viewed = hidden // 2
        if limits.ll_hidden_sizes and viewed not in limits.ll_hidden_sizes:
            return (
                f"a bare fp8 row of hidden {hidden} travels as bf16 of hidden {viewed}; low-latency kernels "
                f"support hidden sizes {limits.ll_hidden_sizes}"
            )
        if viewed % limits.ll_hidden_multiple:
            return (
                f"a bare fp8 row of hidden {hidden} travels as bf16 of hidden {viewed}; low-latency dispatch "
                f"needs a multiple of {limits.ll_hidden_multiple} (deep_ep.cpp:1551)"
            )
        return None
    entry = target.deepep.capability("ll.dispatch.prequantized", target.layout)
    if entry is None or not entry.supported:
        return (
            f"low-latency dispatch of {target.deepep.name} takes bf16 only; it cannot carry a pre-quantized "
            "payload with scales"
        )
    if hidden % limits.ll_fp8_hidden_multiple:
        return f"low-latency fp8 dispatch needs hidden % {limits.ll_fp8_hidden_multiple} == 0; hidden is {hidden}"
    return packing_problem(then, hidden)


# 1-byte scales DeepEP carries four to a 4-byte pack: UE8M0 (packed UE8M0x4) and NVFP4's E4M3 (viewed as float32)
_BYTE_SCALES = ("ue8m0", "e4m3")


def scale_columns(then: Then, hidden: int) -> int:
    """How many 4-byte scale columns a row of ``hidden`` carries (1-byte scales four to a column)."""
    scale = then.wire.scale
    if scale is None:
        return 0
    if scale.granularity != "block":
        return 1
    groups = -(-hidden // (scale.group or 128))
    return -(-groups // 4) if scale.dtype in _BYTE_SCALES else groups


def packing_problem(then: Then, hidden: int) -> Optional[str]:
    """Why 1-byte scales of small blocks cannot be packed four to a column for this hidden, or None."""
    scale = then.wire.scale
    if scale is None or scale.granularity != "block" or scale.dtype not in _BYTE_SCALES:
        return None
    group = scale.group or 128
    if group < 128 and -(-hidden // group) % 4:
        # vllm 0.33.0 prepare_finalize/deepep_v2.py _pack_mxfp8_scale; TensorRT-LLM views NVFP4's scales as float32
        return (
            f"{scale.dtype} scales of 1x{group} blocks travel four to a 4-byte pack, so hidden must be a "
            f"multiple of {4 * group}; hidden is {hidden}"
        )
    return None
