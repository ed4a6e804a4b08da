"""The rule packs a policy names, found for ``explain`` and ``audit``: built-in packs by name, user
packs by name and sha256 where the user says (``--rules`` files or folders) and beside the policy;
never at a path the policy gives (a policy names its packs, it does not point at files)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from moepolicy.rules.grammar import RulePack


@dataclass(frozen=True)
class FoundPack:
    ref_name: str
    pack: Optional[RulePack]  # None: not found
    note: str  # why it was not found, or that its contents changed since the plan; empty when as planned


def policy_packs(doc, policy_path: str, given: Sequence[str]) -> list[FoundPack]:
    """Each pack of ``doc.rules.packs``, in the policy's order."""
    from moepolicy.policy_reader import find_user_pack
    from moepolicy.rules.packs import builtin_names, builtin_pack, load_user_pack

    places = [*given, Path(policy_path).absolute().parent]
    out = []
    for ref in doc.rules.packs:
        if ref.name in builtin_names():
            pack = builtin_pack(ref.name)
        else:
            found = find_user_pack(ref.name, ref.path, places)
            if found is None:
                out.append(FoundPack(ref.name, None, f"rule pack '{ref.name}' used by this policy is not beside it and "
                                                     "not among --rules: pass its file with --rules"))
                continue
            pack = load_user_pack(str(found.path))
        note = "" if pack.sha256 == ref.sha256 else (
            f"rule pack '{ref.name}' changed since the plan (sha256 {ref.sha256[:12]} -> {pack.sha256[:12]})")
        out.append(FoundPack(ref.name, pack, note))
    return out
