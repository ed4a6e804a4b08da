"""The runtime's validator: the policy schema as a pydantic-core schema, without pydantic's models.

Serving processes load one policy at start-up; pydantic's first use (model classes, plugin discovery)
costs most of that time, so the runtime validates with :mod:`pydantic_core` directly. Its schema and
its table of known keys are built from the shipped JSON Schema, which is generated from the Pydantic
models (``tools/gen_schema.py``; a test keeps it current), so fields and bounds have one source;
cross-field rules are shared too (:mod:`moepolicy.document.constraints`).
``tests/schema/test_fast_validate.py`` checks the two validators accept and refuse the same documents.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Mapping, Optional

from moepolicy.errors import PolicyError
from moepolicy.document import constraints as rules
from moepolicy.schema.locations import yaml_path
from moepolicy._resources import data_file

SCHEMA_FILE = "policy.schema.json"  # generated from the Pydantic models (tools/gen_schema.py)
# an object whose unknown keys a reader does not report (the evidence: document/evidence.py)
FREE_FORM = "x-free-form"
# the file as written, never the tree: the layer_facts table and a layer's facts named in it, which
# reading resolves (document.facts_table) before validating, so this validator leaves them out
AS_WRITTEN = "x-as-written"
# a value taken only as its own type (an SM count never a bool, a float or text)
STRICT = "x-strict"


@lru_cache(maxsize=1)
def _json_schema() -> dict[str, Any]:
    import json

    return json.loads(data_file(SCHEMA_FILE).read_text())


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if ref is None:
        return node
    return _json_schema()["$defs"][ref.rsplit("/", 1)[-1]]


def _core(node: dict[str, Any]):
    """The pydantic-core schema for one JSON Schema node (the subset the generator emits)."""
    from pydantic_core import core_schema as cs

    node = _resolve(node)
    if "oneOf" in node:
        return _measured_forms(node["oneOf"])
    if "anyOf" in node:
        return _any_of(node["anyOf"])
    if "enum" in node:
        return cs.literal_schema(list(node["enum"]))
    kind = node.get("type")
    if kind == "string":
        return cs.str_schema(pattern=node.get("pattern"), max_length=node.get("maxLength"))
    if kind == "integer":
        return cs.int_schema(
            ge=node.get("minimum"),
            le=node.get("maximum"),
            gt=node.get("exclusiveMinimum"),
            strict=node.get(STRICT),
        )
    if kind == "number":
        return cs.float_schema(
            ge=node.get("minimum"), le=node.get("maximum"), gt=node.get("exclusiveMinimum")
        )
    if kind == "boolean":
        return cs.bool_schema()
    if kind == "array":
        return cs.list_schema(
            _core(node.get("items", {})),
            min_length=node.get("minItems"),
            max_length=node.get("maxItems"),
        )
    if kind == "object" and "properties" in node:
        required = set(node.get("required", ()))
        fields = {}
        for key, sub in node["properties"].items():
            if sub.get(AS_WRITTEN):
                continue
            schema = _core(sub)
            if key not in required and "default" in sub:
                schema = cs.with_default_schema(schema, default=sub["default"])
            fields[key] = cs.typed_dict_field(schema, required=key in required)
        return cs.typed_dict_schema(fields, extra_behavior="allow")
    if kind == "object":
        values = node.get("additionalProperties")
        names = node.get("propertyNames")  # integer keys (``overlap.splits_us``: SM counts)
        return cs.dict_schema(
            keys_schema=_core(names) if isinstance(names, dict) else cs.str_schema(),
            values_schema=_core(values) if isinstance(values, dict) else cs.any_schema(),
        )
    return cs.any_schema()


def _measured_forms(forms: list[dict[str, Any]]):
    """The one tagged union: a bucket's ``measured``, in its forms by their models' names."""
    from pydantic_core import core_schema as cs

    choices = {form["$ref"].rsplit("/", 1)[-1]: _core(form) for form in forms}
    assert set(choices) == set(rules.MEASURED_FORMS), f"an untagged oneOf: {sorted(choices)}"
    return cs.tagged_union_schema(choices, discriminator=rules.measured_form)


def _any_of(options: list[dict[str, Any]]):
    from pydantic_core import core_schema as cs

    kept = [o for o in options if o.get("type") != "null" and not o.get(AS_WRITTEN)]
    if {o.get("type") for o in kept} == {"integer", "number"}:  # a figure: a number is both
        kept = [o for o in kept if o.get("type") == "number"]
    inner = _core(kept[0]) if len(kept) == 1 else cs.union_schema([_core(o) for o in kept])
    nullable = any(o.get("type") == "null" for o in options)
    return cs.nullable_schema(inner) if nullable else inner


@lru_cache(maxsize=1)
def _validator():
    from pydantic_core import SchemaValidator

    return SchemaValidator(_core(_json_schema()))


def _known(node: dict[str, Any], shape: str, out: dict[str, set[str]]) -> None:
    node = _resolve(node)
    for option in (*node.get("anyOf", ()), *node.get("oneOf", ())):
        _known(option, shape, out)
    if node.get("type") == "array":
        _known(node.get("items", {}), shape + "[]", out)
    if node.get("type") == "object" and "properties" in node and not node.get(FREE_FORM):
        properties = {k: sub for k, sub in node["properties"].items() if not sub.get(AS_WRITTEN)}
        out[shape] = set(properties)
        for key, sub in properties.items():
            _known(sub, f"{shape}.{key}" if shape else key, out)


@lru_cache(maxsize=1)
def known_keys() -> dict[str, set[str]]:
    """YAML shape (``deepep.buckets[].dispatch``) → the keys the schema defines there."""
    out: dict[str, set[str]] = {}
    _known(_json_schema(), "", out)
    return out


def unknown_keys(node: Any, shape: str = "", path: str = "") -> list[str]:
    """YAML paths of keys the schema does not know; inside the evidence (``measured``, ``modelled``,
    ``search``, ``overlap``, ``provenance``) and mappings (``facts``, ``generated``,
    ``low_latency``) they are not checked."""
    known = known_keys().get(shape)
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


def _layer_checks(n: int, layer: dict[str, Any]) -> Optional[str]:
    problem = rules.layer_problem(layer["kind"], layer["order"], layer["wire"]["dtype"])
    orders = layer.get("orders") or ()
    for entry in orders:
        problem = problem or rules.layer_problem(
            layer["kind"], entry["order"], entry["wire"]["dtype"]
        )
    if orders:
        problem = problem or rules.buckets_problem([entry["max_tokens"] for entry in orders])
    alt = layer.get("unmeasured")
    if alt is not None:
        problem = problem or rules.layer_problem(layer["kind"], alt["order"], alt["wire"]["dtype"])
    return f"layers[{n}]: {problem}" if problem else None


def _cross_checks(doc: dict[str, Any]) -> Optional[str]:
    deepep = doc["deepep"]
    for field, check in (
        ("num_sms", rules.num_sms_problem),
        ("num_nvl_bytes", rules.buffer_problem),
        ("num_rdma_bytes", rules.buffer_problem),
    ):
        problem = check(deepep[field])
        if problem:
            return f"deepep.{field}: {problem}"
    for n, bucket in enumerate(deepep["buckets"]):
        for part in ("dispatch", "combine"):
            c = bucket[part]
            problem = rules.chunk_problem(
                c["num_max_nvl_chunked_send_tokens"],
                c["num_max_nvl_chunked_recv_tokens"],
                c["num_max_rdma_chunked_send_tokens"],
                c["num_max_rdma_chunked_recv_tokens"],
            )
            if problem:
                return f"deepep.buckets[{n}].{part}: {problem}"
    problem = rules.buckets_problem([b["max_tokens"] for b in deepep["buckets"]])
    if problem:
        return f"deepep: {problem}"
    if isinstance(deepep.get("v2"), dict):
        problem = rules.v2_num_sms_problem(deepep["v2"].get("num_sms", 0))
        if problem:
            return f"deepep.v2.num_sms: {problem}"
    for n, layer in enumerate(doc["layers"]):
        problem = _layer_checks(n, layer)
        if problem:
            return problem
    indices = rules.layer_indices_problem([layer["index"] for layer in doc["layers"]])
    if indices:
        return f"(top): {indices[1]}"
    return None


def error_message(err: Mapping[str, Any]) -> str:
    """One validation error (pydantic's or pydantic-core's) in the policy readers' words."""
    kind = err.get("type")
    if kind == "missing":
        return "missing (a policy needs it)"
    if kind in ("string_pattern_mismatch", "string_too_long") and rules.NAME_PATTERN in str(
        (err.get("ctx") or {}).get("pattern", rules.NAME_PATTERN)
    ):
        seen = repr(err.get("input"))[:80]  # repr escapes control and bidirectional characters
        return (
            f"must be a name, never a path (letters, digits, '_', '+', '-' and single dots, at most "
            f"{rules.NAME_MAX_LENGTH} characters; no '/', no '..'), got {seen}"
        )
    said = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    if kind == "value_error" or "input" not in err:  # our own rules name what they saw
        return said
    return f"{said}, got {repr(err['input'])[:80]}"  # repr escapes control characters


def validate(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """The validated (and coerced) document, or :class:`PolicyError` naming the place."""
    from pydantic_core import ValidationError

    try:
        doc = _validator().validate_python(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise PolicyError(
            f"{source}: {yaml_path(tuple(err.get('loc', ())))}: {error_message(err)}{more}"
        ) from None
    except RecursionError:
        raise PolicyError(f"{source}: nested too deeply to be a policy") from None
    # before defaults: a 1.x document does not have 2.0's fields
    problem = rules.version_problem(raw)
    problem = f"(top): {problem}" if problem else _cross_checks(doc)
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
