"""The policy document's cross-field rules, as plain functions (no pydantic).

Both validators call these: the Pydantic models in :mod:`moepolicy.document.model` (CLI, JSON Schema)
and the light runtime validator in :mod:`moepolicy.document.fast_validate`. Each returns ``None`` or
the broken rule as one sentence.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from moepolicy import names
from moepolicy.schema.locations import UNION_TAGS

SCHEMA_VERSION = "2.4"
# 1.x documents load as they are: every 2.0 field has a default that 1.x meant
READABLE_MAJORS = (1, 2)
QUANTIZED_ORDERS = tuple(order.value for order in names.QUANTIZED_ORDERS)
# what a quantized order may put on the wire; 2.1 adds NVFP4 (e2m1 packed two per byte, e4m3 1x16 scales)
QUANTIZED_WIRES = ("fp8_e4m3", "nvfp4")
# values a 2.0 reader does not know: a document that uses one must say 2.1 or newer
V21_WIRE_DTYPES = ("nvfp4",)
V21_SCALE_DTYPES = ("e4m3",)
V21_DEEPEP_FIELDS = ("v2",)
# 2.2: a modelled tune's figures under ``modelled`` (never ``measured``), the search's selected minima
# under ``search``, and the paired test behind each measured order timing
V22_BUCKET_FIELDS = ("modelled", "search")
V22_ORDER_TIMING_FIELDS = ("rounds", "quant_first_speedup", "ci95", "faster", "correction")
# 2.3: each distinct set of layer facts once, in this top-level table, and each layer naming its set
# (``facts: moe-1``); the document tree (what is validated, what the keys cover) is as before
FACTS_TABLE = "layer_facts"
FACTS_TABLE_SINCE = (2, 3)
# 2.4: the ``experts`` section (the expert kernel a tune compared with the engine's pick)
V24_SECTIONS = ("experts",)
BF16_ORDERS = ("dispatch_then_quant", "no_quant")
# 2.0: the expert kernel does dispatch, GEMMs and combine in one kernel (DeepGEMM Mega MoE): the
# communication's format is the kernel's, so the wire records it and no separate order applies
FUSED = "fused"
# fields a 1.x reader would ignore and so misread: a document that has them must say 2.0 or newer
V2_LAYER_FIELDS = ("orders", "unmeasured", "combine")
V2_DEEPEP_FIELDS = ("partial", "schedule", "regime", "measured_orders")


# what a policy may call a data sheet or a rule pack (and a pack's file): a name, never a path: no
# '/', no '\\', no '..', not absolute, not hidden; letters, digits, '_', '+', '-' and single dots
NAME_PATTERN = r"^[A-Za-z0-9_+-]+(\.[A-Za-z0-9_+-]+)*$"
NAME_MAX_LENGTH = 128


# a DeepEP Config's chunk fields, in its argument order; the RDMA ones may be omitted (intranode)
CHUNK_FIELDS = (
    "num_max_nvl_chunked_send_tokens",
    "num_max_nvl_chunked_recv_tokens",
    "num_max_rdma_chunked_send_tokens",
    "num_max_rdma_chunked_recv_tokens",
)
CHUNK_DEFAULTS = {"num_max_rdma_chunked_send_tokens": 6, "num_max_rdma_chunked_recv_tokens": 256}


# a bucket's ``measured`` is in one of two forms, by the name of its model: a serial tune's
# (``MeasuredDoc``), or an overlap tune's row (``OverlapRowDoc``), which has ``overlapped_us``
MEASURED_FORMS = UNION_TAGS


def measured_form(value: Any) -> str:
    """Which form a bucket's ``measured`` is in (both validators' discriminator)."""
    if isinstance(value, Mapping):
        return MEASURED_FORMS[1] if "overlapped_us" in value else MEASURED_FORMS[0]
    name = type(value).__name__
    return name if name in MEASURED_FORMS else MEASURED_FORMS[0]


def layer_problem(kind: str, order: str, wire_dtype: str) -> Optional[str]:
    if (kind == "dense") != (order == "none"):
        return f"kind {kind} does not go with order {order}"
    if order == FUSED:
        return None
    if order in QUANTIZED_ORDERS and wire_dtype not in QUANTIZED_WIRES:
        return f"order {order} needs a quantized wire ({' or '.join(QUANTIZED_WIRES)}), got {wire_dtype}"
    if order in BF16_ORDERS and wire_dtype != "bf16":
        return f"order {order} sends bf16, got wire {wire_dtype}"
    return None


def chunk_problem(nvl_s: int, nvl_r: int, rd_s: int, rd_r: int) -> Optional[str]:
    if nvl_s >= nvl_r:
        return (
            f"NVLink send chunk must be below the receive capacity (DeepEP config.hpp:40-49): "
            f"send {nvl_s} >= recv {nvl_r}"
        )
    if rd_r % rd_s:
        return (
            f"RDMA receive capacity {rd_r} is not a multiple of the send chunk {rd_s}; DeepEP "
            f"rounds it up silently, so write the effective value {-(-rd_r // rd_s) * rd_s}"
        )
    if rd_s > rd_r // 2:
        return f"RDMA send chunk {rd_s} must be at most half the receive capacity {rd_r}"
    return None


def v2_num_sms_problem(value: int) -> Optional[str]:
    """DeepEP v2's ``num_sms``: 0 asks for its analytical count; otherwise an even count."""
    return (
        None
        if value % 2 == 0
        else (f"deepep.v2.num_sms must be 0 (DeepEP's analytical count) or even, got {value}")
    )


def num_sms_problem(value: int) -> Optional[str]:
    return (
        None
        if value % 2 == 0
        else f"num_sms must be even (DeepEP Buffer.set_num_sms), got {value}"
    )


def buffer_problem(value: int) -> Optional[str]:
    return (
        None
        if value % 128 == 0
        else (f"buffer sizes must be a multiple of 128 bytes (deep_ep.cpp:152-155), got {value}")
    )


def buckets_problem(bounds: Sequence[Optional[int]]) -> Optional[str]:
    if any(b is None for b in bounds[:-1]):
        return "only the last bucket may have no max_tokens (it takes every larger batch)"
    if bounds and bounds[-1] is not None:
        return (
            f"the last bucket must have no max_tokens, so that every batch size has a config "
            f"(it ends at max_tokens {bounds[-1]})"
        )
    finite = [b for b in bounds if b is not None]
    if finite != sorted(set(finite)):
        return f"bucket max_tokens must strictly increase, got {list(bounds)}"
    return None


def version_problem(doc: dict) -> Optional[str]:
    """A document that uses a field or value its own ``schema_version`` does not have (a reader of
    that version would misread or refuse it): a 1.x document with a 2.0 field, a 2.0 document with
    an NVFP4 wire, a 2.2 document with a ``layer_facts`` table."""
    version = str(doc.get("schema_version", ""))
    if version in ("2.0", "2.1", "2.2", "2.3") or version.startswith("1."):
        for name in V24_SECTIONS:
            if doc.get(name) is not None:
                return f"{name} needs schema_version 2.4 (the document says {version})"
    if version.startswith("1."):
        return _v1_problem(doc, version)
    if version == "2.0":
        return _v20_problem(doc)
    if version == "2.1":
        return _v21_problem(doc)
    if version == "2.2":
        return _v22_problem(doc)
    return None


def _object(value: Any) -> dict[str, Any]:
    """``value`` where it is a mapping (an object of the document), else an empty one."""
    return value if isinstance(value, dict) else {}


def _layers(doc: dict):
    for n, layer in enumerate(doc.get("layers") or ()):
        if isinstance(layer, dict):
            yield n, layer


def _v1_problem(doc: dict, version: str) -> Optional[str]:
    deepep = _object(doc.get("deepep"))
    for name in V2_DEEPEP_FIELDS:
        if deepep.get(name) is not None:
            return f"deepep.{name} needs schema_version 2.0 (the document says {version})"
    for n, layer in _layers(doc):
        for name in V2_LAYER_FIELDS:
            if layer.get(name) is not None:
                return f"layers[{n}].{name} needs schema_version 2.0 (the document says {version})"
        if layer.get("order") == FUSED:
            return (
                f"layers[{n}].order {FUSED} needs schema_version 2.0 (the document says {version})"
            )
    return _v20_problem(doc)


def _wires(layer: dict):
    yield "wire", layer.get("wire")
    for b, entry in enumerate(layer.get("orders") or ()):
        if isinstance(entry, dict):
            yield f"orders[{b}].wire", entry.get("wire")
    if isinstance(layer.get("unmeasured"), dict):
        yield "unmeasured.wire", layer["unmeasured"].get("wire")


def _v20_problem(doc: dict) -> Optional[str]:
    deepep = _object(doc.get("deepep"))
    for name in V21_DEEPEP_FIELDS:
        if deepep.get(name) is not None:
            return f"deepep.{name} needs schema_version 2.1 (the document says {doc['schema_version']})"
    for n, layer in _layers(doc):
        for where, wire in _wires(layer):
            if not isinstance(wire, dict):
                continue
            scale = _object(wire.get("scale"))
            if wire.get("dtype") in V21_WIRE_DTYPES:
                return (
                    f"layers[{n}].{where}.dtype {wire['dtype']} needs schema_version 2.1 "
                    f"(the document says {doc['schema_version']})"
                )
            if scale.get("dtype") in V21_SCALE_DTYPES:
                return (
                    f"layers[{n}].{where}.scale.dtype {scale['dtype']} needs schema_version 2.1 "
                    f"(the document says {doc['schema_version']})"
                )
    return _v21_problem(doc)


def _v21_problem(doc: dict) -> Optional[str]:
    deepep = _object(doc.get("deepep"))
    for b, bucket in enumerate(deepep.get("buckets") or ()):
        for name in V22_BUCKET_FIELDS:
            if isinstance(bucket, dict) and bucket.get(name) is not None:
                return (
                    f"deepep.buckets[{b}].{name} needs schema_version 2.2 "
                    f"(the document says {doc['schema_version']})"
                )
    for t, timing in enumerate(deepep.get("measured_orders") or ()):
        for name in V22_ORDER_TIMING_FIELDS:
            if isinstance(timing, dict) and timing.get(name) is not None:
                return (
                    f"deepep.measured_orders[{t}].{name} needs schema_version 2.2 "
                    f"(the document says {doc['schema_version']})"
                )
    return _v22_problem(doc)


def _v22_problem(doc: dict) -> Optional[str]:
    """Seen only on the document as written: reading resolves the table (``facts_table``)."""
    if FACTS_TABLE in doc:
        return (
            f"{FACTS_TABLE} needs schema_version 2.3 (the document says {doc['schema_version']})"
        )
    return None


def layer_indices_problem(indices: Sequence[int]) -> Optional[tuple[int, str]]:
    """(position, rule broken) when the layers do not list every index once, in order."""
    for position, index in enumerate(indices):
        if index != position:
            dup = sorted({i for i in indices if indices.count(i) > 1})
            what = f"repeats index {dup[0]}" if dup else f"skips index {position}"
            return position, (
                f"layers must list every index once, in order: the list {what} "
                f"(layers[{position}] has index {index})"
            )
    return None
