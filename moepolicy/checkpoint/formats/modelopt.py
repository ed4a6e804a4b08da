"""NVIDIA ModelOpt (``hf_quant_config.json`` or ``quant_method: modelopt``): FP8, NVFP4 and kin,
with ``exclude_modules`` globs."""

from __future__ import annotations

from typing import Any, Callable

from moepolicy.checkpoint.formats._scheme import QuantScheme, convention, explicit, single
from moepolicy.errors import CheckpointError
from moepolicy.schema.facts import (
    NOT_QUANTIZED,
    Dynamism,
    Granularity,
    QuantDtype,
    ScaleFormat,
    TensorQuant,
)

_MO = "ModelOpt"


def _t(
    dtype: QuantDtype,
    gran: Granularity,
    dyn: Dynamism,
    scale: ScaleFormat,
    note: str,
    group: int | None = None,
    block: tuple[int, int] | None = None,
) -> TensorQuant:
    return TensorQuant(
        dtype=dtype,
        granularity=gran,
        group=group,
        block=block,
        dynamic=dyn,
        scale_format=scale,
        origin={"*": convention(f"{_MO} {note}"), "dtype": explicit("quant_algo")},
    )


def _none(note: str) -> TensorQuant:
    return TensorQuant(
        dtype="none",
        granularity="none",
        dynamic="none",
        scale_format="none",
        origin={"*": convention(f"{_MO} {note}")},
    )


def _fp8(g: int) -> tuple[TensorQuant, TensorQuant]:
    return (
        _t("fp8_e4m3", "tensor", "static", "float32", "FP8: per-tensor weight scale"),
        _t("fp8_e4m3", "tensor", "static", "float32", "FP8: static per-tensor input_scale"),
    )


def _fp8_channel_token(g: int) -> tuple[TensorQuant, TensorQuant]:
    return (
        _t("fp8_e4m3", "channel", "static", "float32", "FP8_PER_CHANNEL_PER_TOKEN weights"),
        _t("fp8_e4m3", "token", "dynamic", "float32", "FP8_PER_CHANNEL_PER_TOKEN activations"),
    )


def _fp8_block_wo(g: int) -> tuple[TensorQuant, TensorQuant]:
    return (
        _t(
            "fp8_e4m3", "block", "static", "float32", "FP8_PB_WO: 128x128 blocks", block=(128, 128)
        ),
        _none("FP8_PB_WO is weight-only"),
    )


def _nvfp4(g: int) -> tuple[TensorQuant, TensorQuant]:
    return (
        _t("nvfp4", "group", "static", "e4m3", "NVFP4: e4m3 group scales + fp32 global", group=g),
        _t(
            "nvfp4",
            "group",
            "dynamic",
            "e4m3",
            "NVFP4 is W4A4 (weight-only is spelled W4A16_NVFP4): dynamic group scales, "
            "static global input scale",
            group=g,
        ),
    )


def _nvfp4_wo(g: int) -> tuple[TensorQuant, TensorQuant]:
    return (
        _t("nvfp4", "group", "static", "e4m3", "W4A16_NVFP4 weights", group=g),
        _none("W4A16_NVFP4 is weight-only"),
    )


def _w4a8_awq(g: int) -> tuple[TensorQuant, TensorQuant]:
    return (
        _t("int4", "group", "static", "float32", "W4A8_AWQ weights", group=g or 128),
        _t("fp8_e4m3", "tensor", "static", "float32", "W4A8_AWQ: static per-tensor fp8 input"),
    )


def _mxfp8(g: int) -> tuple[TensorQuant, TensorQuant]:
    return (
        _t("mxfp8", "group", "static", "e8m0", "MXFP8 weights", group=32),
        _t("mxfp8", "group", "dynamic", "e8m0", "MXFP8 activations", group=32),
    )


def _int8_sq(g: int) -> tuple[TensorQuant, TensorQuant]:
    return (
        _t("int8", "channel", "static", "float32", "INT8 SmoothQuant weights"),
        _t("int8", "tensor", "static", "float32", "INT8 SmoothQuant: static per-tensor input"),
    )


_ALGOS: dict[str, Callable[[int], tuple[TensorQuant, TensorQuant]]] = {
    "FP8": _fp8,
    "FP8_PER_CHANNEL_PER_TOKEN": _fp8_channel_token,
    "FP8_PB_WO": _fp8_block_wo,
    "NVFP4": _nvfp4,
    "W4A16_NVFP4": _nvfp4_wo,
    "NVFP4_AWQ": _nvfp4,
    "W4A8_AWQ": _w4a8_awq,
    "MXFP8": _mxfp8,
    "INT8_SQ": _int8_sq,
    "W8A8_SQ_PER_CHANNEL": _int8_sq,
}


def read(q: dict[str, Any], path: str) -> QuantScheme:
    """``q`` is the ``quantization`` object of hf_quant_config.json, or a quantization_config."""
    algo = q.get("quant_algo")
    if not isinstance(algo, str) or algo.upper() not in _ALGOS:
        raise CheckpointError(
            f"{path}: quant_algo is {algo!r}; known ModelOpt algorithms: {', '.join(sorted(_ALGOS))}"
        )
    group = q.get("group_size") or 16
    if not isinstance(group, int) or isinstance(group, bool) or group <= 0:
        raise CheckpointError(f"{path}: group_size must be a positive integer, got {group!r}")
    weights, acts = _ALGOS[algo.upper()](group)
    exclude = q.get("exclude_modules") or q.get("ignore") or []
    if not isinstance(exclude, list):
        raise CheckpointError(f"{path}: exclude_modules must be a list of names or globs")
    return single("modelopt", weights, acts, [str(x) for x in exclude])


__all__ = ["read", "NOT_QUANTIZED"]
