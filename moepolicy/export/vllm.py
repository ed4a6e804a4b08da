"""The vLLM launch for a policy: the moepolicy plugin, its environment, and ``vllm serve`` with the
EP layout the policy was made for; what still cannot be applied is listed with the reason.

With ``MOEPOLICY_POLICY`` set, the plugin (``moepolicy.integrations.vllm``, vLLM 0.33.x) applies on
DeepEP high-throughput: each MoE layer's order and wire (per token bucket), DeepEP's ``num_sms``
(also above vLLM's fixed 20), the policy's dispatch/combine configs per bucket (measured, modelled or
DeepEP's defaults, as its provenance says), and the buffer sizes.
What vLLM alone would do is the ``vllm`` rule pack replayed on the layers' facts (one copy of that
knowledge: ``plan --rules vllm`` and this export agree).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from moepolicy.deepep.engines import VLLM_HT_NUM_SMS
from moepolicy.errors import PolicyError
from moepolicy.schema.policy import PolicyDoc
from moepolicy.text import index_ranges, printable

# how the DeepEP configs came about, by the policy's provenance: only a live tune measured them
CONFIGS_WORDS = {
    "measured": "the dispatch/combine configs a live tune kept (measured; DeepEP's default chunks where no other "
                "was faster beyond noise)",
    "modelled": "the dispatch/combine configs of a modelled tune (DeepEP's default chunks; the SM count chosen with "
                "the model bench, not measured)",
    "extrapolated": "DeepEP's default dispatch/combine configs (outside the model bench's calibration: nothing tuned)",
}
VLLM_DEFAULT_BUFFER_MB = 1024
VLLM_LL_HIDDEN_SIZES = (2048, 2560, 3072, 4096, 5120, 6144, 7168, 8192)
INT_MAX = 2**31 - 1
PLUGIN_PACKAGE = "moepolicy[vllm]"
CHECKED_VLLM = "0.33.x"
_MIB = 1024 * 1024


def vllm_orders(doc: PolicyDoc) -> dict[int, str]:
    """What vLLM 0.33 alone does for each MoE layer: the ``vllm`` pack on the stored facts."""
    from moepolicy.planner import replayed_decisions
    from moepolicy.rules.packs import builtin_pack
    from moepolicy.target import target_from_doc

    decided = replayed_decisions(doc.layers, target_from_doc(doc.target),
                                 [builtin_pack("vllm"), builtin_pack("deepep")])
    return {index: d.order for index, d in decided.items()}


def export(doc: PolicyDoc, policy_path: str = "policy.yaml") -> dict[str, Any]:
    """``env``, ``args`` for ``vllm serve``, what the plugin applies, and what it cannot."""
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
    env = {"MOEPOLICY_POLICY": str(Path(policy_path).resolve()),
           "VLLM_DEEPEP_BUFFER_SIZE_MB": str(buffer_mb)}  # vLLM's own buffer where the plugin does not apply
    args = ["--enable-expert-parallel", "--all2all-backend", backend, "--data-parallel-size", str(target.ep_size),
            "--tensor-parallel-size", "1"]
    applied: list[str] = []
    cannot: list[str] = []
    if target.backend == "deepep_ht" and target.deep_ep.api == "legacy":
        _high_throughput(doc, env, args, applied, cannot)
    elif target.deep_ep.api == "v2":
        env.pop("VLLM_DEEPEP_BUFFER_SIZE_MB")  # the v2 manager does not read it
        _v2(doc, env, cannot)
    else:
        env.pop("VLLM_DEEPEP_BUFFER_SIZE_MB")
        cannot.append("low-latency: the plugin applies nothing there (vLLM's own path: in-kernel fp8 and its buffer "
                      "sizing); the policy's decisions are information for it")
    low = sorted(layer.index for layer in doc.layers if layer.kind == "moe" and layer.combine.dtype != "bf16")
    if low:
        cannot.append(f"layers {index_ranges(low)}: a {doc.layers[low[0]].combine.dtype} combine: vLLM 0.33 has no setting "
                      "for it, so combine stays bf16")
    if target.ep_size > target.gpus_per_node:
        cannot.append(f"EP {target.ep_size} spans nodes: add vLLM's multi-node flags (--data-parallel-size-local, "
                      "--data-parallel-address) for your cluster")
    return {"package": PLUGIN_PACKAGE, "env": env, "args": args, "applied": applied, "cannot_express": cannot}


def _v2(doc: PolicyDoc, env: dict, cannot: list) -> None:
    """vLLM 0.33's DeepEP v2 settings are environment variables (envs.py); it never passes num_sms."""
    v2 = doc.deepep.v2
    if v2 is not None:
        env["VLLM_DEEPEP_V2_PREFER_OVERLAP"] = "1" if v2.prefer_overlap_with_compute else "0"
        env["VLLM_DEEPEP_V2_ALLOW_MULTIPLE_REDUCTION"] = "1" if v2.allow_multiple_reduction else "0"
        if v2.num_sms:
            cannot.append(f"DeepEP v2 num_sms {v2.num_sms}: vLLM 0.33 never passes num_sms to ElasticBuffer, so "
                          "DeepEP's analytical count is used (with prefer-overlap off, at least 64)")
    cannot.append("DeepEP v2: the plugin applies no per-layer order there (vLLM quantizes block fp8 and MXFP8 first, "
                  "the rest after dispatch); the policy's decisions are information for it")


def _high_throughput(doc: PolicyDoc, env: dict, args: list, applied: list, cannot: list) -> None:
    deepep = doc.deepep
    source = deepep.provenance.source
    applied.append(f"DeepEP num_sms {deepep.num_sms}" + (f" (vLLM alone fixes {VLLM_HT_NUM_SMS})"
                                                          if deepep.num_sms != VLLM_HT_NUM_SMS else "") + f", {source}")
    if source != "default":
        applied.append(f"{CONFIGS_WORDS.get(source, 'the dispatch/combine configs')} of {len(deepep.buckets)} token "
                       "bucket(s), chosen by the token count every rank agrees on (the max over DP ranks)")
    applied.append(f"DeepEP buffers: NVLink {deepep.num_nvl_bytes} bytes, RDMA {deepep.num_rdma_bytes} bytes")
    overlap = deepep.overlap
    if overlap:
        comm = int(overlap.get("comm_sms", deepep.num_sms))
        env["VLLM_DBO_COMM_SMS"] = str(comm)
        args.append("--enable-dbo")
        applied.append(f"dual-batch overlap with {comm} communication SMs (VLLM_DBO_COMM_SMS; above vLLM's "
                       f"{VLLM_HT_NUM_SMS} only with the plugin applied, which raises the manager's cap)")
    from moepolicy.export.vllm_actions import VLLM, plugin_reach

    vllm = vllm_orders(doc)
    applies: dict[str, list[int]] = {}
    leaves: dict[str, list[int]] = {}
    for layer in doc.layers:
        if layer.kind != "moe":
            continue
        scale = layer.wire.scale.granularity if layer.wire.scale else None
        reach = plugin_reach(layer.order, layer.wire.dtype, scale)
        if vllm.get(layer.index) not in (None, layer.order):
            what = f"{layer.order} ({layer.rule}); vLLM alone does {vllm[layer.index]}"
            (leaves if reach.kind == VLLM else applies).setdefault(
                what + (f": left to vLLM ({reach.why})" if reach.kind == VLLM else ""), []).append(layer.index)
        if layer.orders:
            applies.setdefault("per-token-bucket orders", []).append(layer.index)
    for what, idx in applies.items():
        applied.append(f"layers {index_ranges(idx)}: {what}")
    for what, idx in leaves.items():
        cannot.append(f"layers {index_ranges(idx)}: {what}")
    if any(layer.wire.scale is not None and layer.wire.scale.granularity == "token" for layer in doc.layers):
        cannot.append("per-token fp8 before dispatch is applied only where vLLM's experts read [T,1] scales "
                      "(TritonExperts, CutlassExpertsFp8) and the layer is per-token dynamic; other layers are "
                      "left to vLLM (the plugin says which, per layer)")
    cannot.append("the plugin's changed paths (per-token fp8 first, bf16 for block layers) are checked against "
                  "vLLM's real classes on CPU, not yet on GPUs")


def render_shell(result: dict[str, Any], model: str) -> str:
    """A shell script: every value quoted (a model name may hold spaces or shell syntax), notes as
    comments with their line breaks and control characters removed."""
    lines = []
    if result.get("package"):
        lines.append(f"# pip install {shlex.quote(result['package'])}   # the vLLM plugin (checked: vLLM {CHECKED_VLLM})")
    lines += [f"export {k}={shlex.quote(str(v))}" for k, v in result["env"].items()]
    lines.append(" ".join(["vllm", "serve", shlex.quote(model), *(shlex.quote(a) for a in result["args"])]))
    if result.get("applied"):
        lines.append("# the plugin applies:")
        lines += [f"#  - {_comment(item)}" for item in result["applied"]]
    if result["cannot_express"]:
        lines.append("# not applied:")
        lines += [f"#  - {_comment(item)}" for item in result["cannot_express"]]
    return "\n".join(lines) + "\n"


def _comment(text: str) -> str:
    return " ".join(printable(text).split())
