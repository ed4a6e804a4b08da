"""Find and load rule packs: the built-in ``deepep`` pack, built-in names (``vllm``), or files."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Sequence

from moepolicy._resources import data_dir
from moepolicy.errors import RulePackError
from moepolicy.rules.grammar import RulePack, load_pack
from moepolicy.datasheets import deepep_sheets

DEFAULT_PACK = "deepep"
KERNEL_PACK = "experts"  # the built-in expert-kernel pack, decided before the order


def builtin_names() -> list[str]:
    return sorted(p.stem for p in data_dir("rules").glob("*.yaml"))


@lru_cache(maxsize=None)
def known_capabilities() -> frozenset[str]:
    return frozenset(cap for sheet in deepep_sheets().values() for cap in sheet.capabilities)


@lru_cache(maxsize=None)
def builtin_pack(name: str) -> RulePack:
    path = data_dir("rules") / f"{name}.yaml"
    if not path.is_file():
        raise RulePackError(
            f"no built-in rule pack '{name}'; built-in: {', '.join(builtin_names())}"
        )
    return load_pack(path, known_capabilities(), builtin=True)


def load_user_pack(spec: str) -> RulePack:
    path = Path(spec).expanduser()
    if path.is_file():
        pack = load_pack(path, known_capabilities())
        if pack.name in builtin_names():
            raise RulePackError(
                f"rules {spec!r}: the pack is named '{pack.name}', as a built-in pack is; a user "
                f"pack cannot replace a built-in one: give it another name",
                field="rules",
            )
        return pack
    if spec in builtin_names():
        return builtin_pack(spec)
    raise RulePackError(
        f"rules {spec!r}: no such file, and not a built-in pack ({', '.join(builtin_names())})",
        field="rules",
    )


def pack_stack(extra: Sequence[str] = ()) -> list[RulePack]:
    """User packs in the order given (highest priority first), then the built-in default pack and
    the built-in expert-kernel pack."""
    packs = [load_user_pack(spec) for spec in extra]
    names = [p.name for p in packs]
    if len(set(names)) != len(names):
        raise RulePackError(f"rules names a pack twice: {names}", field="rules")
    for builtin in (DEFAULT_PACK, KERNEL_PACK):
        if builtin not in names:
            packs.append(builtin_pack(builtin))
    return packs


def vllm_stack() -> list[RulePack]:
    """What vLLM decides today: the built-in ``vllm`` pack above the built-in packs (one stack,
    wherever moepolicy says what vLLM alone would do)."""
    return [builtin_pack("vllm"), builtin_pack(DEFAULT_PACK), builtin_pack(KERNEL_PACK)]
