"""vLLM launch arguments and environment matching a policy, where vLLM has a knob.

vLLM's DeepEP high-throughput path (research/serving-engines.md §2, vllm all2all.py @00143004):
``--all2all-backend``, ``VLLM_DEEPEP_BUFFER_SIZE_MB`` (default 1024; NVLink and, internode, RDMA
buffer), ``num_sms`` hard-coded to 20 (``set_num_sms`` can only lower it), DeepEP's built-in Config
table, ``VLLM_DBO_COMM_SMS`` (at most the manager's 20). Everything else is listed as not expressible;
a setting vLLM would reject is refused.
"""

from __future__ import annotations

import shlex
from typing import Any

from moepolicy.deepep.engines import VLLM_HT_NUM_SMS
from moepolicy.errors import PolicyError
from moepolicy.schema.policy import PolicyDoc
from moepolicy.text import index_ranges, printable

VLLM_DEFAULT_BUFFER_MB = 1024
VLLM_LL_HIDDEN_SIZES = (2048, 2560, 3072, 4096, 5120, 6144, 7168, 8192)
INT_MAX = 2**31 - 1
_MIB = 1024 * 1024


def _vllm_would_do(layer) -> tuple[str, str]:
    facts = layer.facts
    if layer.kind == "dense":
        return "none", ""
    if facts.get("layer.experts_ignored") or facts.get("kernel.act_dtype") == "bf16" \
            or facts.get("ckpt.act_dtype") == "none":
        return "no_quant", ""
    if facts.get("target.backend") == "deepep_ll":
        fp8_block = facts.get("ckpt.act_granularity") == "group" and facts.get("ckpt.act_group") == 128
        return ("in_kernel_quant" if fp8_block else "dispatch_then_quant"), ""
    if facts.get("ckpt.act_granularity") == "group":
        return "quant_then_dispatch", ""
    return "dispatch_then_quant", "vLLM sends bf16 and quantizes after dispatch"


def export(doc: PolicyDoc) -> dict[str, Any]:
    target = doc.target
    backend = {"deepep_ht": "deepep_high_throughput", "deepep_ll": "deepep_low_latency"}[target.backend]
    if target.deep_ep.api == "v2":
        backend = "deepep_v2"
    if target.backend == "deepep_ll" and doc.model.hidden_size not in VLLM_LL_HIDDEN_SIZES:
        raise PolicyError(f"vLLM's low-latency path asserts hidden in {list(VLLM_LL_HIDDEN_SIZES)}; "
                          f"this model's hidden is {doc.model.hidden_size}")
    need = max(doc.deepep.num_nvl_bytes, doc.deepep.num_rdma_bytes)
    buffer_mb = max(-(-need // _MIB), 1)
    if doc.deepep.num_rdma_bytes > 0 and buffer_mb * _MIB > INT_MAX and target.backend == "deepep_ht":
        raise PolicyError(f"the policy needs {buffer_mb} MiB of DeepEP buffer; vLLM uses "
                          f"VLLM_DEEPEP_BUFFER_SIZE_MB for the NVLink buffer too, which DeepEP caps at "
                          f"INT_MAX bytes when an RDMA buffer exists (deep_ep.cpp:156)")
    env = {"VLLM_DEEPEP_BUFFER_SIZE_MB": str(max(buffer_mb, 1))}
    args = ["--enable-expert-parallel", "--all2all-backend", backend]
    cannot: list[str] = []
    if target.backend == "deepep_ll":  # vLLM sizes the low-latency RDMA buffer itself
        env = {}
        ll = doc.deepep.low_latency or {}
        cannot.append(f"low-latency buffer for {ll.get('num_max_dispatch_tokens_per_rank', '?')} tokens per rank: "
                      "vLLM sizes it from its own max_num_tokens (get_low_latency_rdma_size_hint)")
    overlap = doc.deepep.overlap
    if overlap and target.backend == "deepep_ht":
        comm = int(overlap.get("comm_sms", doc.deepep.num_sms))
        if comm <= VLLM_HT_NUM_SMS:
            env["VLLM_DBO_COMM_SMS"] = str(comm)
            args.append("--enable-dbo")
        else:
            cannot.append(f"communication SMs {comm} for dual-batch overlap: VLLM_DBO_COMM_SMS takes at most "
                          f"vLLM's {VLLM_HT_NUM_SMS} DeepEP SMs, so it is not emitted")
    if target.backend == "deepep_ht" and not overlap:
        if doc.deepep.num_sms > VLLM_HT_NUM_SMS:
            cannot.append(f"num_sms {doc.deepep.num_sms}: vLLM fixes DeepEP at {VLLM_HT_NUM_SMS} SMs "
                          f"and can only lower it")
        elif doc.deepep.num_sms < VLLM_HT_NUM_SMS:
            env["VLLM_DBO_COMM_SMS"] = str(doc.deepep.num_sms)
            cannot.append(f"num_sms {doc.deepep.num_sms} outside dual-batch overlap: vLLM lowers "
                          "DeepEP's SMs only through VLLM_DBO_COMM_SMS with --enable-dbo")
    if target.backend == "deepep_ht" and doc.deepep.provenance.source != "default":
        cannot.append("tuned dispatch/combine chunk configs: vLLM uses DeepEP's built-in table")
    differ: dict[str, list[int]] = {}
    for layer in doc.layers:
        vllm_order, _ = _vllm_would_do(layer)
        if vllm_order != layer.order:
            differ.setdefault(f"{layer.order} ({layer.rule}); vLLM does {vllm_order}", []).append(layer.index)
    for what, idx in differ.items():
        cannot.append(f"layers {index_ranges(idx)}: {what}")
    return {"env": env, "args": args, "cannot_express": cannot}


def render_shell(result: dict[str, Any], model: str) -> str:
    """A shell script: every value quoted (a model name may hold spaces or shell syntax), notes as
    comments with their line breaks and control characters removed."""
    lines = [f"export {k}={shlex.quote(str(v))}" for k, v in result["env"].items()]
    lines.append(" ".join(["vllm", "serve", shlex.quote(model), *(shlex.quote(a) for a in result["args"])]))
    if result["cannot_express"]:
        lines.append("# vLLM cannot express:")
        lines += [f"#  - {_comment(item)}" for item in result["cannot_express"]]
    return "\n".join(lines) + "\n"


def _comment(text: str) -> str:
    return " ".join(printable(text).split())
