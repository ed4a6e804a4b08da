#!/usr/bin/env python3
"""Write the policy document's JSON Schema, generated from the Pydantic models, to
policies/policy.schema.json (shipped with the package; tests/test_schema_file.py keeps it current)."""

import sys
from pathlib import Path

from moepolicy.schema.json_schema import render

ROOT = Path(__file__).resolve().parents[1]


if __name__ == "__main__":
    (ROOT / "policies" / "policy.schema.json").write_text(render())
    sys.exit(0)
