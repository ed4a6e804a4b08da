"""HF ``quant_method: fp8`` (DeepSeek, Qwen3-FP8, Quark/AMD exports in vLLM's fp8 format)."""

from __future__ import annotations

from typing import Any

from moepolicy.checkpoint.formats._scheme import QuantScheme, convention, explicit, single, unknown
from moepolicy.errors import CheckpointError
from moepolicy.schema.facts import Dynamism, QuantDtype, ScaleFormat, TensorQuant

_FMT: dict[str, QuantDtype] = {
    "e4m3": "fp8_e4m3",
    "e4m3fn": "fp8_e4m3",
    "float8_e4m3fn": "fp8_e4m3",
    "fp8_e4m3": "fp8_e4m3",
    "float8_e4m3fnuz": "fp8_e4m3",
    "e4m3fnuz": "fp8_e4m3",
    "e5m2": "fp8_e5m2",
    "float8_e5m2": "fp8_e5m2",
    "fp8_e5m2": "fp8_e5m2",
}
_VLLM = "vLLM Fp8Config"


def _dtype(qc: dict[str, Any], path: str) -> tuple[QuantDtype, str]:
    fmt = qc.get("fmt")
    if fmt is None:
        return "fp8_e4m3", "convention"
    if not isinstance(fmt, str) or fmt.lower() not in _FMT:
        raise CheckpointError(
            f"{path}: quantization_config.fmt is {fmt!r}; expected one of {sorted(set(_FMT))}"
        )
    return _FMT[fmt.lower()], "explicit"


def _block(qc: dict[str, Any], path: str) -> tuple[int, int] | None:
    block = qc.get("weight_block_size")
    if block is None:
        return None
    if (
        not isinstance(block, list)
        or len(block) != 2
        or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)
    ):
        raise CheckpointError(
            f"{path}: quantization_config.weight_block_size must be two positive integers, got {block!r}"
        )
    return block[0], block[1]


def _scheme(qc: dict[str, Any], path: str) -> Dynamism:
    scheme = qc.get("activation_scheme")
    if scheme is None:
        return "dynamic"
    if scheme not in ("dynamic", "static"):
        raise CheckpointError(
            f"{path}: quantization_config.activation_scheme is {scheme!r}; expected 'dynamic' or 'static'"
        )
    return scheme


def read(qc: dict[str, Any], path: str) -> QuantScheme:
    dtype, dtype_origin = _dtype(qc, path)
    block = _block(qc, path)
    dynamism = _scheme(qc, path)
    scale_fmt = qc.get("scale_fmt")
    scale: ScaleFormat = "ue8m0" if scale_fmt == "ue8m0" else "float32"
    scale_origin = explicit("scale_fmt") if scale_fmt else convention(f"{_VLLM}: float32 scales")
    dtype_o = (
        explicit("fmt")
        if dtype_origin == "explicit"
        else convention(f"{_VLLM}: fmt defaults to e4m3")
    )
    act_dyn_o = (
        explicit("activation_scheme")
        if "activation_scheme" in qc
        else convention(f"{_VLLM}: activation_scheme defaults to dynamic")
    )
    if block is not None:
        weights = TensorQuant(
            dtype=dtype,
            granularity="block",
            block=block,
            dynamic="static",
            scale_format=scale,
            origin={
                "*": explicit("weight_block_size"),
                "dtype": dtype_o,
                "scale_format": scale_origin,
            },
        )
        if dynamism == "dynamic":
            acts = TensorQuant(
                dtype=dtype,
                granularity="group",
                group=block[1],
                dynamic="dynamic",
                scale_format=scale,
                origin={
                    "*": convention(
                        f"{_VLLM}: weight_block_size {list(block)} implies dynamic 1x{block[1]} "
                        "activation groups (DeepSeek: per-token-per-128-channel)"
                    ),
                    "dtype": dtype_o,
                    "dynamic": act_dyn_o,
                    "scale_format": scale_origin,
                },
            )
        else:
            acts = TensorQuant(
                dtype=dtype,
                granularity="unknown",
                dynamic="static",
                scale_format="float32",
                origin={
                    "*": unknown(
                        "static activations with block weights: no engine convention "
                        "(vLLM refuses this combination)"
                    ),
                    "dynamic": act_dyn_o,
                    "dtype": dtype_o,
                },
            )
    else:
        weights = TensorQuant(
            dtype=dtype,
            granularity="tensor",
            dynamic="static",
            scale_format="float32",
            origin={
                "*": convention(f"{_VLLM}: no weight_block_size means per-tensor weight scales"),
                "dtype": dtype_o,
            },
        )
        acts = TensorQuant(
            dtype=dtype,
            granularity="tensor",
            dynamic=dynamism,
            scale_format="float32",
            origin={
                "*": convention(f"{_VLLM}: per-tensor activation scale without weight_block_size"),
                "dtype": dtype_o,
                "dynamic": act_dyn_o,
            },
        )
    ignore = qc.get("modules_to_not_convert") or qc.get("ignored_layers") or []
    if not isinstance(ignore, list) or not all(isinstance(x, str) for x in ignore):
        raise CheckpointError(
            f"{path}: quantization_config.modules_to_not_convert must be a list of names"
        )
    return single("fp8", weights, acts, ignore)
