"""The runtime's validator: the policy schema as a pydantic-core schema, without pydantic's models.

Serving processes load one policy at start-up; pydantic's first use (model classes, plugin discovery)
costs most of that time, so the runtime validates with :mod:`pydantic_core` directly, against the same
fields, bounds and cross-field rules (:mod:`moepolicy.schema.policy_rules`) as the Pydantic models the
CLI uses. ``tests/test_fast_validate.py`` checks the two accept and refuse the same documents.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Optional

from moepolicy.errors import PolicyError
from moepolicy.schema import policy_rules as rules

HEX64 = r"^[0-9a-f]{64}$"


def _lit(*values: str):
    from pydantic_core import core_schema as cs

    return cs.literal_schema(list(values))


_REQUIRED = object()


def _td(fields: dict[str, tuple]):
    """A typed dict; each field is (schema, required) or (schema, False, default) as in the models."""
    from pydantic_core import core_schema as cs

    out = {}
    for key, spec in fields.items():
        schema, required = spec[0], spec[1]
        if len(spec) == 3:
            schema = cs.with_default_schema(schema, default=spec[2])
        out[key] = cs.typed_dict_field(schema, required=required)
    return cs.typed_dict_schema(out, extra_behavior="allow")


@lru_cache(maxsize=1)
def _validator():
    from pydantic_core import SchemaValidator
    from pydantic_core import core_schema as cs

    def i(**kw):
        return cs.int_schema(**kw)

    def opt(schema):
        return cs.nullable_schema(schema)

    chunk = _td({"num_max_nvl_chunked_send_tokens": (i(gt=0, le=65536), True),
                 "num_max_nvl_chunked_recv_tokens": (i(gt=0, le=65536), True),
                 "num_max_rdma_chunked_send_tokens": (i(gt=0, le=65536), False, 6),
                 "num_max_rdma_chunked_recv_tokens": (i(gt=0, le=65536), False, 256)})
    scale = _td({"granularity": (_lit("block", "token", "tensor"), True), "group": (opt(i(gt=0)), False, None),
                 "dtype": (_lit("float32", "ue8m0"), True), "layout": (_lit("row", "stride0"), False, "row")})
    layer = _td({"index": (i(ge=0, le=100_000), True), "kind": (_lit("moe", "dense"), True),
                 "order": (_lit("quant_then_dispatch", "dispatch_then_quant", "in_kernel_quant", "no_quant", "none"), True),
                 "wire": (_td({"dtype": (_lit("bf16", "fp8_e4m3", "none"), True), "scale": (opt(scale), False, None)}), True),
                 "numerics": (_lit("exact", "approximate"), True), "rule": (cs.str_schema(), True),
                 "reason": (cs.str_schema(), True),
                 "facts": (cs.dict_schema(keys_schema=cs.str_schema(), values_schema=cs.any_schema()), False, {})})
    doc = _td({
        "schema_version": (cs.str_schema(pattern=r"^\d+\.\d+$"), True),
        "model": (_td({"name": (cs.str_schema(), True), "facts_sha256": (cs.str_schema(pattern=HEX64), True),
                       "hidden_size": (i(gt=0), True), "num_layers": (i(gt=0), True),
                       "num_experts": (i(ge=0), True), "top_k": (i(ge=0), True)}), True),
        "target": (_td({"gpu": (cs.str_schema(), True), "arch": (_lit("sm80", "sm90", "sm100"), False, "sm90"),
                        "sm_count": (i(gt=0), False, 132), "ep_size": (i(gt=0, le=65536), True),
                        "gpus_per_node": (i(gt=0, le=65536), True),
                        "layout": (_lit("intranode", "internode"), False, "intranode"),
                        "backend": (_lit("deepep_ht", "deepep_ll"), True), "expert_kernel": (cs.str_schema(), True),
                        "engine": (_lit("vllm", "sglang"), True),
                        "deep_ep": (_td({"api": (_lit("legacy", "v2"), True), "version": (cs.str_schema(), True),
                                         "evidence": (cs.str_schema(), True), "sheet": (cs.str_schema(), False, "")}), True),
                        "options": (cs.list_schema(cs.str_schema()), False, []),
                        "static_scale": (_lit("global-max", "per-expert"), False, "global-max")}), True),
        "rules": (_td({"packs": (cs.list_schema(_td({"name": (cs.str_schema(), True), "version": (cs.str_schema(), True),
                                                     "sha256": (cs.str_schema(), True),
                                                     "path": (opt(cs.str_schema()), False, None)}), min_length=1), True)}), True),
        "deepep": (_td({"num_sms": (i(gt=0, le=1024), True), "num_nvl_bytes": (i(ge=0, le=2**40), True),
                        "num_rdma_bytes": (i(ge=0, le=2**40), True),
                        "buckets": (cs.list_schema(_td({"max_tokens": (opt(i(gt=0, le=10_000_000)), False, None),
                                                        "dispatch": (chunk, True), "combine": (chunk, True),
                                                        "measured": (opt(cs.dict_schema()), False, None)}), min_length=1), True),
                        "provenance": (_td({"source": (_lit("measured", "modelled", "extrapolated", "default"), True),
                                            "note": (cs.str_schema(), False, "")}), True),
                        "low_latency": (opt(cs.dict_schema(keys_schema=cs.str_schema(), values_schema=cs.int_schema())), False, None),
                        "overlap": (opt(cs.dict_schema(keys_schema=cs.str_schema())), False, None)}), True),
        "layers": (cs.list_schema(layer, min_length=1), True),
        "key": (_td({"decision": (cs.str_schema(pattern=HEX64), True), "tuning": (cs.str_schema(pattern=HEX64), True),
                     "content": (cs.str_schema(pattern=HEX64), True)}), True),
        "generated": (cs.dict_schema(keys_schema=cs.str_schema()), False, {}),
    })
    return SchemaValidator(doc)


KNOWN = {
    "": {"schema_version", "model", "target", "rules", "deepep", "layers", "key", "generated"},
    "model": {"name", "facts_sha256", "hidden_size", "num_layers", "num_experts", "top_k"},
    "target": {"gpu", "arch", "sm_count", "ep_size", "gpus_per_node", "layout", "backend", "expert_kernel",
               "engine", "deep_ep", "options", "static_scale"},
    "target.deep_ep": {"api", "version", "evidence", "sheet"},
    "rules": {"packs"},
    "rules.packs[]": {"name", "version", "sha256", "path"},
    "deepep": {"num_sms", "num_nvl_bytes", "num_rdma_bytes", "buckets", "provenance", "low_latency", "overlap"},
    "deepep.buckets[]": {"max_tokens", "dispatch", "combine", "measured"},
    "deepep.buckets[].dispatch": {"num_max_nvl_chunked_send_tokens", "num_max_nvl_chunked_recv_tokens",
                                  "num_max_rdma_chunked_send_tokens", "num_max_rdma_chunked_recv_tokens"},
    "layers[]": {"index", "kind", "order", "wire", "numerics", "rule", "reason", "facts"},
    "layers[].wire": {"dtype", "scale"},
    "layers[].wire.scale": {"granularity", "group", "dtype", "layout"},
    "key": {"decision", "tuning", "content"},
}
KNOWN["deepep.buckets[].combine"] = KNOWN["deepep.buckets[].dispatch"]


def unknown_keys(node: Any, shape: str = "", path: str = "") -> list[str]:
    """YAML paths of keys the schema does not know; ``facts``, ``measured``, ``provenance``,
    ``generated``, ``low_latency`` and ``overlap`` are free-form."""
    known = KNOWN.get(shape)
    found: list[str] = []
    if isinstance(node, dict) and known is not None:
        for key, value in node.items():
            child = f"{path}.{key}" if path else str(key)
            if key not in known:
                found.append(child)
                continue
            sub = f"{shape}.{key}" if shape else str(key)
            if isinstance(value, list):
                for n, item in enumerate(value):
                    found += unknown_keys(item, sub + "[]", f"{child}[{n}]")
            else:
                found += unknown_keys(value, sub, child)
    return found


def _where(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top)"


def _cross_checks(doc: dict[str, Any]) -> Optional[str]:
    deepep = doc["deepep"]
    for field, check in (("num_sms", rules.num_sms_problem), ("num_nvl_bytes", rules.buffer_problem),
                         ("num_rdma_bytes", rules.buffer_problem)):
        problem = check(deepep[field])
        if problem:
            return f"deepep.{field}: {problem}"
    for n, bucket in enumerate(deepep["buckets"]):
        for part in ("dispatch", "combine"):
            c = bucket[part]
            problem = rules.chunk_problem(c["num_max_nvl_chunked_send_tokens"], c["num_max_nvl_chunked_recv_tokens"],
                                          c["num_max_rdma_chunked_send_tokens"], c["num_max_rdma_chunked_recv_tokens"])
            if problem:
                return f"deepep.buckets[{n}].{part}: {problem}"
    problem = rules.buckets_problem([b["max_tokens"] for b in deepep["buckets"]])
    if problem:
        return f"deepep: {problem}"
    for n, layer in enumerate(doc["layers"]):
        problem = rules.layer_problem(layer["kind"], layer["order"], layer["wire"]["dtype"])
        if problem:
            return f"layers[{n}]: {problem}"
    indices = rules.layer_indices_problem([layer["index"] for layer in doc["layers"]])
    if indices:
        return f"(top): {indices[1]}"
    return None


def validate(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """The validated (and coerced) document, or :class:`PolicyError` naming the place."""
    from pydantic_core import ValidationError

    try:
        doc = _validator().validate_python(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        msg = "missing (a policy needs it)" if err.get("type") == "missing" else err.get("msg", "invalid")
        raise PolicyError(f"{source}: {_where(tuple(err.get('loc', ())))}: {msg}{more}") from None
    except RecursionError:
        raise PolicyError(f"{source}: nested too deeply to be a policy") from None
    problem = _cross_checks(doc)
    if problem:
        raise PolicyError(f"{source}: {problem}")
    return doc


class View:
    """Attribute access over a validated document (``doc.target.gpu``), for the key checks."""

    __slots__ = ("_data",)

    def __init__(self, data: dict[str, Any]):
        self._data = data

    def __getattr__(self, name: str) -> Any:
        try:
            value = self._data[name]
        except KeyError:
            raise AttributeError(name) from None
        if isinstance(value, dict):
            return View(value)
        if isinstance(value, list):
            return [View(v) if isinstance(v, dict) else v for v in value]
        return value
