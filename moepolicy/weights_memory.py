"""Whether a model's weights fit its target: the weight bytes per rank from the checkpoint's config,
against the GPU's memory from the GPU profile (moepolicy/data/sheets/gpus.yaml).

- **Routed experts** (split over the EP ranks): per MoE decoder layer, experts x 3 matrices (gate, up,
  down) of hidden x moe_intermediate_size, at the layer's weight width (fp8/int8 1 byte, int4 1/2, NVFP4
  1/2 + an e4m3 scale per 16, MXFP4 1/2 + a scale per 32, bf16 2; group and block scales added). MTP
  layers are left out: the engine loads them only for speculative decoding.
- **The rest** (on every rank, as with data-parallel attention): attention (from the head counts, MLA's
  ranks, or 4 x hidden^2 where the config does not say), dense MLPs, shared experts, routers, and the
  embeddings where ``vocab_size`` is known; linear weights at the experts' width (at least 1 byte),
  embeddings at 2. An estimate, and a lower bound where the config is trimmed.

A model that does not fit is said in one line (plan, tune, export); nothing is refused on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from moepolicy.checkpoint.fields import ConfigView
from moepolicy.checkpoint.source import RawCheckpoint
from moepolicy.schema.facts import LayerFacts, ModelFacts, TensorQuant

GIB = 1 << 30
_WIDTH = {
    "fp8_e4m3": 1.0,
    "fp8_e5m2": 1.0,
    "int8": 1.0,
    "int4": 0.5,
    "nvfp4": 0.5 + 1 / 16,
    "mxfp4": 0.5 + 1 / 32,
    "mxfp8": 1.0 + 1 / 32,
    "none": 2.0,
    "unknown": 1.0,
}
_SCALED_FORMATS = ("nvfp4", "mxfp4", "mxfp8")  # their scales are in the width above


def bytes_per_weight(weights: TensorQuant) -> float:
    """Bytes per weight element, scales included (``unknown`` counts as 1 byte: a lower bound)."""
    width = _WIDTH.get(weights.dtype, 1.0)
    if weights.dtype in _SCALED_FORMATS:
        return width
    if weights.granularity == "group" and weights.group:
        return width + 2 / weights.group  # a 16-bit scale per group
    if weights.granularity == "block" and weights.block:
        return width + 4 / (weights.block[0] * weights.block[1])  # a float32 scale per block
    return width


@dataclass(frozen=True)
class WeightBytes:
    """``experts``: every routed expert of every MoE decoder layer; ``other``: what every rank holds."""

    experts: int
    other: int

    def per_rank(self, ep_size: int) -> int:
        return math.ceil(self.experts / max(ep_size, 1)) + self.other


def _expert_bytes(layer: LayerFacts) -> float:
    params = layer.num_experts * 3 * layer.hidden_size * (layer.moe_intermediate_size or 0)
    return params * bytes_per_weight(layer.weights)


def _attention_params(view: ConfigView, hidden: int) -> int:
    heads = view.integer("num_attention_heads") or 0
    if not heads:
        return 4 * hidden * hidden
    kv_lora = view.integer("kv_lora_rank")
    if kv_lora:  # MLA (DeepSeek V2/V3, Kimi)
        nope, rope = (
            view.integer("qk_nope_head_dim") or 128,
            view.integer("qk_rope_head_dim") or 64,
        )
        v_dim, q_lora = view.integer("v_head_dim") or 128, view.integer("q_lora_rank")
        q = (
            hidden * q_lora + q_lora * heads * (nope + rope)
            if q_lora
            else hidden * heads * (nope + rope)
        )
        kv = hidden * (kv_lora + rope) + kv_lora * heads * (nope + v_dim)
        return q + kv + heads * v_dim * hidden
    head_dim = view.integer("head_dim") or hidden // heads
    kv_heads = view.integer("num_key_value_heads") or heads
    return 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim


def _other_params(view: ConfigView, facts: ModelFacts) -> int:
    hidden = facts.hidden_size
    attention = _attention_params(view, hidden)
    dense_inner = view.integer("intermediate_size_mlp", "intermediate_size") or 0
    total = 0
    for layer in facts.layers:
        if layer.is_mtp:
            continue
        total += attention
        if layer.kind == "dense":
            total += 3 * hidden * dense_inner
        else:
            shared = view.integer("shared_expert_intermediate_size") or (
                (layer.moe_intermediate_size or 0) * layer.num_shared_experts
            )
            total += 3 * hidden * shared + hidden * layer.num_experts
    return total


def weight_bytes(raw: RawCheckpoint, facts: ModelFacts) -> WeightBytes:
    moe = [layer for layer in facts.moe_layers if not layer.is_mtp]
    experts = sum(_expert_bytes(layer) for layer in moe)
    view = ConfigView(raw.config, raw.config_path)
    width = max(bytes_per_weight(moe[0].weights), 1.0) if moe else 2.0
    vocab = view.integer("vocab_size", maximum=100_000_000) or 0
    tied = view.raw("tie_word_embeddings") is True
    embeddings = vocab * facts.hidden_size * (1 if tied else 2) * 2
    return WeightBytes(
        experts=int(experts), other=int(_other_params(view, facts) * width + embeddings)
    )


def smallest_ep(weights: WeightBytes, memory_bytes: int, max_ep: int) -> Optional[int]:
    """The smallest power-of-two EP size (up to ``max_ep``) whose weights per rank fit; None if none."""
    ep = 1
    while ep <= max(max_ep, 1):
        if weights.per_rank(ep) <= memory_bytes:
            return ep
        ep *= 2
    return None


def fit_warning(
    weights: WeightBytes, *, model: str, gpu: str, memory_gib: int, ep_size: int, num_experts: int
) -> Optional[str]:
    """One line when the weights per rank exceed the GPU's memory; None when they fit."""
    memory = memory_gib * GIB
    experts = math.ceil(weights.experts / max(ep_size, 1))
    if weights.per_rank(ep_size) <= memory:
        return None
    need = smallest_ep(weights, memory, num_experts)
    fix = f"EP {need} or more is needed" if need else "no EP size fits it on this GPU"
    if experts > memory:
        what = (
            f"its routed experts alone are about {experts / GIB:.0f} GiB per GPU at EP {ep_size} "
            f"({weights.experts / GIB:.0f} GiB in all)"
        )
    else:
        what = (
            f"its weights are about {weights.per_rank(ep_size) / GIB:.0f} GiB per GPU at EP {ep_size} "
            f"({experts / GIB:.0f} GiB of routed experts and about {weights.other / GIB:.0f} GiB that every "
            "rank holds)"
        )
    return (
        f"{model} does not fit: {what}, more than the {memory_gib} GiB of one {gpu.upper()}; modelled "
        f"results and launch lines assume it fits: {fix}"
    )


def fit_warning_for(
    raw: RawCheckpoint, facts: ModelFacts, gpu: str, ep_size: int
) -> Optional[str]:
    """:func:`fit_warning` for a checkpoint on the GPU profile named ``gpu``."""
    from moepolicy.datasheets import gpu_profile

    moe = facts.first_moe
    if moe is None:
        return None
    return fit_warning(
        weight_bytes(raw, facts),
        model=facts.name,
        gpu=gpu,
        memory_gib=gpu_profile(gpu).memory_gib,
        ep_size=ep_size,
        num_experts=moe.num_experts,
    )


def fit_note(spec: str, gpu: str, ep_size: int, engine: str = "vllm") -> Optional[str]:
    """:func:`fit_warning_for` for a model argument, read without the network (a catalog name, a folder,
    or an id the Hugging Face cache holds); None when it fits or cannot be read here."""
    from moepolicy.checkpoint.reader import facts_from_raw
    from moepolicy.checkpoint.source import resolve
    from moepolicy.errors import CheckpointError

    try:
        raw = resolve(spec, hub=False)
        facts = facts_from_raw(raw, engine=engine)
    except CheckpointError:
        return None
    return fit_warning_for(raw, facts, gpu, ep_size)
