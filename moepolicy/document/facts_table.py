"""Each distinct set of layer facts once: the ``layer_facts`` table a written policy holds before
``layers``, each layer naming its set (``facts: moe-1``). The document tree, what is validated and
what the keys cover, has the facts in each layer: :func:`resolved_facts` gives it back from a
written file (and leaves a file without the table, written before, as it is).
"""

from __future__ import annotations

import json
from typing import Any


FACTS_TABLE = "layer_facts"


def _facts_name(kind: Any, counts: dict[str, int]) -> str:
    prefix = kind if isinstance(kind, str) and kind.isidentifier() else "layer"
    counts[prefix] = counts.get(prefix, 0) + 1
    return f"{prefix}-{counts[prefix]}"


def with_facts_table(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with each distinct set of layer facts once, in ``layer_facts`` before ``layers``."""
    layers = doc.get("layers")
    if not isinstance(layers, list) or FACTS_TABLE in doc:
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


def resolved_facts(data: Any) -> Any:
    """``data`` with each layer's named facts replaced by the set ``layer_facts`` holds under that
    name; anything else is left as it is, for the validators to name."""
    if not isinstance(data, dict) or not isinstance(data.get(FACTS_TABLE), dict):
        return data
    table, layers = data[FACTS_TABLE], data.get("layers")
    if not isinstance(layers, list):
        return data

    def resolved(layer: Any) -> Any:
        ref = layer.get("facts") if isinstance(layer, dict) else None
        if isinstance(ref, str) and ref in table:
            return {**layer, "facts": table[ref]}
        return layer

    out = {key: value for key, value in data.items() if key != FACTS_TABLE}
    out["layers"] = [resolved(layer) for layer in layers]
    return out
