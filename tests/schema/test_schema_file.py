"""The shipped JSON Schema is the one the Pydantic models generate, and it accepts a real policy."""

import json

import pytest

from moepolicy._resources import data_file


def test_shipped_schema_is_current():
    from moepolicy.document.json_schema import render

    assert data_file("policy.schema.json").read_text() == render(), \
        "run: python tools/gen_schema.py"


def test_schema_is_shipped_in_the_package():
    assert data_file("policy.schema.json").is_file()


def test_schema_accepts_a_planned_policy():
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is not installed")
    from moepolicy.checkpoint import read_model
    from moepolicy.planner import build_document, make_plan
    from moepolicy.rules.packs import pack_stack
    from moepolicy.target import TargetSpec, resolve_target

    doc = build_document(make_plan(read_model("DeepSeek-V3"), resolve_target(TargetSpec(gpu="h200", ep_size=8), probe=False),
                                   pack_stack()))
    jsonschema.validate(json.loads(json.dumps(doc)), json.loads(data_file("policy.schema.json").read_text()))
