"""The policy document's cross-field rules, as plain functions (no pydantic).

Both validators call these: the Pydantic models in :mod:`moepolicy.schema.policy` (CLI, JSON Schema)
and the light runtime validator in :mod:`moepolicy.schema.fast_validate`. Each returns ``None`` or
the broken rule as one sentence.
"""

from __future__ import annotations

from typing import Optional, Sequence

SCHEMA_VERSION = "1.0"
QUANTIZED_ORDERS = ("quant_then_dispatch", "in_kernel_quant")
BF16_ORDERS = ("dispatch_then_quant", "no_quant")


def layer_problem(kind: str, order: str, wire_dtype: str) -> Optional[str]:
    if (kind == "dense") != (order == "none"):
        return f"kind {kind} does not go with order {order}"
    if order in QUANTIZED_ORDERS and wire_dtype != "fp8_e4m3":
        return f"order {order} needs an fp8 wire, got {wire_dtype}"
    if order in BF16_ORDERS and wire_dtype != "bf16":
        return f"order {order} sends bf16, got wire {wire_dtype}"
    return None


def chunk_problem(nvl_s: int, nvl_r: int, rd_s: int, rd_r: int) -> Optional[str]:
    if nvl_s >= nvl_r:
        return (f"NVLink send chunk must be below the receive capacity (DeepEP config.hpp:40-49): "
                f"send {nvl_s} >= recv {nvl_r}")
    if rd_r % rd_s:
        return (f"RDMA receive capacity {rd_r} is not a multiple of the send chunk {rd_s}; DeepEP "
                f"rounds it up silently, so write the effective value {-(-rd_r // rd_s) * rd_s}")
    if rd_s > rd_r // 2:
        return f"RDMA send chunk {rd_s} must be at most half the receive capacity {rd_r}"
    return None


def num_sms_problem(value: int) -> Optional[str]:
    return None if value % 2 == 0 else f"num_sms must be even (DeepEP Buffer.set_num_sms), got {value}"


def buffer_problem(value: int) -> Optional[str]:
    return None if value % 128 == 0 else (
        f"buffer sizes must be a multiple of 128 bytes (deep_ep.cpp:152-155), got {value}")


def buckets_problem(bounds: Sequence[Optional[int]]) -> Optional[str]:
    if any(b is None for b in bounds[:-1]):
        return "only the last bucket may have no max_tokens (it takes every larger batch)"
    finite = [b for b in bounds if b is not None]
    if finite != sorted(set(finite)):
        return f"bucket max_tokens must strictly increase, got {list(bounds)}"
    return None


def layer_indices_problem(indices: Sequence[int]) -> Optional[tuple[int, str]]:
    """(position, rule broken) when the layers do not list every index once, in order."""
    for position, index in enumerate(indices):
        if index != position:
            dup = sorted({i for i in indices if indices.count(i) > 1})
            what = f"repeats index {dup[0]}" if dup else f"skips index {position}"
            return position, (f"layers must list every index once, in order: the list {what} "
                              f"(layers[{position}] has index {index})")
    return None
