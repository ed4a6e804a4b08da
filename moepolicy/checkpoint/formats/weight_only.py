"""Weight-only formats: ``mxfp4`` (gpt-oss), GPTQ, AWQ, and other W4A16/W8A16 schemes.

Their checkpoints quantize expert weights only; the activations reaching the experts are bf16 unless
the target engine chooses otherwise (a target fact, not a checkpoint fact).
"""

from __future__ import annotations

from typing import Any

from moepolicy.checkpoint.formats._scheme import QuantScheme, convention, explicit, single
from moepolicy.errors import CheckpointError
from moepolicy.schema.facts import QuantDtype, TensorQuant

WEIGHT_ONLY_METHODS = {
    "gptq",
    "awq",
    "gptq_marlin",
    "awq_marlin",
    "marlin",
    "bitsandbytes",
    "hqq",
    "exl2",
    "experts_int8",
    "fbgemm_fp8",
}
_GPTQ_SIGNS = {"desc_act", "damp_percent", "true_sequential", "modules_in_block_to_quantize"}


def looks_like_gptq(qc: dict[str, Any]) -> bool:
    """A GPTQ block whose ``quant_method`` was lost (as in trimmed copies)."""
    return "bits" in qc and "group_size" in qc and bool(_GPTQ_SIGNS & set(qc))


def _acts_none(note: str) -> TensorQuant:
    return TensorQuant(
        dtype="none",
        granularity="none",
        dynamic="none",
        scale_format="none",
        origin={"*": convention(note)},
    )


def read_mxfp4(qc: dict[str, Any], path: str) -> QuantScheme:
    weights = TensorQuant(
        dtype="mxfp4",
        granularity="group",
        group=32,
        dynamic="static",
        scale_format="e8m0",
        origin={"*": explicit("quant_method mxfp4 (OCP MX)")},
    )
    acts = _acts_none(
        "mxfp4 checkpoints carry no activation quantization; the engine picks bf16 "
        "(Hopper) or mxfp8 (Blackwell, opt-in)"
    )
    ignore = qc.get("modules_to_not_convert") or []
    if not isinstance(ignore, list):
        raise CheckpointError(f"{path}: modules_to_not_convert must be a list")
    return single("mxfp4", weights, acts, [str(x) for x in ignore])


def _int_field(qc: dict[str, Any], keys: tuple[str, ...], path: str, default: int) -> int:
    for key in keys:
        if key in qc and qc[key] is not None:
            value = qc[key]
            if isinstance(value, bool) or not isinstance(value, int):
                raise CheckpointError(
                    f"{path}: quantization_config.{key} must be an integer, got {value!r}"
                )
            return value
    return default


def read_int_weight_only(
    method: str, qc: dict[str, Any], path: str, notes: tuple[str, ...] = ()
) -> QuantScheme:
    if method == "fbgemm_fp8":
        weights = TensorQuant(
            dtype="fp8_e4m3",
            granularity="channel",
            dynamic="static",
            scale_format="float32",
            origin={"*": explicit("quant_method fbgemm_fp8")},
        )
        acts = TensorQuant(
            dtype="fp8_e4m3",
            granularity="token",
            dynamic="dynamic",
            scale_format="float32",
            origin={"*": convention("fbgemm_fp8: dynamic per-token activations (vLLM)")},
        )
        return single(method, weights, acts, qc.get("modules_to_not_convert") or [])
    bits = _int_field(
        qc, ("bits", "w_bit", "weight_bits"), path, 4 if method != "experts_int8" else 8
    )
    group = _int_field(
        qc, ("group_size", "q_group_size"), path, -1 if method == "experts_int8" else 128
    )
    dtypes: dict[int, QuantDtype] = {4: "int4", 8: "int8"}
    dtype = dtypes.get(bits)
    if dtype is None:
        raise CheckpointError(f"{path}: quantization_config.bits is {bits}; supported: 4 or 8")
    weights = TensorQuant(
        dtype=dtype,
        granularity="channel" if group in (-1, 0) else "group",
        group=None if group in (-1, 0) else group,
        dynamic="static",
        scale_format="float32",
        origin={"*": explicit(f"{method} bits/group_size")},
    )
    acts = _acts_none(f"{method} is weight-only (W{bits}A16)")
    ignore = qc.get("modules_to_not_convert") or []
    return single(
        method, weights, acts, [str(x) for x in ignore] if isinstance(ignore, list) else [], notes
    )
