"""What the commands that replay a policy's rules need from it.

- Its rule packs (``explain``, ``audit``): built-in packs by name, user packs by name and sha256 where
  the user says (``--rules`` files or folders) and beside the policy; never at a path the policy gives
  (a policy names its packs, it does not point at files).
- Its stored facts (``explain``, ``export --to vllm``, ``bench``, checked by ``validate``): each layer's
  ``facts`` are free-form in the schema but replayed through the rules, so each named fact must have
  its vocabulary type; a document whose facts do not is refused in one line, never replayed into a crash.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from moepolicy.document.reader import find_user_pack, read_policy
from moepolicy.errors import MoePolicyError, PolicyError
from moepolicy.rules.grammar import RulePack
from moepolicy.rules.packs import builtin_names, builtin_pack, load_user_pack
from moepolicy.rules.vocabulary import VOCABULARY


@dataclass(frozen=True)
class FoundPack:
    ref_name: str
    pack: Optional[RulePack]  # None: not found
    note: str  # why it was not found, or that its contents changed since the plan; empty when as planned


def policy_packs(doc, policy_path: str, given: Sequence[str]) -> list[FoundPack]:
    """Each pack of ``doc.rules.packs``, in the policy's order."""
    places: list[str | Path] = [*given, Path(policy_path).absolute().parent]
    out = []
    for ref in doc.rules.packs:
        if ref.name in builtin_names():
            pack = builtin_pack(ref.name)
        else:
            found = find_user_pack(ref.name, ref.path, places)
            if found is None:
                out.append(
                    FoundPack(
                        ref.name,
                        None,
                        f"rule pack '{ref.name}' used by this policy is not beside it and "
                        "not among --rules: pass its file with --rules",
                    )
                )
                continue
            pack = load_user_pack(str(found.path))
        note = (
            ""
            if pack.sha256 == ref.sha256
            else (
                f"rule pack '{ref.name}' changed since the plan (sha256 {ref.sha256[:12]} -> {pack.sha256[:12]})"
            )
        )
        out.append(FoundPack(ref.name, pack, note))
    return out


def decisions_not_replayed(doc, policy_path: str, given: Sequence[str] = ()) -> list[str]:
    """The layers whose recorded decision (order and rule) is not what their stored facts decide
    under the policy's own rule packs, as ``explain`` replays them, one line each; empty where a pack
    is missing or changed since the plan (nothing to replay faithfully). Layers with measured orders
    are left out (their order came from timings, which ``explain`` shows apart)."""
    # the planner's replay, for validate alone (the other commands here only read)
    from moepolicy.feasibility import wire_problem
    from moepolicy.planner import replay_facts
    from moepolicy.rules.engine import decide
    from moepolicy.target import target_from_doc

    try:
        found = policy_packs(doc, policy_path, given)
    except MoePolicyError:  # a pack beside the policy that does not load: nothing to replay with
        return []
    packs = [f.pack for f in found if f.pack is not None and not f.note]
    if len(packs) < len(found):  # a pack missing or changed since the plan
        return []
    target = target_from_doc(doc.target)
    out = []
    for layer in doc.layers:
        if layer.orders or layer.unmeasured is not None:
            continue
        decision = decide(
            replay_facts(layer.index, layer.facts),
            packs,
            target.deepep,
            lambda then, f: wire_problem(then, f, target),
            allow_inferred="inferred-capabilities" in target.options,
        )
        if (decision.order, decision.rule) != (layer.order, layer.rule):
            out.append(
                f"layers[{layer.index}] records {layer.order} by rule {layer.rule}, but its stored facts "
                f"decide {decision.order} by rule {decision.rule}"
            )
    return out


# facts the replay cannot do without: their least
REPLAY_NEEDS = {"layer.hidden_size": 1, "layer.top_k": 0}
MAX_SIZE = 1 << 20


def stored_facts_problem(doc) -> Optional[str]:
    """The first stored fact the rules could not replay (a wrong type, a value outside its enum), or None."""
    for n, layer in enumerate(doc.layers):
        facts = layer.facts
        for name, least in REPLAY_NEEDS.items():  # read directly when an order's wire is checked
            value = facts.get(name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or not least <= value <= MAX_SIZE
            ):
                return (
                    f"layers[{n}].facts.{name}: must be a whole number from {least} to {MAX_SIZE} (the rules replay "
                    f"it), got {repr(value)[:60]}; re-plan, or restore the fact"
                )
        for name, value in facts.items():
            ftype = VOCABULARY.get(name)
            if ftype is not None and not _fits(ftype, value):
                shown = repr(value)[:60]
                allowed = (
                    f"one of {', '.join(ftype.values)}"
                    if ftype.kind == "enum"
                    else f"a {ftype.kind}"
                )
                return (
                    f"layers[{n}].facts.{name}: must be {allowed} (the rules replay it), got {shown}; "
                    "re-plan, or restore the fact"
                )
    return None


def _fits(ftype, value: Any) -> bool:
    if ftype.kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if ftype.kind == "bool":
        return isinstance(value, bool)
    if ftype.kind == "enum":
        return isinstance(value, str) and value in ftype.values
    if ftype.kind == "str":
        return isinstance(value, str)
    if ftype.kind == "set":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    return True


def read_for_replay(path: str):
    """``read_policy(path)``, refused in one line when its stored facts cannot be replayed."""
    loaded = read_policy(path)
    problem = stored_facts_problem(loaded.doc)
    if problem:
        raise PolicyError(f"{path}: {problem}")
    return loaded
