"""Evaluate rule packs over one layer's facts: first feasible match by priority, with a full trace.

``decide`` is pure: the same facts, packs and capability sheet give the same decision and trace.
Every rule considered leaves a :class:`Step` saying whether its condition held (and if not, which
leaf failed and the value seen), whether a capability it needs is usable, and whether its wire is
feasible on the target.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from moepolicy.names import QUANTIZED_ORDERS, UNMEASURED, Order
from moepolicy.errors import RulePackError
from moepolicy.rules.grammar import All, AnyOf, Cond, Leaf, Not, Rule, RulePack, Then
from moepolicy.schema.capability import DeepEPSheet
from moepolicy.wire import Wire

DEFAULT_EVIDENCE = ("measured", "code")


@dataclass(frozen=True)
class Failure:
    path: str
    fact: str
    op: str
    value: Any
    seen: Any
    alternatives: tuple["Failure", ...] = ()  # an ``any``: why each of its branches failed

    def render(self) -> str:
        if self.alternatives:
            return "none of any held: " + " | ".join(alt.render() for alt in self.alternatives)
        return f"{self.fact} {self.op} {_fmt(self.value)} failed: saw {_fmt(self.seen)}"


@dataclass(frozen=True)
class Step:
    rule: str
    pack: str
    priority: int
    outcome: str  # fired | condition-false | not-for-this-layer | capability-blocked | infeasible
    detail: str = ""


@dataclass(frozen=True)
class Evidence:
    """How the decision's path is known, split by role: ``transport`` (DeepEP carries the bytes, one
    entry per capability the rule requires) and ``consumer`` (an expert kernel on that GPU reads the
    layout, from the expert-kernel sheet)."""

    role: str  # transport | consumer
    what: str
    level: str  # measured | code | inferred
    source: str = ""

    def render(self) -> str:
        return f"{self.role} {self.what}: {self.level}" + (
            f" ({self.source})" if self.source else ""
        )


@dataclass(frozen=True)
class Decision:
    order: str
    wire: Wire
    numerics: str
    rule: str
    reason: str
    source: str
    trace: tuple[Step, ...]
    evidence: tuple[Evidence, ...] = ()
    combine: str = "bf16"  # what combine sends back

    def evidence_level(self, role: str) -> Optional[str]:
        """The weakest level among this role's entries (None when the decision has none)."""
        levels = [e.level for e in self.evidence if e.role == role]
        for level in ("inferred", "code", "measured"):
            if level in levels:
                return level
        return None


def _fmt(value: Any) -> str:
    if isinstance(value, tuple) and value and isinstance(value[0], tuple):
        return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _leaf_holds(leaf: Leaf, seen: Any) -> bool:
    op, value = leaf.op, leaf.value
    if op == "eq":
        return seen == value
    if op == "ne":
        return seen != value
    if op == "in":
        return seen in value
    if op == "not_in":
        return seen not in value
    if op == "contains":
        return value in seen
    if op == "not_contains":
        return value not in seen
    if op == "in_ranges":
        return any(lo <= seen <= hi for lo, hi in value)
    comparisons: dict[str, Callable[[Any, Any], bool]] = {
        "lt": lambda a, b: a < b,
        "le": lambda a, b: a <= b,
        "gt": lambda a, b: a > b,
        "ge": lambda a, b: a >= b,
    }
    return comparisons[op](seen, value)


def evaluate(cond: Cond, facts: dict[str, Any]) -> Optional[Failure]:
    """``None`` when ``cond`` holds, else why not: the first failing item of an ``all``, every branch of
    an ``any``, the inner condition of a ``not``."""
    if isinstance(cond, Leaf):
        seen = facts.get(cond.fact)
        if seen is None or not _leaf_holds(cond, seen):
            return Failure(cond.path, cond.fact, cond.op, cond.value, seen)
        return None
    if isinstance(cond, All):
        for item in cond.items:
            failure = evaluate(item, facts)
            if failure is not None:
                return failure
        return None
    if isinstance(cond, AnyOf):
        found = [evaluate(item, facts) for item in cond.items]
        failures = [f for f in found if f is not None]
        if len(failures) < len(found):  # an item held
            return None
        if not failures:
            return Failure(cond.path, "any", "of", [], "empty any")
        if len(failures) == 1:
            return failures[0]
        return Failure(cond.path, "any", "of", [], "", alternatives=tuple(failures))
    if isinstance(cond, Not):
        inner = evaluate(cond.item, facts)
        if inner is None:
            return Failure(cond.path, "not", "holds", "(inner condition)", "inner condition held")
        return None
    raise TypeError(f"not a condition: {cond!r}")  # pragma: no cover


def ordered_rules(packs: Sequence[RulePack], decides: str = "order") -> list[Rule]:
    """The rules of the packs that decide ``decides`` (a layer's order, or its expert kernel), pack
    by pack (user packs first, the built-in pack last); within a pack, highest priority first, then
    file order."""
    indexed = [
        (p, -rule.priority, r, rule)
        for p, pack in enumerate(packs)
        if pack.decides == decides
        for r, rule in enumerate(pack.rules)
    ]
    return [item[-1] for item in sorted(indexed, key=lambda t: t[:3])]


def capability_block(
    rule: Rule, sheet: DeepEPSheet, layout: str, allowed: Sequence[str]
) -> Optional[str]:
    for cap_id in rule.requires:
        entry = sheet.capability(cap_id, layout)
        if entry is None or not entry.supported:
            return f"needs {cap_id} ({layout}), which {sheet.name} does not support"
        if entry.evidence not in allowed:
            return (
                f"needs {cap_id} ({layout}), known only as {entry.evidence} "
                f"({entry.source}); opt in with the option inferred-capabilities"
            )
    return None


_QUANTIZED_ON_WIRE = (*QUANTIZED_ORDERS, Order.FUSED)


def _evidence(
    rule: Rule, sheet: DeepEPSheet, layout: str, facts: dict[str, Any]
) -> tuple[Evidence, ...]:
    out = []
    for cap_id in rule.requires:
        entry = sheet.capability(cap_id, layout)
        if entry is not None:
            out.append(
                Evidence(
                    "transport", f"{cap_id} ({layout}, {sheet.name})", entry.evidence, entry.source
                )
            )
    if rule.order_then.order in _QUANTIZED_ON_WIRE and facts.get("kernel.evidence"):
        what = f"{facts.get('kernel.name')} on {facts.get('target.arch')} reads {facts.get('kernel.act_dtype')}"
        out.append(Evidence("consumer", what, facts["kernel.evidence"]))
    return tuple(out)


WireCheck = Callable[[Then, dict[str, Any]], Optional[str]]


def order_misfit(kind: Optional[str], order: str) -> Optional[str]:
    """A dense layer dispatches nothing (order ``none``) and a MoE layer needs a real order: a rule
    whose condition does not say ``layer.kind`` may otherwise decide a layer it cannot apply to."""
    if (kind == "dense") != (order == "none"):
        return (
            f"order {order} does not apply to a {kind} layer (add {{fact: layer.kind, op: eq, value: "
            f"{'moe' if order != 'none' else 'dense'}}} to the rule's condition)"
        )
    return None


def decide(
    facts: dict[str, Any],
    packs: Sequence[RulePack],
    sheet: DeepEPSheet,
    wire_check: WireCheck,
    allow_inferred: bool = False,
) -> Decision:
    allowed = DEFAULT_EVIDENCE + (("inferred",) if allow_inferred else ())
    layout = facts.get("target.layout", "intranode")
    steps: list[Step] = []
    for rule in ordered_rules(packs):
        failure = evaluate(rule.when, facts)
        if failure is not None:
            steps.append(
                Step(rule.id, rule.pack, rule.priority, "condition-false", failure.render())
            )
            continue
        then = rule.order_then
        misfit = order_misfit(facts.get("layer.kind"), then.order)
        if misfit:
            steps.append(Step(rule.id, rule.pack, rule.priority, "not-for-this-layer", misfit))
            continue
        blocked = capability_block(rule, sheet, layout, allowed)
        if blocked:
            steps.append(Step(rule.id, rule.pack, rule.priority, "capability-blocked", blocked))
            continue
        infeasible = wire_check(then, facts)
        if infeasible:
            steps.append(Step(rule.id, rule.pack, rule.priority, "infeasible", infeasible))
            continue
        steps.append(Step(rule.id, rule.pack, rule.priority, "fired", rule.why))
        return Decision(
            order=then.order,
            wire=then.wire,
            numerics=then.numerics,
            rule=rule.id,
            reason=rule.why,
            source=rule.source,
            trace=tuple(steps),
            evidence=_evidence(rule, sheet, layout, facts),
            combine=then.combine,
        )
    raise RulePackError(
        f"no rule decided layer {facts.get('layer.index')}: every pack's rules failed "
        f"({len(steps)} considered); a pack needs a catch-all rule (when: {{all: []}})"
    )


@dataclass(frozen=True)
class KernelChoice:
    """The expert kernel a layer runs, the rule that chose it and why, with the rules considered."""

    kernel: str
    rule: str
    reason: str
    source: str
    trace: tuple[Step, ...]


def choose_kernel(facts: dict[str, Any], packs: Sequence[RulePack]) -> KernelChoice:
    """The first expert-kernel rule that holds for ``facts`` and names a kernel (a rule taking the
    kernel from a fact that names none, ``none`` or ``unmeasured``, is passed over, and says so)."""
    steps: list[Step] = []
    for rule in ordered_rules(packs, "expert_kernel"):
        failure = evaluate(rule.when, facts)
        if failure is not None:
            steps.append(
                Step(rule.id, rule.pack, rule.priority, "condition-false", failure.render())
            )
            continue
        fact = rule.kernel_then.fact
        kernel = facts.get(fact)
        if not kernel or kernel in ("none", UNMEASURED):
            steps.append(
                Step(
                    rule.id, rule.pack, rule.priority, "not-for-this-layer", f"{fact} is {kernel}"
                )
            )
            continue
        steps.append(Step(rule.id, rule.pack, rule.priority, "fired", rule.why))
        return KernelChoice(str(kernel), rule.id, rule.why, rule.source, tuple(steps))
    raise RulePackError(
        f"no expert-kernel rule chose layer {facts.get('layer.index')}'s kernel ({len(steps)} "
        "considered); the experts pack needs a catch-all rule taking the engine's pick"
    )
