"""Adapters: each checkpoint quantization format → :class:`QuantScheme`."""

from __future__ import annotations

from typing import Any, Optional

from moepolicy.checkpoint.formats import compressed_tensors, hf_fp8, modelopt, weight_only
from moepolicy.checkpoint.formats._scheme import NONE_SCHEME, QuantScheme
from moepolicy.errors import CheckpointError

KNOWN_METHODS = sorted(
    {"fp8", "compressed-tensors", "modelopt", "mxfp4", "none"} | weight_only.WEIGHT_ONLY_METHODS
)


def read_quant(
    config_qc: Optional[dict[str, Any]],
    hf_quant: Optional[dict[str, Any]],
    config_path: str,
    hf_quant_path: str,
) -> QuantScheme:
    """Normalise whichever quantization description the checkpoint carries."""
    if config_qc is None and hf_quant is not None:
        inner = hf_quant.get("quantization")
        if not isinstance(inner, dict):
            raise CheckpointError(f"{hf_quant_path}: missing the 'quantization' object")
        return modelopt.read(inner, hf_quant_path)
    if config_qc is None:
        return NONE_SCHEME
    if not isinstance(config_qc, dict):
        raise CheckpointError(f"{config_path}: quantization_config must be an object")
    method = config_qc.get("quant_method")
    where = f"{config_path}: quantization_config"
    if method is None:
        if "config_groups" in config_qc:
            return compressed_tensors.read(config_qc, config_path)
        if weight_only.looks_like_gptq(config_qc):
            return weight_only.read_int_weight_only(
                "gptq",
                config_qc,
                config_path,
                ("quant_method not in config; bits/group_size/desc_act read as GPTQ",),
            )
        raise CheckpointError(f"{where} has no quant_method and matches no known format")
    if not isinstance(method, str):
        raise CheckpointError(f"{where}.quant_method must be a string, got {method!r}")
    method = method.lower()
    if method == "fp8":
        return hf_fp8.read(config_qc, config_path)
    if method == "compressed-tensors":
        return compressed_tensors.read(config_qc, config_path)
    if method == "modelopt":
        quantization = config_qc.get("quantization")
        inner = quantization if isinstance(quantization, dict) else config_qc
        return modelopt.read(inner, config_path)
    if method == "mxfp4":
        return weight_only.read_mxfp4(config_qc, config_path)
    if method in weight_only.WEIGHT_ONLY_METHODS:
        return weight_only.read_int_weight_only(method, config_qc, config_path)
    raise CheckpointError(
        f"{where}.quant_method is {method!r}, which moepolicy does not know; known: "
        f"{', '.join(KNOWN_METHODS)}"
    )


__all__ = ["KNOWN_METHODS", "QuantScheme", "read_quant"]
