"""Rule packs: parsing and validation of the YAML grammar.

A condition is ``{all: [...]}``, ``{any: [...]}``, ``{not: cond}`` or a leaf
``{fact: NAME, op: OP, value: V}``; facts come from the closed vocabulary, operators from a closed
table filtered by the fact's type. Nothing is evaluated as code and nothing is looked up by a user
string except in these tables. Errors name the file, the rule id, the YAML path and the nearest
valid name.
"""

from __future__ import annotations

import difflib
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from moepolicy.errors import RulePackError
from moepolicy.names import QUANTIZED_ORDERS, Order, WireDtype
from moepolicy.wire import Scale, Wire
from moepolicy.rules.vocabulary import VOCABULARY, FactType
from moepolicy.text import is_digits
from moepolicy.document.constraints import NAME_MAX_LENGTH, NAME_PATTERN
from moepolicy.datasheets import MAX_DATA_FILE_BYTES, read_yaml
from moepolicy.files import read_bounded

ORDERS = Order.values()
NUMERICS = ("exact", "approximate")
WIRE_DTYPES = WireDtype.values()
SCALE_GRANULARITIES = ("block", "token", "tensor")
SCALE_DTYPES = ("float32", "ue8m0", "e4m3")
SCALE_LAYOUTS = ("row", "stride0")
# what a rule may ask combine to send back; the capability a rule needs for it goes in its requires
COMBINE_DTYPES = ("bf16", "logfmt")
# what a pack decides: each layer's order and wire (the default), or the expert kernel that consumes
# the dispatched rows (``decides: expert_kernel``), decided first since the order depends on it
DECIDES = ("order", "expert_kernel")
# where an expert-kernel rule takes its kernel from: the one asked for (--expert-kernel), the one a
# tune measured faster beyond noise (measured.faster_kernel), or the engine's own pick (kernel.default)
KERNEL_SOURCES = {
    "asked": "kernel.asked",
    "measured": "measured.faster_kernel",
    "engine": "kernel.default",
}

OPS_BY_KIND: dict[str, tuple[str, ...]] = {
    "int": ("eq", "ne", "lt", "le", "gt", "ge", "in", "not_in", "in_ranges"),
    "bool": ("eq", "ne"),
    "enum": ("eq", "ne", "in", "not_in"),
    "str": ("eq", "ne", "in", "not_in"),
    "set": ("contains", "not_contains"),
}


@dataclass(frozen=True)
class Leaf:
    fact: str
    op: str
    value: Any
    path: str


@dataclass(frozen=True)
class All:
    items: tuple["Cond", ...]
    path: str


@dataclass(frozen=True)
class AnyOf:
    items: tuple["Cond", ...]
    path: str


@dataclass(frozen=True)
class Not:
    item: "Cond"
    path: str


Cond = Union[Leaf, All, AnyOf, Not]


@dataclass(frozen=True)
class Then:
    order: str
    wire: Wire
    numerics: str
    # what combine sends back: bf16, or logfmt (DeepEP low-latency's 10-bit LogFMT)
    combine: str = "bf16"


@dataclass(frozen=True)
class KernelThen:
    """An expert-kernel rule's action: take the kernel from the fact ``KERNEL_SOURCES[source]``."""

    source: str  # asked | measured | engine

    @property
    def fact(self) -> str:
        return KERNEL_SOURCES[self.source]


@dataclass(frozen=True)
class Rule:
    id: str
    priority: int
    when: Cond
    then: Union[Then, KernelThen]
    why: str
    source: str
    requires: tuple[str, ...] = ()
    pack: str = ""

    # A pack decides one thing (``RulePack.decides``): its rules' actions are all of one kind.
    @property
    def order_then(self) -> Then:
        """An order rule's action."""
        if not isinstance(self.then, Then):
            raise TypeError(f"rule {self.id} chooses an expert kernel, not an order")
        return self.then

    @property
    def kernel_then(self) -> KernelThen:
        """An expert-kernel rule's action."""
        if not isinstance(self.then, KernelThen):
            raise TypeError(f"rule {self.id} decides an order, not an expert kernel")
        return self.then


@dataclass(frozen=True)
class RulePack:
    name: str
    version: str
    description: str
    rules: tuple[Rule, ...]
    sha256: str
    path: str = ""
    builtin: bool = False
    decides: str = "order"  # order | expert_kernel

    def ref(self) -> dict[str, str]:
        """How a policy names this pack: name, version, sha256 and, for a user pack, its file's name
        (never its path: the policy is read where the pack's path means nothing)."""
        out = {"name": self.name, "version": self.version, "sha256": self.sha256}
        if not self.builtin and _is_name(Path(self.path).name):
            out["path"] = Path(self.path).name
        return out


@dataclass
class _Ctx:
    file: str
    rule_id: str = "?"
    known_caps: frozenset[str] = field(default_factory=frozenset)

    def fail(self, path: str, message: str) -> RulePackError:
        return RulePackError(f"{self.file}: rule '{self.rule_id}' at {path}: {message}")


def _near(word: object, options) -> str:
    hit = difflib.get_close_matches(str(word), list(options), n=1, cutoff=0.5)
    return f" (did you mean '{hit[0]}'?)" if hit else ""


def parse_ranges(text: Any) -> tuple[tuple[int, int], ...]:
    """'3-10,61' → ((3, 10), (61, 61)); raises ValueError on anything else."""
    if isinstance(text, int) and not isinstance(text, bool):
        return ((text, text),)
    if not isinstance(text, str) or not text.strip():
        raise ValueError("expected ranges like '3-10,61'")
    out = []
    for part in text.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        if not is_digits(lo) or (sep and not is_digits(hi)):
            raise ValueError(f"'{part}' is not N or N-M")
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a:
            raise ValueError(f"'{part}' runs backwards")
        out.append((a, b))
    return tuple(out)


def _check_value(ctx: _Ctx, path: str, fact: str, ftype: FactType, op: str, value: Any) -> Any:
    def scalar_ok(v: Any) -> bool:
        if ftype.kind == "int":
            return isinstance(v, int) and not isinstance(v, bool)
        if ftype.kind == "bool":
            return isinstance(v, bool)
        if ftype.kind == "enum":
            return isinstance(v, str) and v in ftype.values
        return isinstance(v, str)

    if op == "in_ranges":
        try:
            return parse_ranges(value)
        except ValueError as exc:
            raise ctx.fail(f"{path}.value", f"in_ranges: {exc}") from None
    if op in ("in", "not_in"):
        if not isinstance(value, list) or not value:
            raise ctx.fail(f"{path}.value", f"'{op}' needs a non-empty list, got {value!r}")
        for i, v in enumerate(value):
            if not scalar_ok(v):
                raise ctx.fail(f"{path}.value[{i}]", _bad_value(fact, ftype, v))
        return tuple(value)
    if op in ("contains", "not_contains"):
        if not isinstance(value, str):
            raise ctx.fail(f"{path}.value", f"'{op}' needs a string, got {value!r}")
        return value
    if not scalar_ok(value):
        raise ctx.fail(f"{path}.value", _bad_value(fact, ftype, value))
    return value


def _bad_value(fact: str, ftype: FactType, value: Any) -> str:
    if ftype.kind == "enum":
        return f"{value!r} is not a value of {fact}{_near(value, ftype.values)}; values: {', '.join(ftype.values)}"
    return f"{fact} is {ftype.kind}, got {value!r}"


def parse_cond(ctx: _Ctx, raw: Any, path: str) -> Cond:
    if not isinstance(raw, dict):
        raise ctx.fail(
            path, f"a condition is a mapping (all/any/not or fact/op/value), got {raw!r:.60}"
        )
    keys = set(raw)
    if keys == {"all"} or keys == {"any"}:
        key = next(iter(keys))
        items = raw[key]
        if not isinstance(items, list):
            raise ctx.fail(f"{path}.{key}", "expected a list of conditions")
        parsed = tuple(parse_cond(ctx, item, f"{path}.{key}[{i}]") for i, item in enumerate(items))
        return All(parsed, path) if key == "all" else AnyOf(parsed, path)
    if keys == {"not"}:
        return Not(parse_cond(ctx, raw["not"], f"{path}.not"), path)
    if keys == {"fact", "op", "value"}:
        fact, op = raw["fact"], raw["op"]
        ftype = VOCABULARY.get(fact) if isinstance(fact, str) else None
        if ftype is None:
            raise ctx.fail(f"{path}.fact", f"unknown fact {fact!r}{_near(fact, VOCABULARY)}")
        allowed = OPS_BY_KIND[ftype.kind]
        if op not in allowed:
            raise ctx.fail(
                f"{path}.op",
                f"operator {op!r} does not apply to {fact} ({ftype.kind})"
                f"{_near(op, allowed)}; allowed: {', '.join(allowed)}",
            )
        value = _check_value(ctx, path, fact, ftype, op, raw["value"])
        return Leaf(fact, op, value, path)
    extra = keys - {"all", "any", "not", "fact", "op", "value"}
    if extra:
        word = sorted(extra)[0]
        raise ctx.fail(
            path,
            f"unknown key {word!r}{_near(word, ['all', 'any', 'not', 'fact', 'op', 'value'])}",
        )
    raise ctx.fail(path, "a leaf needs exactly fact, op and value; or use one of all/any/not")


def _choice(
    ctx: _Ctx,
    raw: dict,
    key: str,
    options: tuple[str, ...],
    path: str,
    default: Optional[str] = None,
) -> str:
    value = raw.get(key, default)
    if value not in options:
        raise ctx.fail(
            f"{path}.{key}", f"{value!r} is not one of {', '.join(options)}{_near(value, options)}"
        )
    return value


def parse_wire(ctx: _Ctx, raw: Any, order: str, path: str) -> Wire:
    if raw is None:
        if order in QUANTIZED_ORDERS:
            raise ctx.fail(path, f"order {order} needs a wire (dtype and scale)")
        return Wire("none" if order == "none" else "bf16")
    if not isinstance(raw, dict):
        raise ctx.fail(path, "wire is a mapping {dtype, scale}")
    _no_extra(ctx, raw, ("dtype", "scale"), path)
    dtype = _choice(ctx, raw, "dtype", WIRE_DTYPES, path)
    scale_raw = raw.get("scale")
    if scale_raw is None:
        return Wire(dtype)
    if not isinstance(scale_raw, dict):
        raise ctx.fail(f"{path}.scale", "scale is a mapping {granularity, group, dtype, layout}")
    _no_extra(ctx, scale_raw, ("granularity", "group", "dtype", "layout"), f"{path}.scale")
    group = scale_raw.get("group")
    if group is not None and (not isinstance(group, int) or isinstance(group, bool) or group <= 0):
        raise ctx.fail(f"{path}.scale.group", f"expected a positive integer, got {group!r}")
    return Wire(
        dtype,
        Scale(
            granularity=_choice(
                ctx, scale_raw, "granularity", SCALE_GRANULARITIES, f"{path}.scale"
            ),
            dtype=_choice(ctx, scale_raw, "dtype", SCALE_DTYPES, f"{path}.scale", "float32"),
            layout=_choice(ctx, scale_raw, "layout", SCALE_LAYOUTS, f"{path}.scale", "row"),
            group=group,
        ),
    )


def _no_extra(ctx: _Ctx, raw: dict, allowed: tuple[str, ...], path: str) -> None:
    for key in raw:
        if key not in allowed:
            raise ctx.fail(
                f"{path}.{key}",
                f"unknown key {key!r}{_near(key, allowed)}; allowed: {', '.join(allowed)}",
            )


_RULE_KEYS = ("id", "priority", "when", "then", "why", "source", "requires", "layers")


def _kernel_then(ctx: _Ctx, then_raw: dict, path: str) -> KernelThen:
    _no_extra(ctx, then_raw, ("expert_kernel",), path)
    return KernelThen(_choice(ctx, then_raw, "expert_kernel", tuple(KERNEL_SOURCES), path))


def _kernel_rule(ctx: _Ctx, raw: dict, path: str, pack: str, when) -> Rule:
    """An expert-kernel rule: its ``then`` names where the kernel comes from; no capabilities."""
    for key in ("why", "source"):
        if not isinstance(raw[key], str) or not raw[key].strip():
            raise ctx.fail(f"{path}.{key}", "expected a non-empty sentence")
    if raw.get("requires"):
        raise ctx.fail(f"{path}.requires", "an expert-kernel rule needs no DeepEP capability")
    return Rule(
        id=raw["id"],
        priority=raw["priority"],
        when=when,
        then=_kernel_then(ctx, raw["then"], f"{path}.then"),
        why=" ".join(raw["why"].split()),
        source=raw["source"],
        pack=pack,
    )


def parse_rule(ctx: _Ctx, raw: Any, path: str, pack: str, decides: str = "order") -> Rule:
    if not isinstance(raw, dict):
        raise ctx.fail(path, "a rule is a mapping")
    ctx.rule_id = str(raw.get("id", "?"))
    _no_extra(ctx, raw, _RULE_KEYS, path)
    for key in ("id", "priority", "then", "why", "source"):
        if key not in raw:
            raise ctx.fail(path, f"missing '{key}'")
    if not isinstance(raw["id"], str) or not raw["id"]:
        raise ctx.fail(f"{path}.id", "expected a non-empty string")
    priority = raw["priority"]
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise ctx.fail(f"{path}.priority", f"expected an integer, got {priority!r}")
    when = parse_cond(ctx, raw.get("when", {"all": []}), f"{path}.when")
    if "layers" in raw:
        try:
            ranges = parse_ranges(raw["layers"])
        except ValueError as exc:
            raise ctx.fail(f"{path}.layers", str(exc)) from None
        when = All((Leaf("layer.index", "in_ranges", ranges, f"{path}.layers"), when), path)
    then_raw = raw["then"]
    if not isinstance(then_raw, dict):
        raise ctx.fail(f"{path}.then", "expected a mapping {order, wire, numerics}")
    if decides == "expert_kernel":
        return _kernel_rule(ctx, raw, path, pack, when)
    _no_extra(ctx, then_raw, ("order", "wire", "numerics", "combine"), f"{path}.then")
    order = _choice(ctx, then_raw, "order", ORDERS, f"{path}.then")
    wire = parse_wire(ctx, then_raw.get("wire"), order, f"{path}.then.wire")
    numerics = _choice(ctx, then_raw, "numerics", NUMERICS, f"{path}.then", "exact")
    combine = _choice(ctx, then_raw, "combine", COMBINE_DTYPES, f"{path}.then", "bf16")
    if combine != "bf16" and numerics == "exact":
        raise ctx.fail(
            f"{path}.then.numerics",
            f"a {combine} combine rounds each expert's output: numerics is approximate",
        )
    requires = raw.get("requires", [])
    if not isinstance(requires, list) or not all(isinstance(r, str) for r in requires):
        raise ctx.fail(f"{path}.requires", "expected a list of capability ids")
    for i, cap in enumerate(requires):
        if ctx.known_caps and cap not in ctx.known_caps:
            raise ctx.fail(
                f"{path}.requires[{i}]", f"unknown capability {cap!r}{_near(cap, ctx.known_caps)}"
            )
    for key in ("why", "source"):
        if not isinstance(raw[key], str) or not raw[key].strip():
            raise ctx.fail(f"{path}.{key}", "expected a non-empty sentence")
    return Rule(
        id=raw["id"],
        priority=priority,
        when=when,
        then=Then(order, wire, numerics, combine),
        why=" ".join(raw["why"].split()),
        source=raw["source"],
        requires=tuple(requires),
        pack=pack,
    )


def _is_name(text: str) -> bool:
    import re

    return len(text) <= NAME_MAX_LENGTH and re.fullmatch(NAME_PATTERN, text) is not None


def parse_pack(
    raw: Any, file: str, text_sha: str, known_caps: frozenset[str], builtin: bool = False
) -> RulePack:
    try:
        return _parse_pack(raw, file, text_sha, known_caps, builtin)
    except RecursionError:
        raise RulePackError(f"{file}: conditions nested too deeply") from None


def _parse_pack(
    raw: Any, file: str, text_sha: str, known_caps: frozenset[str], builtin: bool = False
) -> RulePack:
    ctx = _Ctx(file=file, known_caps=known_caps)
    if not isinstance(raw, dict):
        raise RulePackError(f"{file}: a rule pack is a mapping with pack, version and rules")
    top = ["pack", "version", "description", "decides", "rules"]
    for key in raw:
        if key not in top:
            raise RulePackError(f"{file}: unknown top-level key {key!r}{_near(key, top)}")
    decides = raw.get("decides", "order")
    if decides not in DECIDES:
        raise RulePackError(
            f"{file}: 'decides' is {decides!r}; one of {', '.join(DECIDES)}{_near(decides, DECIDES)}"
        )
    name, version = raw.get("pack"), raw.get("version")
    if not isinstance(name, str) or not name:
        raise RulePackError(f"{file}: 'pack' (the pack's name) must be a non-empty string")
    if not _is_name(name):
        raise RulePackError(
            f"{file}: 'pack' must be a name (letters, digits, '_', '+', '-' and single dots, no "
            f"'/'; a policy names its packs), got {name!r}"
        )
    if not isinstance(raw.get("rules"), list):
        raise RulePackError(f"{file}: 'rules' must be a list")
    rules = tuple(
        parse_rule(ctx, r, f"rules[{i}]", name, decides) for i, r in enumerate(raw["rules"])
    )
    seen: set[str] = set()
    for rule in rules:
        if rule.id in seen:
            raise RulePackError(f"{file}: rule id '{rule.id}' appears twice; ids must be unique")
        seen.add(rule.id)
    return RulePack(
        name=name,
        version=str(version),
        description=str(raw.get("description", "")),
        rules=rules,
        sha256=text_sha,
        path=file,
        builtin=builtin,
        decides=decides,
    )


def load_pack(path: Path, known_caps: frozenset[str], builtin: bool = False) -> RulePack:
    raw = read_yaml(path)
    sha = hashlib.sha256(read_bounded(path, MAX_DATA_FILE_BYTES, RulePackError)).hexdigest()
    return parse_pack(
        raw,
        str(path) if not builtin else f"moepolicy/data/rules/{path.name}",
        sha,
        known_caps,
        builtin=builtin,
    )
