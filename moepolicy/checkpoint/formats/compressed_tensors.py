"""compressed-tensors (llm-compressor): ``config_groups`` with ``targets``, ``weights``,
``input_activations``; ``ignore`` with names and ``re:`` regexes. Partial blocks are read as far as
they go: a field that is missing becomes ``unknown`` with why."""

from __future__ import annotations

from typing import Any, Optional

from moepolicy.checkpoint.formats._scheme import (
    QuantScheme,
    TargetGroup,
    convention,
    explicit,
    unknown,
)
from moepolicy.errors import CheckpointError
from moepolicy.schema.facts import (
    NOT_QUANTIZED,
    Dynamism,
    Granularity,
    Origin,
    QuantDtype,
    ScaleFormat,
    TensorQuant,
)

_STRATEGY: dict[str, Granularity] = {
    "tensor": "tensor",
    "token": "token",
    "channel": "channel",
    "group": "group",
    "block": "block",
    "tensor_group": "group",
    "attn_head": "channel",
}


def _dtype(args: dict[str, Any]) -> tuple[QuantDtype, Origin]:
    bits, kind, group = args.get("num_bits"), args.get("type"), args.get("group_size")
    if bits is None or kind is None:
        return "unknown", unknown("num_bits/type not in config")
    if kind == "float" and bits == 8:
        return "fp8_e4m3", explicit("type float, num_bits 8")
    if kind == "float" and bits == 4:
        if group == 32:
            return "mxfp4", explicit("type float, num_bits 4, group_size 32")
        return "nvfp4", explicit("type float, num_bits 4")
    if kind == "int" and bits == 8:
        return "int8", explicit("type int, num_bits 8")
    if kind == "int" and bits == 4:
        return "int4", explicit("type int, num_bits 4")
    return "unknown", unknown(f"type {kind!r} with num_bits {bits!r} is not a known scheme")


def _scale(dtype: QuantDtype, args: dict[str, Any]) -> tuple[ScaleFormat, Origin]:
    if dtype == "unknown":
        return "unknown", unknown("dtype unknown")
    if dtype == "nvfp4":
        return "e4m3", convention("compressed-tensors nvfp4: fp8 e4m3 group scales + fp32 global")
    if dtype == "mxfp4":
        return "e8m0", convention("OCP MX: e8m0 group scales")
    return "float32", convention("compressed-tensors: float32 scales")


def _tensor(args: Optional[dict[str, Any]], role: str, path: str) -> TensorQuant:
    if args is None:
        return TensorQuant(
            dtype="none",
            granularity="none",
            dynamic="none",
            scale_format="none",
            origin={"*": explicit(f"{role}: null")},
        )
    if not isinstance(args, dict):
        raise CheckpointError(
            f"{path}: config_groups {role} must be an object or null, got {args!r:.60}"
        )
    dtype, dtype_o = _dtype(args)
    strategy = args.get("strategy")
    granularity: Granularity
    if strategy is None:
        granularity, gran_o = "unknown", unknown(f"{role}.strategy not in config")
    elif strategy in _STRATEGY:
        granularity, gran_o = _STRATEGY[strategy], explicit(f"{role}.strategy {strategy}")
    else:
        granularity, gran_o = (
            "unknown",
            unknown(f"{role}.strategy {strategy!r} is not a known strategy"),
        )
    group = args.get("group_size") if granularity == "group" else None
    block = None
    if granularity == "block":
        structure = args.get("block_structure")
        if isinstance(structure, list) and len(structure) == 2:
            block = (int(structure[0]), int(structure[1]))
    dyn = args.get("dynamic")
    dynamism: Dynamism
    if dyn is None:
        dynamism, dyn_o = "unknown", unknown(f"{role}.dynamic not in config")
    else:
        dynamism = "dynamic" if dyn in (True, "local") else "static"
        dyn_o = explicit(f"{role}.dynamic {dyn}")
    scale, scale_o = _scale(dtype, args)
    return TensorQuant(
        dtype=dtype,
        granularity=granularity,
        group=group if isinstance(group, int) else None,
        block=block,
        dynamic=dynamism,
        scale_format=scale,
        origin={
            "dtype": dtype_o,
            "granularity": gran_o,
            "dynamic": dyn_o,
            "scale_format": scale_o,
            "*": explicit(role),
        },
    )


def _undescribed(role: str) -> TensorQuant:
    why = unknown(f"{role} not described in this config group")
    return TensorQuant(
        dtype="unknown",
        granularity="unknown",
        dynamic="unknown",
        scale_format="unknown",
        origin={"*": why},
    )


def read(qc: dict[str, Any], path: str) -> QuantScheme:
    groups_raw = qc.get("config_groups")
    if not isinstance(groups_raw, dict) or not groups_raw:
        raise CheckpointError(
            f"{path}: compressed-tensors quantization_config has no config_groups"
        )
    groups = []
    for name, group in groups_raw.items():
        if not isinstance(group, dict):
            raise CheckpointError(f"{path}: config_groups.{name} must be an object")
        targets = group.get("targets") or ["Linear"]
        if not isinstance(targets, list):
            raise CheckpointError(f"{path}: config_groups.{name}.targets must be a list")
        # a group that describes its activations but not its weights says nothing of the weights:
        # unknown (the safe order), never unquantized (``weights: null`` says that explicitly)
        weights = (
            _tensor(group.get("weights"), "weights", path)
            if "weights" in group
            else _undescribed("weights")
        )
        acts = _tensor(group.get("input_activations"), "input_activations", path)
        groups.append(TargetGroup(tuple(str(t) for t in targets), weights, acts))
    ignore = qc.get("ignore") or []
    if not isinstance(ignore, list):
        raise CheckpointError(f"{path}: quantization_config.ignore must be a list")
    notes = (
        ()
        if "quant_method" in qc
        else ("quant_method not in config; config_groups present: read as compressed-tensors",)
    )
    return QuantScheme("compressed-tensors", tuple(groups), tuple(str(i) for i in ignore), notes)


__all__ = ["read", "NOT_QUANTIZED"]
