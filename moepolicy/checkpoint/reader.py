"""Build :class:`ModelFacts` from a checkpoint: layer schedule + quantization + ignore list."""

from __future__ import annotations

from typing import Optional, TypedDict

from moepolicy.checkpoint.fields import ConfigView
from moepolicy.checkpoint.formats import QuantScheme, read_quant
from moepolicy.checkpoint.ignore import expert_modules, first_match
from moepolicy.checkpoint.layout import LayerSlot, layer_slots
from moepolicy.checkpoint.source import RawCheckpoint, resolve
from moepolicy.errors import CheckpointError
from moepolicy.schema.facts import NOT_QUANTIZED, LayerFacts, ModelFacts

_EXPERT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts")
_TOPK_KEYS = ("num_experts_per_tok", "experts_per_token", "moe_topk", "num_selected_experts")


class _Common(TypedDict):
    """What every MoE layer of a checkpoint shares."""

    hidden: int
    experts: int
    top_k: int
    intermediate: Optional[int]
    shared: int
    model_type: str
    architecture: str


def _shared_experts(view: ConfigView) -> int:
    shared = view.integer("n_shared_experts", "num_shared_experts")
    if shared is not None:
        return shared
    return 1 if (view.integer("shared_expert_intermediate_size") or 0) > 0 else 0


def _moe_layer(
    slot: LayerSlot,
    view: ConfigView,
    raw: RawCheckpoint,
    scheme: QuantScheme,
    engine: str,
    common: _Common,
) -> LayerFacts:
    modules = expert_modules(common["model_type"], common["architecture"], slot.index)
    weights, acts = scheme.for_modules(modules)
    ignored = first_match(scheme.ignore, modules, engine, scheme.method)
    if ignored is not None:
        weights, acts = NOT_QUANTIZED, NOT_QUANTIZED
    return LayerFacts(
        index=slot.index,
        kind="moe",
        is_mtp=slot.is_mtp,
        hidden_size=common["hidden"],
        num_experts=common["experts"],
        top_k=common["top_k"],
        moe_intermediate_size=common["intermediate"],
        num_shared_experts=common["shared"],
        quant_method=scheme.method if ignored is None else "none",
        weights=weights,
        activations=acts,
        experts_ignored=ignored,
    )


def facts_from_raw(raw: RawCheckpoint, engine: str = "vllm") -> ModelFacts:
    """Normalise a checkpoint's config files into per-layer facts for ``engine``'s conventions."""
    if engine not in ("vllm", "sglang"):
        raise CheckpointError(f"engine must be 'vllm' or 'sglang', got {engine!r}")
    view = ConfigView(raw.config, raw.config_path)
    hidden = view.integer("hidden_size", "d_model", "n_embd", required=True, minimum=1)
    experts = view.integer(*_EXPERT_KEYS) or 0
    top_k = view.integer(*_TOPK_KEYS) or 0
    if experts and not top_k:
        raise CheckpointError(
            f"{raw.config_path}: has {experts} experts but no top-k field "
            f"(looked for {', '.join(_TOPK_KEYS)})"
        )
    if experts and top_k > experts:
        raise CheckpointError(
            f"{raw.config_path}: top-k {top_k} is larger than the expert count {experts}"
        )
    config_qc = view.raw("quantization_config")
    scheme = read_quant(config_qc, raw.hf_quant_config, raw.config_path, raw.hf_quant_path)
    common: _Common = {
        "hidden": hidden,
        "experts": experts,
        "top_k": top_k,
        "intermediate": view.integer("moe_intermediate_size", "intermediate_size"),
        "shared": _shared_experts(view),
        "model_type": view.string("model_type"),
        "architecture": view.string("architectures"),
    }
    layers = []
    slots = layer_slots(view, has_experts=experts > 0)
    for slot in slots:
        if slot.is_moe:
            layers.append(_moe_layer(slot, view, raw, scheme, engine, common))
        else:
            layers.append(
                LayerFacts(index=slot.index, kind="dense", hidden_size=hidden, is_mtp=slot.is_mtp)
            )
    n = view.integer(
        "num_hidden_layers", "n_layers", "num_layers", required=True, minimum=1, maximum=10_000
    )
    notes = list(raw.notes) + list(scheme.notes)
    if slots:
        notes.append(f"layer schedule: {slots[0].scheme}")
    return ModelFacts(
        name=raw.name,
        source=raw.source,
        architecture=common["architecture"],
        model_type=common["model_type"],
        hidden_size=hidden,
        num_hidden_layers=n,
        num_mtp_layers=len(slots) - n,
        quant_method=scheme.method,
        layers=tuple(layers),
        notes=tuple(notes),
        expert_groups=_expert_groups(view, experts, top_k),
    )


def _expert_groups(view: ConfigView, experts: int, top_k: int) -> Optional[tuple[int, int]]:
    """(n_group, topk_group) of a group-limited router (DeepSeek-V3: 4 of 8 groups), where the config
    gives both and they fit the experts; None otherwise (the tokens' top-k is then taken as uniform)."""
    n_group, topk_group = view.integer("n_group"), view.integer("topk_group")
    if not (n_group and topk_group) or n_group <= 1 or not experts or experts % n_group:
        return None
    if not 1 <= topk_group <= n_group or top_k > topk_group * (experts // n_group):
        return None
    return (n_group, topk_group)


def read_model(spec: str, engine: str = "vllm", hub: bool = True) -> ModelFacts:
    """Resolve ``spec`` (catalog name, config.json, folder, Hugging Face id ``org/name[@rev]``) and
    normalise it. An id's two config files come from the Hugging Face cache, downloaded first unless
    ``hub`` is False (the runtime) or moepolicy is offline (``MOEPOLICY_OFFLINE``, ``HF_HUB_OFFLINE``)."""
    return facts_from_raw(resolve(spec, hub=hub), engine=engine)
