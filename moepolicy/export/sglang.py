"""SGLang's ``--deepep-config`` JSON.

SGLang's loader (sgl-project/sglang python/sglang/srt/layers/moe/token_dispatcher/deepep.py @
003a81bf, ``DeepEPConfig.__init__``) reads ``normal_dispatch`` and ``normal_combine``, builds
``deep_ep.Config(**section)`` from each, asserts both ``num_sms`` are equal, and uses that
``num_sms`` as ``num_qps_per_rank`` in normal mode. Only normal (high-throughput) mode is
configurable; buffers are sized by SGLang from these configs.
"""

from __future__ import annotations

from typing import Any, Optional

from moepolicy.deepep.settings import source_words
from moepolicy.names import Order, WireDtype
from moepolicy.errors import PolicyError
from moepolicy.document.model import PolicyDoc
from moepolicy.export.served import served_model

CONFIG_KWARGS = (
    "num_sms",
    "num_max_nvl_chunked_send_tokens",
    "num_max_nvl_chunked_recv_tokens",
    "num_max_rdma_chunked_send_tokens",
    "num_max_rdma_chunked_recv_tokens",
)


def _bucket(doc: PolicyDoc, tokens: Optional[int]):
    buckets = doc.deepep.buckets
    if tokens is None:
        return buckets[-1]
    for bucket in buckets:
        if bucket.max_tokens is None or tokens <= bucket.max_tokens:
            return bucket
    return buckets[-1]


def export(doc: PolicyDoc, tokens: Optional[int] = None) -> dict[str, Any]:
    """The JSON object; SGLang takes one config, so one bucket is chosen (the largest by default,
    since SGLang uses normal mode for prefill)."""
    if doc.target.backend != "deepep_ht":
        raise PolicyError(
            "SGLang's --deepep-config configures normal (high-throughput) mode only; "
            f"this policy is for {doc.target.backend}"
        )
    if doc.target.deep_ep.api != "legacy":
        raise PolicyError(
            "SGLang's --deepep-config builds deep_ep.Config (the legacy API); this "
            f"policy targets DeepEP {doc.target.deep_ep.api}"
        )
    bucket = _bucket(doc, tokens)
    num_sms = doc.deepep.num_sms
    return {
        "normal_dispatch": {
            "num_sms": num_sms,
            **bucket.dispatch.model_dump(include=set(CONFIG_KWARGS)),
        },
        "normal_combine": {
            "num_sms": num_sms,
            **bucket.combine.model_dump(include=set(CONFIG_KWARGS)),
        },
    }


# SGLang 0.5.23's server flags for DeepEP (its server_args and tests), and its one dispatcher dtype
SGLANG_CHECKED = "0.5.23"


def launch(doc: PolicyDoc, tokens: Optional[int] = None) -> dict[str, Any]:
    """``python -m sglang.launch_server`` arguments that carry what SGLang can take of the policy:
    the model the plan read (its folder, or its id and ``--revision``: ``export.served``),
    ``--moe-a2a-backend``, ``--deepep-mode normal``, one bucket's ``--deepep-config``, and
    ``--deepep-dispatcher-output-dtype`` where every MoE layer agrees; notes name the rest."""
    import json

    target, ep = doc.target, doc.target.ep_size
    served = served_model(doc)
    args = [
        "--model-path",
        served.model,
        *served.revision_args(),
        "--tp",
        str(ep),
        "--dp",
        str(ep),
        "--enable-dp-attention",
        "--ep-size",
        str(ep),
    ]
    notes: list[str] = []
    env: dict[str, str] = {}
    node_args = _nodes(ep, target.gpus_per_node)
    layout = []
    if node_args and ep % target.gpus_per_node:
        nodes = node_count(ep, target.gpus_per_node)
        layout.append(
            f"EP {ep} is not a multiple of the policy's {target.gpus_per_node} GPUs per node and SGLang runs "
            f"as many ranks on every node: {nodes} nodes of {ep // nodes} GPUs"
        )
    if target.deep_ep.api == "v2":
        args += ["--moe-a2a-backend", "deepep_v2", "--deepep-v2-mode", "direct"]
        v2 = doc.deepep.v2
        # 0: DeepEP's analytical count
        env["SGLANG_DEEPEP_V2_NUM_SMS"] = str(v2.num_sms if v2 else 0)
        if v2 and not (v2.prefer_overlap_with_compute and v2.allow_multiple_reduction):
            notes.append(
                "DeepEP v2's prefer_overlap_with_compute / allow_multiple_reduction: SGLang 0.5.23 has no "
                "setting for them, so they are not carried"
            )
    elif target.backend == "deepep_ll":
        args += ["--moe-a2a-backend", "deepep", "--deepep-mode", "low_latency"]
        notes.append(
            "low-latency mode has no --deepep-config section in SGLang; buffers are SGLang's"
        )
    else:
        config = export(doc, tokens)
        args += [
            "--moe-a2a-backend",
            "deepep",
            "--deepep-mode",
            "normal",
            "--deepep-config",
            json.dumps(config),
        ]

        chosen = _bucket(doc, tokens)
        others = [b.max_tokens for b in doc.deepep.buckets if b is not chosen]
        if others:
            bounds = ", ".join("the rest" if b is None else f"<= {b} tokens" for b in others)
            notes.append(
                f"SGLang takes one DeepEP config for every token count: the bucket "
                f"{'for ' + str(tokens) + ' tokens' if tokens else 'for the largest batches'} is carried, "
                f"not {bounds} (choose with --tokens)"
            )
    if any(layer.kind == "moe" and layer.combine.dtype != "bf16" for layer in doc.layers):
        notes.append(
            "a low-precision combine (the policy's layers' combine): SGLang 0.5.23 has no setting for it, so "
            "combine stays bf16"
        )
    dtype, why = _dispatcher_dtype(doc)
    if dtype:
        args += [
            "--deepep-v2-dispatcher-output-dtype"
            if target.deep_ep.api == "v2"
            else "--deepep-dispatcher-output-dtype",
            dtype,
        ]
    if why:
        notes.append(why)
    source = doc.deepep.provenance.source
    about = [f"the DeepEP settings: {source_words(source)}"]
    return {
        "args": args,
        "env": env,
        "notes": notes,
        "about": about + layout,
        "node_args": node_args,
    }


def node_count(ep: int, gpus_per_node: int) -> int:
    """How many nodes SGLang runs EP ``ep`` on: it gives every node ``tp / nnodes`` ranks, so the
    fewest nodes of at most ``gpus_per_node`` ranks each that divide EP evenly (EP 16 on 6-GPU nodes:
    4 nodes of 4, not 3 nodes, which SGLang would split 5-5-5 and leave a rank out)."""
    nodes = -(-ep // gpus_per_node)
    while ep % nodes:
        nodes += 1
    return nodes


def _nodes(ep: int, gpus_per_node: int) -> list[str]:
    """SGLang's multi-node flags where EP spans nodes (the same command on every node, each with its
    own NODE_RANK, 0 on the head node, and HEAD_ADDR the head node's address); none on one node."""
    if ep <= gpus_per_node:
        return []
    return [
        "--nnodes",
        str(node_count(ep, gpus_per_node)),
        "--node-rank",
        "$NODE_RANK",
        "--dist-init-addr",
        "$HEAD_ADDR:5000",
    ]


def _dispatcher_dtype(doc: PolicyDoc) -> tuple[Optional[str], str]:
    """SGLang's one global dispatcher dtype, where every MoE layer's decision maps onto it."""
    moe = [layer for layer in doc.layers if layer.kind == "moe"]
    wires = {
        (
            layer.order,
            layer.wire.dtype,
            layer.wire.scale.granularity if layer.wire.scale else None,
            layer.wire.scale.group if layer.wire.scale else None,
        )
        for layer in moe
    }
    if any(layer.orders for layer in moe):
        return (
            None,
            "per-token-bucket orders: SGLang has one dispatcher dtype for every batch, so they are not carried",
        )
    if len(wires) != 1:
        return None, (
            "the MoE layers differ in what they send; SGLang has one global dispatcher dtype, so it is left "
            "to SGLang (auto)"
        )
    order, dtype, granularity, group = next(iter(wires))
    if dtype == "bf16":
        return "bf16", ""
    if (
        order == Order.QUANT_THEN_DISPATCH
        and dtype == WireDtype.FP8_E4M3
        and granularity == "block"
        and group == 128
    ):
        return "fp8", ""
    if order == Order.QUANT_THEN_DISPATCH and dtype == WireDtype.NVFP4:
        # SGLang quantizes NVFP4 with the checkpoint's input global scale before dispatch
        return "nvfp4", ""
    if dtype != "fp8_e4m3":
        return (
            None,
            f"{order} with an {dtype} wire is not one of SGLang's dispatcher dtypes, so it is left to SGLang (auto)",
        )
    what = f"1x{group} block" if granularity == "block" else (granularity or "static per-tensor")
    return None, (
        f"{order} with a {what} fp8 wire: SGLang's fp8 normal dispatch quantizes per 128-group, so the "
        "dtype is left to SGLang (auto)"
    )
