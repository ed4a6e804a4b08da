"""The vLLM launch for a policy: the moepolicy plugin, its environment, and ``vllm serve`` with the
EP layout and the experts the policy was made for; what still cannot be applied is listed with the
reason.

With ``MOEPOLICY_POLICY`` set, the plugin (``moepolicy.integrations.vllm``, vLLM 0.33.x) applies on
DeepEP high-throughput: each MoE layer's order and wire (per token bucket), DeepEP's ``num_sms``
(also above vLLM's fixed 20), the policy's dispatch/combine configs per bucket, and the buffer
sizes; on DeepEP v2, its SM count and overlap setting and the orders v2 can carry. The per-layer
lines come from :mod:`moepolicy.export.vllm_actions`, the function the plugin itself uses, called
here with the experts class vLLM will run for the policy's expert kernel. What vLLM alone would do
is the ``vllm`` rule pack replayed on the layers' facts (one copy of that knowledge: ``plan --rules
vllm`` and this export agree).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any, Optional

from moepolicy.deepep.engines import VLLM_HT_NUM_SMS
from moepolicy.deepep.settings import source_words
from moepolicy.errors import PolicyError
from moepolicy.export import vllm_actions as actions
from moepolicy.names import CHECKED_VLLM_RELEASES
from moepolicy.export.served import served_model
from moepolicy.document.model import PolicyDoc
from moepolicy.text import index_ranges, printable

VLLM_LL_HIDDEN_SIZES = (2048, 2560, 3072, 4096, 5120, 6144, 7168, 8192)
INT_MAX = 2**31 - 1
PLUGIN_PACKAGE = "moepolicy"
CHECKED_VLLM = " or ".join(f"{r}.x" for r in CHECKED_VLLM_RELEASES)
_MIB = 1024 * 1024


@dataclass(frozen=True)
class Knob:
    """How a launch makes vLLM build one expert kernel (a ``--moe-backend`` or an environment variable)."""

    args: tuple[str, ...] = ()
    env: dict = field(default_factory=dict)

    def text(self) -> str:
        return " ".join([*(f"{k}={v}" for k, v in self.env.items()), *self.args])


# --moe-backend values (vllm 0.33.0 config/kernel.py:122-147 MoEBackend; oracle/fp8.py:271-289). DeepGEMM by
# VLLM_USE_DEEP_GEMM=1, which only the fp8 oracle reads (oracle/fp8.py:484-496): --moe-backend deep_gemm is also
# asked of unquantized MoE layers (an unquantized MTP draft), whose oracle refuses it (oracle/unquantized.py:180-194).
KNOBS = {
    "flashinfer_cutlass": Knob(args=("--moe-backend", "flashinfer_cutlass")),
    "deepgemm": Knob(env={"VLLM_USE_DEEP_GEMM": "1"}),
    "triton": Knob(args=("--moe-backend", "triton")),
    "flashinfer_trtllm": Knob(args=("--moe-backend", "flashinfer_trtllm")),
    "marlin": Knob(args=("--moe-backend", "marlin")),
}


def vllm_orders(doc: PolicyDoc) -> dict[int, str]:
    """What vLLM alone does for each MoE layer: the ``vllm`` pack on the stored facts."""
    # the planner: only to say what vLLM alone decides
    from moepolicy.planner import vllm_decisions

    return {index: d.order for index, d in vllm_decisions(doc, kernel="chosen").items()}


def export(doc: PolicyDoc, policy_path: str = "policy.yaml") -> dict[str, Any]:
    """``env``, ``args`` for ``vllm serve``, the model to serve, what the plugin applies, and what it
    cannot. ``policy_path`` is where the policy lies on the serving nodes (``MOEPOLICY_POLICY``)."""
    target = doc.target
    backend = {"deepep_ht": "deepep_high_throughput", "deepep_ll": "deepep_low_latency"}[
        target.backend
    ]
    if target.deep_ep.api == "v2":
        backend = "deepep_v2"
    if target.backend == "deepep_ll" and doc.model.hidden_size not in VLLM_LL_HIDDEN_SIZES:
        raise PolicyError(
            f"vLLM's low-latency path asserts hidden in {list(VLLM_LL_HIDDEN_SIZES)}; "
            f"this model's hidden is {doc.model.hidden_size}"
        )
    env = {"MOEPOLICY_POLICY": policy_path}
    args = [
        "--enable-expert-parallel",
        "--all2all-backend",
        backend,
        "--data-parallel-size",
        str(target.ep_size),
        "--tensor-parallel-size",
        "1",
    ]
    applied: list[str] = []
    cannot: list[str] = []
    notes: list[str] = []
    served = served_model(doc)
    notes.append(served.note)
    args += served.revision_args()
    _experts_knob(doc, env, args, notes)
    if target.backend == "deepep_ht" and target.deep_ep.api == "legacy":
        # vLLM's own buffer where the plugin does not apply
        env["VLLM_DEEPEP_BUFFER_SIZE_MB"] = str(_buffer_mb(doc))
        _high_throughput(doc, env, args, applied, cannot)
    elif target.deep_ep.api == "v2":
        _v2(doc, env, applied, cannot)
    else:
        cannot.append(
            "low-latency: the plugin applies nothing there (vLLM's own path: in-kernel fp8 and its buffer "
            "sizing); the policy's decisions are information for it"
        )
    low = sorted(
        layer.index
        for layer in doc.layers
        if layer.kind == "moe" and layer.combine.dtype != "bf16"
    )
    if low:
        cannot.append(
            f"layers {index_ranges(low)}: a {doc.layers[low[0]].combine.dtype} combine: vLLM 0.33 has no setting "
            "for it, so combine stays bf16"
        )
    nodes = _nodes(target.ep_size, target.gpus_per_node)
    if nodes:
        notes.append(
            f"EP {target.ep_size} spans {nodes['nodes']} nodes: the policy file at this path and moepolicy "
            "installed on every node (all ranks agree at start-up, or all keep vLLM's behaviour)"
        )
    return {
        "package": PLUGIN_PACKAGE,
        "model": served.model,
        "env": env,
        "args": args,
        "notes": notes,
        "applied": applied,
        "cannot_express": cannot,
        "nodes": nodes,
    }


DP_RPC_PORT = "13345"  # vLLM's data-parallel RPC port on the head node (any free port; the same on every node)


def _nodes(ep: int, gpus_per_node: int) -> dict[str, Any]:
    """vLLM's data-parallel flags where EP spans nodes: the head node serves the API and ranks
    0..gpus_per_node-1; each other node runs headless from its first rank, with as many local ranks
    as it holds (the last node fewer where EP is not a multiple of the GPUs per node: ``last``).
    Shell variables (HEAD_ADDR, NODE_RANK) are left for the shell on each node. None on one node."""
    if ep <= gpus_per_node:
        return {}
    nodes = -(-ep // gpus_per_node)

    def flags(local: int) -> list[str]:
        return [
            "--data-parallel-size-local",
            str(local),
            "--data-parallel-address",
            "$HEAD_ADDR",
            "--data-parallel-rpc-port",
            DP_RPC_PORT,
        ]

    headless = ["--data-parallel-start-rank", f"$((NODE_RANK * {gpus_per_node}))", "--headless"]
    last = ep - (nodes - 1) * gpus_per_node
    return {
        "nodes": nodes,
        "head": flags(gpus_per_node),
        "other": [*flags(gpus_per_node), *headless],
        **({"last": [*flags(last), *headless]} if last != gpus_per_node else {}),
    }


def _buffer_mb(doc: PolicyDoc) -> int:
    need = max(doc.deepep.num_nvl_bytes, doc.deepep.num_rdma_bytes)
    buffer_mb = max(-(-need // _MIB), 1)
    if doc.deepep.num_rdma_bytes > 0 and buffer_mb * _MIB > INT_MAX:
        raise PolicyError(
            f"the policy needs {buffer_mb} MiB of DeepEP buffer; vLLM uses "
            f"VLLM_DEEPEP_BUFFER_SIZE_MB for the NVLink buffer too, which DeepEP caps at "
            f"INT_MAX bytes when an RDMA buffer exists (deep_ep.cpp:156)"
        )
    return buffer_mb


def _moe_kernels(doc: PolicyDoc) -> set[str]:
    return {
        str((layer.facts or {}).get("kernel.name") or doc.target.expert_kernel)
        for layer in doc.layers
        if layer.kind == "moe" and (layer.facts or {}).get("ckpt.weight_dtype") == "fp8_e4m3"
    }


def _experts_knob(doc: PolicyDoc, env: dict, args: list, notes: list) -> None:
    """The ``--moe-backend`` (or environment variable) that makes vLLM build the experts the policy
    was made for, where vLLM's choice of experts changes what may travel quantized (fp8 MoE layers),
    and what vLLM picks without it."""
    kernels = _moe_kernels(doc)
    if len(kernels) != 1:
        if kernels:
            notes.append(
                f"the fp8 MoE layers were decided for several expert kernels ({', '.join(sorted(kernels))}): "
                "one launch cannot pin them; vLLM picks its own per layer"
            )
        return
    kernel = next(iter(kernels))
    knob = KNOBS.get(kernel)
    if knob is None:
        return
    env.update(knob.env)
    args.extend(knob.args)
    notes.append(
        f"{knob.text()}: builds {actions.experts_for(kernel, 'fp8_e4m3')}, the experts the policy was made "
        f"for; without it: {_without_knob(doc, kernel)}"
    )


# what vLLM's pick needs installed, and what it falls to without it (oracle/fp8.py:88-104 priority order)
_NEEDS = {
    "flashinfer_cutlass": ("FlashInfer", "TritonOrDeepGemmExperts"),
    "flashinfer_trtllm": ("FlashInfer", "TritonOrDeepGemmExperts"),
    "deepgemm": ("DeepGEMM", "TritonExperts"),
}


def _without_knob(doc: PolicyDoc, kernel: str) -> str:
    """What vLLM's own pick (the sheet's default for this deployment) does to the plan's fp8 layers."""
    # the kernel sheets (YAML, Pydantic): only for the expert-kernel line
    from moepolicy.expert_kernel import Deployment, default_kernel

    target = doc.target
    where = Deployment(target.engine, target.backend, target.deep_ep.api)
    moe = [
        layer
        for layer in doc.layers
        if layer.kind == "moe" and (layer.facts or {}).get("ckpt.weight_dtype") == "fp8_e4m3"
    ]
    picks = {default_kernel(_facts_view(layer.facts), target.arch, where) for layer in moe}
    experts = actions.experts_for(kernel, "fp8_e4m3")
    if picks == {kernel}:
        if kernel not in _NEEDS:
            return f"vLLM picks the same experts here ({experts})"
        package, fallback = _NEEDS[kernel]
        return (
            f"vLLM picks the same experts here ({experts}) where {package} is installed; without {package} it "
            f"runs {fallback}, and the plugin leaves these layers to vLLM"
        )
    other = sorted(picks)[0]
    theirs = actions.experts_for(other, "fp8_e4m3")
    return (
        f"vLLM runs {theirs} ({other}), and the plugin leaves these layers to vLLM "
        f"({actions.kernel_mismatch(kernel, theirs)})"
    )


def _facts_view(facts: Optional[dict]):
    """A layer's recorded facts as the LayerFacts the expert sheet's defaults match."""
    # Pydantic: only for the expert-kernel line
    from moepolicy.schema.facts import LayerFacts, TensorQuant

    f = facts or {}
    weights = TensorQuant(
        dtype=f.get("ckpt.weight_dtype") or "none",
        granularity=f.get("ckpt.weight_granularity") or "none",
    )
    acts = TensorQuant(
        dtype=f.get("ckpt.act_dtype") or "none",
        granularity=f.get("ckpt.act_granularity") or "none",
        dynamic=f.get("ckpt.act_dynamic") or "none",
    )
    return LayerFacts(
        index=0,
        kind="moe",
        hidden_size=int(f.get("layer.hidden_size") or 1),
        weights=weights,
        activations=acts,
    )


def _v2(doc: PolicyDoc, env: dict, applied: list, cannot: list) -> None:
    """vLLM 0.33's DeepEP v2 settings: environment variables (envs.py VLLM_DEEPEP_V2_*); the plugin passes
    the policy's num_sms to each dispatch (vLLM never does: deepep_v2.py:220-229) and the orders v2 can carry."""
    v2 = doc.deepep.v2
    if v2 is not None:
        env["VLLM_DEEPEP_V2_PREFER_OVERLAP"] = "1" if v2.prefer_overlap_with_compute else "0"
        env["VLLM_DEEPEP_V2_ALLOW_MULTIPLE_REDUCTION"] = (
            "1" if v2.allow_multiple_reduction else "0"
        )
        applied.append(
            f"DeepEP v2 num_sms {v2.num_sms} on every dispatch (vLLM alone passes none: DeepEP's analytical "
            "count)"
            if v2.num_sms
            else "DeepEP v2's own analytical SM count, as in vLLM"
        )
        applied.append(
            f"DeepEP v2 prefer_overlap_with_compute={v2.prefer_overlap_with_compute}, "
            f"allow_multiple_reduction={v2.allow_multiple_reduction} (also set by the plugin on the buffer)"
        )
    applied_lines, left_lines = actions.layer_lines(
        policy_actions(doc, deepep_v2=True), mtp_indices(doc)
    )
    applied.extend(applied_lines)
    cannot.extend(left_lines)


def mtp_indices(doc: PolicyDoc) -> frozenset[int]:
    """The policy's MTP layers (vLLM builds them only with MTP speculation)."""
    return frozenset(x.index for x in doc.layers if (x.facts or {}).get("layer.is_mtp"))


def policy_actions(
    doc: PolicyDoc, deepep_v2: bool = False
) -> dict[int, list[actions.BucketAction]]:
    """Each MoE layer's action(s), per token bucket, with the experts vLLM runs for its kernel."""
    out: dict[int, list[actions.BucketAction]] = {}
    for layer in doc.layers:
        if layer.kind != "moe":
            continue
        quant = actions.layer_quant_from_facts(layer.facts or {})
        if deepep_v2:
            quant = actions.LayerQuant(**{**quant.__dict__, "deepep_v2": True})
        decisions = [(o.max_tokens, o.order, o.wire) for o in (layer.orders or ())] or [
            (None, layer.order, layer.wire)
        ]
        out[layer.index] = [
            actions.BucketAction(
                bound,
                actions.action_for(
                    order, wire.dtype, wire.scale.granularity if wire.scale else None, quant
                ),
            )
            for bound, order, wire in decisions
        ]
    return out


def _high_throughput(doc: PolicyDoc, env: dict, args: list, applied: list, cannot: list) -> None:
    deepep = doc.deepep
    source = deepep.provenance.source
    applied.append(
        f"DeepEP num_sms {deepep.num_sms}"
        + (
            f" (vLLM alone fixes {VLLM_HT_NUM_SMS}; this count: {source_words(source)})"
            if deepep.num_sms != VLLM_HT_NUM_SMS
            else ""
        )
    )
    kept = [b.kept_name() for b in deepep.buckets]
    applied.append(actions.configs_line(deepep.provenance.source, len(deepep.buckets), kept))
    applied.append(
        f"DeepEP buffers: NVLink {deepep.num_nvl_bytes} bytes, RDMA {deepep.num_rdma_bytes} bytes"
    )
    overlap = deepep.overlap
    if overlap is not None:
        comm = overlap.comm_sms
        if not 0 < comm <= deepep.num_sms:
            raise PolicyError(
                f"deepep.overlap.comm_sms must be a whole number of SMs from 1 to num_sms "
                f"({deepep.num_sms}), got {comm!r}: edited or damaged; run the overlap tune again"
            )
        env["VLLM_DBO_COMM_SMS"] = str(comm)
        args.append("--enable-dbo")
        applied.append(
            f"dual-batch overlap with {comm} communication SMs (VLLM_DBO_COMM_SMS; above vLLM's "
            f"{VLLM_HT_NUM_SMS} only with the plugin applied, which raises the manager's cap)"
        )
    applied_lines, left_lines = actions.layer_lines(policy_actions(doc), mtp_indices(doc))
    applied.extend(applied_lines)
    cannot.extend(left_lines)
    cannot.append(
        "the plugin's changed paths (per-token and static per-tensor fp8 first, bf16 for block layers) are "
        "checked against vLLM's real classes on CPU, not yet on GPUs"
    )


def render_shell(result: dict[str, Any], model: str) -> str:
    """A shell script: every value quoted (a model name may hold spaces or shell syntax), notes as
    comments with their line breaks and control characters removed. ``result["model"]``, where the
    export found what serves the policy, wins over ``model``."""
    served = result.get("model") or model
    lines = []
    if result.get("package"):
        lines.append(
            f"# install {result['package']} into the Python environment vLLM runs in, from its checkout (it is "
            f"not on a package index): <vllm's python> -m pip install /path/to/{result['package']} (it "
            f"neither installs nor replaces vLLM or torch; the plugin checks vLLM {CHECKED_VLLM}), the same "
            "on every node"
        )
    lines += [f"export {k}={shlex.quote(str(v))}" for k, v in result["env"].items()]
    lines += [f"# {_comment(note)}" for note in result.get("notes", ())]
    serve = " ".join(
        ["vllm", "serve", shlex.quote(served), *(shlex.quote(a) for a in result["args"])]
    )
    nodes = result.get("nodes")
    if nodes:  # their flags hold shell variables, not quoted
        lines.append("# on the head node (HEAD_ADDR: its address, as the other nodes reach it):")
        lines.append(" ".join([serve, *nodes["head"]]))
        count, last = nodes["nodes"], nodes.get("last")
        middle = count - 1 - (last is not None)  # nodes 1.. with a full node's ranks
        if middle:
            lines.append(f"# on each other node, NODE_RANK=1..{middle}:")
            lines.append(" ".join([serve, *nodes["other"]]))
        if last is not None:
            local = last[last.index("--data-parallel-size-local") + 1]
            lines.append(f"# on the last node, NODE_RANK={count - 1} ({local} of its GPUs):")
            lines.append(" ".join([serve, *last]))
    else:
        lines.append(serve)
    if result.get("applied"):
        lines.append("# the plugin applies:")
        lines += [f"#  - {_comment(item)}" for item in result["applied"]]
    if result["cannot_express"]:
        lines.append("# not applied:")
        lines += [f"#  - {_comment(item)}" for item in result["cannot_express"]]
    return "\n".join(lines) + "\n"


def _comment(text: str) -> str:
    return " ".join(printable(text).split())
