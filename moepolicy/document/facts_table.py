"""Each distinct set of layer facts once: the ``layer_facts`` table a written policy (schema 2.3
on) holds before ``layers``, each layer naming its set (``facts: moe-1``). The document tree, what
is validated and what the keys cover, has the facts in each layer: :func:`resolved_facts` gives it
back from a written file, and refuses in one line a table its version does not have, a table or
set that is not a mapping, and a name the table lacks; a file without the table, written before,
is left as it is.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from moepolicy.document.constraints import FACTS_TABLE, FACTS_TABLE_SINCE, version_problem
from moepolicy.errors import PolicyError
from moepolicy.text import is_digits, printable

SHOWN_NAMES = 8  # a name the table lacks: the message lists this many of its names


def _facts_name(kind: Any, counts: dict[str, int]) -> str:
    prefix = kind if isinstance(kind, str) and kind.isidentifier() else "layer"
    counts[prefix] = counts.get(prefix, 0) + 1
    return f"{prefix}-{counts[prefix]}"


def has_facts_table(version: Any) -> bool:
    """Whether a document of ``version`` writes its layer facts in the table (2.3 on)."""
    parts = str(version).split(".")
    return all(is_digits(p) for p in parts) and tuple(int(p) for p in parts) >= FACTS_TABLE_SINCE


def with_facts_table(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with each distinct set of layer facts once, in ``layer_facts`` before ``layers``
    (a document of an earlier version keeps its facts in each layer, as that version has them)."""
    layers = doc.get("layers")
    if not isinstance(layers, list) or FACTS_TABLE in doc:
        return doc
    if not has_facts_table(doc.get("schema_version")):
        return doc
    table: dict[str, Any] = {}
    names: dict[str, str] = {}
    counts: dict[str, int] = {}
    out_layers = []
    for layer in layers:
        facts = layer.get("facts") if isinstance(layer, dict) else None
        if not isinstance(facts, dict):
            out_layers.append(layer)
            continue
        seen = json.dumps(facts, sort_keys=True, default=str)
        if seen not in names:
            names[seen] = _facts_name(layer.get("kind"), counts)
            table[names[seen]] = facts
        out_layers.append({**layer, "facts": names[seen]})
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if key == "layers":
            out[FACTS_TABLE] = table
        out[key] = out_layers if key == "layers" else value
    return out


def _layers(data: dict[str, Any]):
    layers = data.get("layers")
    for n, layer in enumerate(layers if isinstance(layers, list) else ()):
        if isinstance(layer, dict):
            yield n, layer


def _value(value: Any) -> str:
    """A value seen, for a message: its type, and a scalar's text (never a container's contents,
    which may be an alias bomb until the size check)."""
    if isinstance(value, (dict, list)):
        return type(value).__name__
    shown = printable(value, one_line=True)
    return f"{type(value).__name__} {shown[:60]}{'...' if len(shown) > 60 else ''}"


def _table_problem(table: Any) -> Optional[str]:
    if not isinstance(table, dict):
        return (
            f"{FACTS_TABLE}: must map each name to a set of layer facts (moe-1: {{layer.kind: "
            f"moe, ...}}), got {_value(table)}"
        )
    for name, facts in table.items():
        if not isinstance(name, str):
            return f"{FACTS_TABLE}: a set's name must be a string (moe-1), got {_value(name)}"
        if not isinstance(facts, dict):
            shown = printable(name, one_line=True)[:60]
            return (
                f"{FACTS_TABLE}.{shown}: a set of layer facts is a mapping (layer.kind: moe, "
                f"...), got {_value(facts)}"
            )
    return None


def _seen(text: str) -> str:
    return repr(text) if len(text) <= 60 else repr(text[:60]) + "..."


def _reference_problem(n: int, ref: str, table: Optional[dict[str, Any]]) -> Optional[str]:
    if table is None:
        return (
            f"layers[{n}].facts: {_seen(ref)} names a set in {FACTS_TABLE}, but the document "
            f"has no {FACTS_TABLE} (write the layer's facts there, or add the table)"
        )
    if ref not in table:
        names = [printable(name, one_line=True)[:60] for name in list(table)[:SHOWN_NAMES]]
        more = f" and {len(table) - SHOWN_NAMES} more" if len(table) > SHOWN_NAMES else ""
        known = f"it names {', '.join(names)}{more}" if names else "it is empty"
        return f"layers[{n}].facts: {_seen(ref)} is not in {FACTS_TABLE} ({known})"
    return None


def facts_problem(data: dict[str, Any]) -> Optional[str]:
    """What keeps a written document's named layer facts from resolving, as one line naming the
    field, the value and the fix; None when they resolve (or the document names none)."""
    table = data.get(FACTS_TABLE)
    if FACTS_TABLE in data:
        problem = version_problem(data) or _table_problem(table)
        if problem:
            return problem
    for n, layer in _layers(data):
        if isinstance(layer.get("facts"), str):
            problem = _reference_problem(n, layer["facts"], table if FACTS_TABLE in data else None)
            if problem:
                return problem
    return None


def resolved_facts(data: Any) -> Any:
    """``data`` as the document tree: each layer's named facts replaced by the set ``layer_facts``
    holds under that name, and the table gone; :class:`PolicyError` (one line) when they do not
    resolve (see :func:`facts_problem`). Anything else is left as it is, for the validators."""
    if not isinstance(data, dict):
        return data
    problem = facts_problem(data)
    if problem:
        raise PolicyError(problem, field=problem.split(":", 1)[0].split(" ", 1)[0])
    if FACTS_TABLE not in data:
        return data
    table = data[FACTS_TABLE]

    def resolved(layer: Any) -> Any:
        ref = layer.get("facts") if isinstance(layer, dict) else None
        return {**layer, "facts": table[ref]} if isinstance(ref, str) else layer

    out = {key: value for key, value in data.items() if key != FACTS_TABLE}
    if isinstance(data.get("layers"), list):
        out["layers"] = [resolved(layer) for layer in data["layers"]]
    return out
