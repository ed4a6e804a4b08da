#!/usr/bin/env python3
"""Write the policy document's JSON Schema, generated from the Pydantic models, to
policies/policy.schema.json (shipped with the package; tests/test_schema_file.py keeps it current)."""

import json
import sys
from pathlib import Path

from moepolicy.schema.policy import PolicyDoc

ROOT = Path(__file__).resolve().parents[1]


def render() -> str:
    schema = PolicyDoc.model_json_schema()
    schema["$id"] = "https://moepolicy/policy.schema.json"
    schema["title"] = "moepolicy policy document (schema_version 2.x; 1.x documents are valid too)"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    (ROOT / "policies" / "policy.schema.json").write_text(render())
    sys.exit(0)
