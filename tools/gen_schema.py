#!/usr/bin/env python3
"""Write the policy document's JSON Schema, generated from the Pydantic models, to
moepolicy/data/policy.schema.json (shipped with the package; a test keeps it current)."""

import sys

from moepolicy._resources import data_file
from moepolicy.document.json_schema import render

if __name__ == "__main__":
    data_file("policy.schema.json").write_text(render())
    sys.exit(0)
