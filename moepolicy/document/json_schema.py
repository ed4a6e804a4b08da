"""The policy document's JSON Schema, generated from the Pydantic models (shipped as
``moepolicy/data/policy.schema.json``; ``tools/gen_schema.py`` writes it, a test keeps it current)."""

from __future__ import annotations

import json


def render() -> str:
    from moepolicy.document.model import PolicyDoc

    schema = PolicyDoc.model_json_schema()
    schema["$id"] = "https://moepolicy/policy.schema.json"
    schema["title"] = "moepolicy policy document (schema_version 2.x; 1.x documents are valid too)"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"
