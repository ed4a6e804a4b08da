"""The shipped JSON Schema is the one the Pydantic models generate, and it accepts a real policy."""

import json

import pytest

from moepolicy._resources import data_file


def test_shipped_schema_is_current():
    from moepolicy.document.json_schema import render

    assert data_file("policy.schema.json").read_text() == render(), (
        "run: python tools/gen_schema.py"
    )


def test_schema_is_shipped_in_the_package():
    assert data_file("policy.schema.json").is_file()


def test_schema_accepts_a_planned_policy():
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is not installed")
    from moepolicy.checkpoint import read_model
    from moepolicy.document.compose import build_document
    from moepolicy.planner import make_plan
    from moepolicy.rules.packs import pack_stack
    from moepolicy.target import TargetSpec, resolve_target

    doc = build_document(
        make_plan(
            read_model("DeepSeek-V3"),
            resolve_target(TargetSpec(gpu="h200", ep_size=8), probe=False),
            pack_stack(),
        )
    )
    jsonschema.validate(
        json.loads(json.dumps(doc)), json.loads(data_file("policy.schema.json").read_text())
    )


def _planned(model: str, ep_size: int) -> dict:
    from moepolicy.checkpoint import read_model
    from moepolicy.document.compose import build_document
    from moepolicy.planner import make_plan
    from moepolicy.rules.packs import pack_stack
    from moepolicy.target import TargetSpec, resolve_target

    target = resolve_target(TargetSpec(gpu="h200", ep_size=ep_size), probe=False)
    return build_document(make_plan(read_model(model), target, pack_stack()))


def test_schema_describes_the_policy_file_as_written():
    """The YAML as a user or an editor loads it (schema 2.3: the layer_facts table, layers naming a
    set) validates; a layer whose facts are neither a set nor a name does not."""
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is not installed")
    import yaml

    from moepolicy.document.yaml_io import dumps

    schema = json.loads(data_file("policy.schema.json").read_text())
    written = yaml.safe_load(dumps(_planned("DeepSeek-V3", 8)))
    assert isinstance(written["layer_facts"], dict) and written["layers"][0]["facts"] == "dense-1"
    jsonschema.validate(written, schema)
    written["layers"][0]["facts"] = 5
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(written, schema)


def test_the_runtime_validator_leaves_out_the_file_as_written_as_the_models_do():
    """Reading resolves named facts before validating: a tree that still names them is refused by
    both validators in the same words (the runtime's is built from the shipped schema)."""
    from pydantic import ValidationError

    from moepolicy.document.fast_validate import error_message, validate
    from moepolicy.document.model import PolicyDoc
    from moepolicy.errors import PolicyError

    tree = json.loads(json.dumps(_planned("Qwen3-30B-A3B-FP8", 2)))
    tree["layers"][3]["facts"] = "moe-1"
    with pytest.raises(PolicyError) as light:
        validate(tree, "p.yaml")
    with pytest.raises(ValidationError) as full:
        PolicyDoc.model_validate(tree)
    said = "Input should be a valid dictionary, got 'moe-1'"  # the value seen
    assert str(light.value) == f"p.yaml: layers[3].facts: {said}"
    assert error_message(full.value.errors()[0]) == said
