"""What ``moepolicy bench`` compares: the policy, vLLM's choices, and DeepEP's defaults, as *arms*.

An arm says, for each kind of MoE layer in the model (layers with the same order and wire), which
order and wire it runs, with which SM count and chunk configs per token bucket. The ``vllm`` arm is
the ``vllm`` rule pack replayed on the layers' stored facts, 20 SMs and DeepEP's built-in table (what
vLLM 0.33 runs); ``deepep-default`` keeps the policy's decisions with DeepEP's default SM count and
table; ``policy`` is the document as written. Torch-free: only the measurement needs torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from moepolicy.deepep.configs import ChunkConfig, default_configs, default_num_sms
from moepolicy.deepep.engines import VLLM_HT_NUM_SMS
from moepolicy.deepep.settings import Bucket, DeepEPSettings

ARM_NAMES = ("policy", "vllm", "deepep-default")


@dataclass(frozen=True)
class LayerKind:
    """MoE layers an arm runs alike: the order, the wire and what the experts consume."""

    order: str
    wire: tuple[tuple[str, Any], ...]  # the wire as sorted (key, value) pairs, scale flattened
    consumes: tuple[
        tuple[str, Any], ...
    ]  # the experts' input format (a quantized wire of either arm)
    layers: tuple[int, ...]

    @property
    def count(self) -> int:
        return len(self.layers)


@dataclass(frozen=True)
class Arm:
    name: str
    label: str
    kinds: tuple[LayerKind, ...]
    deepep: DeepEPSettings  # the SM count and per-bucket configs the arm runs DeepEP with

    @property
    def num_sms(self) -> int:
        return self.deepep.num_sms


def _flat(wire: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    out = {"dtype": wire.get("dtype")}
    for key, value in (wire.get("scale") or {}).items():
        out[f"scale.{key}"] = value
    return tuple(sorted(out.items()))


def _kinds(
    decisions: dict[int, tuple[str, dict]], consumes: dict[int, dict]
) -> tuple[LayerKind, ...]:
    groups: dict[tuple, list[int]] = {}
    for index, (order, wire) in sorted(decisions.items()):
        groups.setdefault((order, _flat(wire), _flat(consumes[index])), []).append(index)
    return tuple(
        LayerKind(order, wire, eats, tuple(layers))
        for (order, wire, eats), layers in groups.items()
    )


def _vllm_decisions(doc) -> dict[int, tuple[str, dict]]:
    """The ``vllm`` pack's decision for each MoE layer as vLLM runs without moepolicy (its own kernel)."""
    from moepolicy.planner import vllm_decisions

    decided = vllm_decisions(doc, kernel="engine")
    return {index: (d.order, d.wire.as_dict()) for index, d in decided.items()}


def build_arms(doc) -> tuple[Arm, ...]:
    """The three arms for a policy document (a validated ``PolicyDoc``)."""
    from moepolicy.target import target_from_doc

    target = target_from_doc(doc.target)
    # a fused layer's communication is the expert kernel's own (DeepGEMM Mega MoE): nothing here times it
    moe = [layer for layer in doc.layers if layer.kind == "moe" and layer.order != "fused"]
    policy = {
        layer.index: (layer.order, layer.wire.model_dump(exclude_none=True)) for layer in moe
    }
    vllm = {i: d for i, d in _vllm_decisions(doc).items() if i in policy}
    # the experts consume one format per layer: whichever arm quantizes says which
    consumes = {
        i: (policy[i][1] if policy[i][1].get("dtype") != "bf16" else vllm[i][1]) for i in policy
    }
    d, c = default_configs(target.deepep, target.ep_size)

    def settings(num_sms: int, buckets: tuple[Bucket, ...], source: str) -> DeepEPSettings:
        return DeepEPSettings(
            num_sms, doc.deepep.num_nvl_bytes, doc.deepep.num_rdma_bytes, buckets, source
        )

    table = (Bucket(None, d, c),)
    written = tuple(
        Bucket(
            b.max_tokens, ChunkConfig(*b.dispatch.as_tuple()), ChunkConfig(*b.combine.as_tuple())
        )
        for b in doc.deepep.buckets
    )
    sms = default_num_sms(target.deepep)
    return (
        Arm(
            "policy",
            f"the policy ({doc.deepep.num_sms} SMs, its configs)",
            _kinds(policy, consumes),
            settings(doc.deepep.num_sms, written, doc.deepep.provenance.source),
        ),
        Arm(
            "vllm",
            f"vLLM's choices ({VLLM_HT_NUM_SMS} SMs, DeepEP's table, the vllm pack's orders)",
            _kinds(vllm, consumes),
            settings(VLLM_HT_NUM_SMS, table, "default"),
        ),
        Arm(
            "deepep-default",
            f"the policy's orders with DeepEP's defaults ({sms} SMs, its table)",
            _kinds(policy, consumes),
            settings(sms, table, "default"),
        ),
    )
