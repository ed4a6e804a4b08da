"""The result of reading a quantization block: per-module tensor quantization and an ignore list."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

from moepolicy.schema.facts import NOT_QUANTIZED, Origin, TensorQuant


def explicit(note: str = "") -> Origin:
    return Origin(kind="explicit", note=note)


def convention(note: str) -> Origin:
    return Origin(kind="convention", note=note)


def unknown(note: str) -> Origin:
    return Origin(kind="unknown", note=note)


@dataclass(frozen=True)
class TargetGroup:
    """Modules matching ``targets`` (``*`` = all, ``Linear`` = every linear, ``re:`` regexes, names)."""

    targets: tuple[str, ...]
    weights: TensorQuant
    activations: TensorQuant

    def covers(self, module: str) -> bool:
        for target in self.targets:
            if target in ("*", "Linear"):
                return True
            if target.startswith("re:"):
                try:
                    if re.match(target[3:], module):
                        return True
                except re.error:
                    continue
            elif module == target or module.endswith("." + target):
                return True
        return False


@dataclass(frozen=True)
class QuantScheme:
    """What a checkpoint's quantization block says, normalised."""

    method: str
    groups: tuple[TargetGroup, ...] = ()
    ignore: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    def for_modules(self, modules: list[str]) -> tuple[TensorQuant, TensorQuant]:
        """(weights, activations) of the first group covering any of ``modules``."""
        for group in self.groups:
            if any(group.covers(m) for m in modules):
                return group.weights, group.activations
        return NOT_QUANTIZED, NOT_QUANTIZED


def single(
    method: str,
    weights: TensorQuant,
    activations: TensorQuant,
    ignore: Optional[list[str]] = None,
    notes: tuple[str, ...] = (),
) -> QuantScheme:
    return QuantScheme(
        method=method,
        groups=(TargetGroup(("*",), weights, activations),),
        ignore=tuple(ignore or ()),
        notes=notes,
    )


NONE_SCHEME = QuantScheme(method="none")
