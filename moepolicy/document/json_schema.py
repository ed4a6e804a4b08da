"""The policy document's JSON Schema, generated from the Pydantic models (shipped as
``moepolicy/data/policy.schema.json``; ``tools/gen_schema.py`` writes it, a test keeps it current).

It describes the file as written: the models' document tree, plus (schema 2.3 on) the optional
``layer_facts`` table and a layer's ``facts`` given as the name of one of its sets. Reading
resolves the names before either validator sees the tree (:mod:`moepolicy.document.facts_table`),
so the runtime's validator, built from this file, leaves out what is marked ``x-as-written``.
"""

from __future__ import annotations

import json
from typing import Any

from moepolicy.document.constraints import FACTS_TABLE
from moepolicy.document.fast_validate import AS_WRITTEN


def _as_written(schema: dict[str, Any]) -> dict[str, Any]:
    """The tree's schema with the ``layer_facts`` table and layers that name one of its sets."""
    facts = schema["$defs"]["LayerDoc"]["properties"]["facts"]
    one_set = {key: value for key, value in facts.items() if key != "title"}
    schema["$defs"]["LayerDoc"]["properties"]["facts"] = {
        "title": facts.get("title", "Facts"),
        "anyOf": [
            one_set,
            {
                "type": "string",
                AS_WRITTEN: True,
                "description": (
                    f"schema 2.3 on: the name of a set of facts in the document's {FACTS_TABLE}"
                ),
            },
        ],
    }
    properties = schema["properties"]
    properties[FACTS_TABLE] = {
        "title": "Layer Facts",
        "type": "object",
        "additionalProperties": one_set,
        AS_WRITTEN: True,
        "description": (
            "schema 2.3 on: each distinct set of layer facts once, by name (moe-1); "
            "each layer's facts names one"
        ),
    }
    return schema


def render() -> str:
    # Pydantic: only when the schema is rendered
    from moepolicy.document.model import PolicyDoc

    schema = _as_written(PolicyDoc.model_json_schema())
    schema["$id"] = "https://moepolicy/policy.schema.json"
    schema["title"] = "moepolicy policy document (schema_version 2.x; 1.x documents are valid too)"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"
