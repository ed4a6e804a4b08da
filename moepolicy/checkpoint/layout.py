"""Which decoder layers are MoE: every scheme real checkpoints use.

- DeepSeek V2/V3, Kimi, GLM-4 MoE: ``first_k_dense_replace`` + ``moe_layer_freq``;
- Qwen2/Qwen3 MoE: ``mlp_only_layers`` + ``decoder_sparse_step``;
- Llama 4: ``moe_layers`` or ``interleave_moe_layer_step``;
- newer configs: ``mlp_layer_types`` (one entry per layer);
- Mixtral, gpt-oss and others without any of these: every layer is MoE.
Multi-token-prediction layers (``num_nextn_predict_layers``) follow the last decoder layer and are MoE.
"""

from __future__ import annotations

from dataclasses import dataclass

from moepolicy.checkpoint.fields import ConfigView
from moepolicy.errors import CheckpointError

MAX_LAYERS = 10_000
_SPARSE_TYPES = {"sparse", "moe"}
_DENSE_TYPES = {"dense", "mlp"}


@dataclass(frozen=True)
class LayerSlot:
    index: int
    is_moe: bool
    is_mtp: bool = False
    scheme: str = ""


def _from_mlp_layer_types(view: ConfigView, n: int) -> list[bool]:
    types = view.str_list("mlp_layer_types") or []
    if len(types) != n:
        raise CheckpointError(
            f"{view.path}: 'mlp_layer_types' has {len(types)} entries but num_hidden_layers is {n}"
        )
    flags = []
    for i, kind in enumerate(types):
        if kind.lower() not in _SPARSE_TYPES | _DENSE_TYPES:
            raise CheckpointError(
                f"{view.path}: mlp_layer_types[{i}] is {kind!r}; expected 'sparse' or 'dense'"
            )
        flags.append(kind.lower() in _SPARSE_TYPES)
    return flags


def moe_flags(view: ConfigView, n: int, has_experts: bool) -> tuple[list[bool], str]:
    """One flag per decoder layer (True = MoE) and the name of the scheme that decided."""
    if not has_experts:
        return [False] * n, "no expert count: dense model"
    if view.raw("mlp_layer_types") is not None:
        return _from_mlp_layer_types(view, n), "mlp_layer_types"
    if view.raw("first_k_dense_replace") is not None or view.raw("moe_layer_freq") is not None:
        k = view.integer("first_k_dense_replace") or 0
        freq = view.integer("moe_layer_freq", minimum=1) or 1
        return [i >= k and i % freq == 0 for i in range(n)], (
            f"first_k_dense_replace={k}, moe_layer_freq={freq}"
        )
    if view.raw("moe_layers") is not None:
        chosen = set(view.int_list("moe_layers") or [])
        return [i in chosen for i in range(n)], "moe_layers"
    if view.raw("interleave_moe_layer_step") is not None:
        step = view.integer("interleave_moe_layer_step", minimum=1) or 1
        return [i % step == step - 1 for i in range(n)], f"interleave_moe_layer_step={step}"
    if view.raw("mlp_only_layers") is not None or view.raw("decoder_sparse_step") is not None:
        dense = set(view.int_list("mlp_only_layers") or [])
        step = view.integer("decoder_sparse_step", minimum=1) or 1
        return [i not in dense and (i + 1) % step == 0 for i in range(n)], (
            f"mlp_only_layers={sorted(dense)}, decoder_sparse_step={step}"
        )
    return [True] * n, "every layer MoE (no layer-schedule key)"


def layer_slots(view: ConfigView, has_experts: bool) -> list[LayerSlot]:
    n = view.integer(
        "num_hidden_layers", "n_layers", "num_layers", required=True, minimum=1, maximum=MAX_LAYERS
    )
    flags, scheme = moe_flags(view, n, has_experts)
    slots = [LayerSlot(index=i, is_moe=flag, scheme=scheme) for i, flag in enumerate(flags)]
    mtp = view.integer("num_nextn_predict_layers", maximum=64) or 0
    for j in range(mtp):
        slots.append(
            LayerSlot(
                index=n + j, is_moe=has_experts, is_mtp=True, scheme="num_nextn_predict_layers"
            )
        )
    return slots
