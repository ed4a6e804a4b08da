"""Coverage checks over a stack of rule packs, without facts or a GPU (``moepolicy audit``).

- **shadowed**: an earlier rule (in evaluation order) holds wherever a later one holds and needs no
  capability the later one lacks; the later rule can then fire only where the earlier one is
  capability-blocked or its wire is infeasible on the target — or never, if both decide the same;
- **same-priority overlap**: two rules of one pack with the same priority can both hold for some
  facts; file order decides between them, which the pack author may not have meant.

Conditions are compared fact by fact over a finite set of witness values per fact (an enum's values;
for numbers, every bound the rules name and its neighbours; for strings and sets, the values named
plus one that is none of them), so the checks are exact for conjunctions of leaves on independent
facts. Facts that correlate in real checkpoints can make an overlap impossible in practice; the
message says "can both hold" in that sense. ``any`` and ``not`` are compared by evaluation on the same
witnesses, one fact at a time when they name one fact, otherwise the pair is skipped (never reported).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations, product
from typing import Any, Iterable, Optional, Sequence

from moepolicy.rules.engine import evaluate, ordered_rules
from moepolicy.rules.grammar import All, AnyOf, Cond, Leaf, Not, Rule, RulePack
from moepolicy.rules.vocabulary import VOCABULARY
from moepolicy.settings import cache_dir as default_cache_dir

MAX_WITNESS_COMBINATIONS = 16384
_OTHER = "\x00other"  # a string value no rule names


@dataclass(frozen=True)
class Finding:
    kind: str  # shadowed | same-priority-overlap
    rule: str
    other: str
    message: str


def _leaves(cond: Cond) -> Iterable[Leaf]:
    if isinstance(cond, Leaf):
        yield cond
    elif isinstance(cond, (All, AnyOf)):
        for item in cond.items:
            yield from _leaves(item)
    elif isinstance(cond, Not):
        yield from _leaves(cond.item)


def _named(leaf: Leaf) -> list[Any]:
    return list(leaf.value) if isinstance(leaf.value, (list, tuple)) else [leaf.value]


def _witnesses(fact: str, leaves: list[Leaf]) -> Optional[list[Any]]:
    """Values of ``fact`` enough to decide how the leaves on it combine; ``None`` if too many."""
    kind = VOCABULARY[fact].kind if fact in VOCABULARY else "str"
    if kind == "enum":
        return list(VOCABULARY[fact].values) + ["unknown"] * (
            "unknown" not in VOCABULARY[fact].values
        )
    if kind == "bool":
        return [True, False]
    if kind == "int":
        bounds: set[int] = {0}
        for leaf in leaves:
            for v in _named(leaf):
                for b in v if isinstance(v, (list, tuple)) else [v]:  # in_ranges: [[lo, hi], ...]
                    if isinstance(b, (int, float)) and not isinstance(b, bool):
                        bounds.update({int(b) - 1, int(b), int(b) + 1})
        return sorted(bounds)
    named = sorted({v for leaf in leaves for v in _named(leaf)}, key=str)
    if kind == "set":
        if len(named) > 12:
            return None
        return [frozenset(c) for n in range(len(named) + 1) for c in combinations(named, n)]
    return named + [_OTHER]


def _holds(cond: Cond, facts: dict[str, Any]) -> bool:
    return evaluate(cond, facts) is None


def _relation(a: Cond, b: Cond) -> Optional[tuple[bool, bool]]:
    """(can both hold, wherever ``b`` holds ``a`` holds) over the witnesses of the facts they name;
    ``None`` when there are too many combinations to enumerate."""
    leaves = list(_leaves(a)) + list(_leaves(b))
    facts = sorted({leaf.fact for leaf in leaves})
    found = [_witnesses(f, [leaf for leaf in leaves if leaf.fact == f]) for f in facts]
    domains = [d for d in found if d is not None]
    if len(domains) < len(found):
        return None
    total = 1
    for d in domains:
        total *= max(len(d), 1)
    if total > MAX_WITNESS_COMBINATIONS:
        return None
    both, covers = False, True
    for values in product(*domains):
        env = dict(zip(facts, values))
        hold_a, hold_b = _holds(a, env), _holds(b, env)
        both |= hold_a and hold_b
        if hold_b and not hold_a:
            covers = False
    return both, covers


def applies_when(rule: Rule) -> Cond:
    """The rule's condition plus the layer kind its order can decide (the engine skips a rule whose
    order does not fit the layer: ``order_misfit``)."""
    kind = "dense" if rule.order_then.order == "none" else "moe"
    return All(
        (rule.when, Leaf("layer.kind", "eq", kind, f"{rule.id}.(layer kind of its order)")),
        rule.when.path,
    )


def lint_packs(packs: Sequence[RulePack]) -> list[Finding]:
    findings: list[Finding] = []
    order = ordered_rules(packs)
    for j, later in enumerate(order):
        for earlier in order[:j]:
            if not set(earlier.requires) <= set(later.requires):
                continue
            rel = _relation(applies_when(earlier), applies_when(later))
            if rel is None or not rel[1]:
                continue
            same = earlier.then == later.then
            findings.append(
                Finding(
                    "shadowed",
                    later.id,
                    earlier.id,
                    f"rule '{later.id}' ({later.pack}) is shadowed by '{earlier.id}' ({earlier.pack}), which holds "
                    f"wherever it holds and comes first: "
                    + (
                        "both decide the same, so it never changes a decision; remove it or narrow "
                        f"'{earlier.id}'"
                        if same
                        else f"it fires only where '{earlier.id}' is capability-blocked or its wire is infeasible"
                    ),
                )
            )
            break
    for pack in packs:
        by_priority: dict[int, list[Rule]] = {}
        for rule in pack.rules:
            by_priority.setdefault(rule.priority, []).append(rule)
        for priority, rules in by_priority.items():
            for i, first in enumerate(rules):
                for second in rules[i + 1 :]:
                    rel = _relation(applies_when(first), applies_when(second))
                    if rel is None or not rel[0] or rel[1] or first.then == second.then:
                        continue  # unknown, disjoint, already reported as shadowed, or same decision
                    findings.append(
                        Finding(
                            "same-priority-overlap",
                            second.id,
                            first.id,
                            f"rules '{first.id}' and '{second.id}' of pack '{pack.name}' share priority {priority} and "
                            f"can both hold with different decisions: file order picks '{first.id}'; give one a "
                            f"higher priority or make their conditions exclusive",
                        )
                    )
    return findings


# ------------------------------------------------------------------------------- the cache
# what decides the findings, besides the packs
_LINT_CODE = ("lint.py", "engine.py", "grammar.py", "vocabulary.py")


def lint_key(packs: Sequence[RulePack]) -> str:
    """What the findings depend on: each pack's sha256, in order, and this linter's own source."""
    import hashlib
    from pathlib import Path

    here = Path(__file__).parent
    code = hashlib.sha256(
        b"".join(hashlib.sha256((here / name).read_bytes()).digest() for name in _LINT_CODE)
    )
    blob = "\n".join([code.hexdigest(), *(pack.sha256 for pack in packs)]).encode()
    return hashlib.sha256(blob).hexdigest()


def lint_packs_cached(packs: Sequence[RulePack], cache_dir=None) -> list[Finding]:
    """:func:`lint_packs`, remembered per :func:`lint_key` in a small file of moepolicy's cache
    (``MOEPOLICY_CACHE_DIR``, else ``$XDG_CACHE_HOME/moepolicy``): the lint is about a million rule
    evaluations (seconds) and depends only on the packs' contents. A cache that cannot be read or
    written is ignored: the lint then runs as without it."""
    from pathlib import Path

    key = lint_key(packs)
    path = Path(cache_dir or default_cache_dir()) / "lint" / f"{key}.json"
    cached = _read_cached(path, key)
    if cached is not None:
        return cached
    findings = lint_packs(packs)
    _write_cached(path, key, findings)
    return findings


def _read_cached(path, key: str) -> Optional[list[Finding]]:
    import json

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("key") != key:
            return None
        findings = [Finding(*entry) for entry in data["findings"]]
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    if not all(isinstance(v, str) for f in findings for v in (f.kind, f.rule, f.other, f.message)):
        return None
    return findings


def _write_cached(path, key: str, findings: list[Finding]) -> None:
    import json
    import os
    import tempfile

    text = json.dumps(
        {"key": key, "findings": [[f.kind, f.rule, f.other, f.message] for f in findings]}
    )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".lint-", suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, path)  # whole or not at all: a reader never sees half a file
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
