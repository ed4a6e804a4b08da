"""Policies are written for people (issue 34 item 17, schema 2.3): no YAML anchors, each distinct
set of layer facts once in ``layer_facts``; what the keys cover does not move with the YAML form
(plans keep the keys kept in plan_keys_2_4.json, written when schema 2.4 added the experts pack to
the decision key) and earlier files still read with the keys they carry. Named facts that do not resolve are one line through the CLI and the
runtime loader."""

import json
from pathlib import Path

import pytest
import yaml

from conftest import run_cli
from moepolicy.checkpoint.reader import read_model
from moepolicy.document.constraints import SCHEMA_VERSION
from moepolicy.document.keys import compute_keys
from moepolicy.document.reader import parse_policy
from moepolicy.document.yaml_io import FACTS_TABLE, dumps, parse_text
from moepolicy.errors import PolicyError
from moepolicy.document.compose import build_document
from moepolicy.planner import make_plan
from moepolicy.rules.packs import pack_stack
from moepolicy.target import TargetSpec, resolve_target

BEFORE = json.loads((Path(__file__).parent / "plan_keys_2_4.json").read_text())["plans"]


def _document(case: dict) -> dict:
    target = resolve_target(TargetSpec(gpu=case["gpu"], ep_size=case["ep_size"]), probe=False)
    return build_document(make_plan(read_model(case["model"], hub=False), target, pack_stack()))


@pytest.mark.parametrize("case", BEFORE, ids=lambda c: f"{c['model']}-ep{c['ep_size']}")
def test_a_plan_keeps_its_keys_and_is_written_without_anchors_and_with_facts_once(case):
    doc = _document(case)
    text = dumps(doc)
    assert doc["schema_version"] == SCHEMA_VERSION == "2.4"
    assert doc["key"] == case["key"]
    said_22 = compute_keys({**doc, "schema_version": "2.2"})  # the content key hashes the version
    assert said_22["decision"] == doc["key"]["decision"] != ""
    assert said_22["content"] != doc["key"]["content"]
    raw = yaml.safe_load(text)
    assert "&id" not in text and "*id" not in text
    table = raw[FACTS_TABLE]
    assert all(
        isinstance(layer["facts"], str) and layer["facts"] in table for layer in raw["layers"]
    )
    distinct = {json.dumps(layer["facts"], sort_keys=True) for layer in doc["layers"]}
    assert len(table) == len(distinct) < len(doc["layers"])
    read = parse_text(text)
    assert read["layers"] == doc["layers"] and FACTS_TABLE not in read
    assert compute_keys(read) == compute_keys(raw) == doc["key"]


def _as_22(case: dict) -> dict:
    """A plan as moepolicy wrote it before 2.3: the same tree, said as 2.2, with its own keys."""
    doc = {**_document(case), "schema_version": "2.2"}
    return {**doc, "key": compute_keys(doc)}


def test_a_22_policy_written_with_anchors_and_facts_per_layer_still_reads_with_its_keys():
    doc = _as_22(BEFORE[0])
    shared = doc["layers"][5]["facts"]
    for layer in doc["layers"]:
        if layer["facts"] == shared:
            layer["facts"] = shared  # one object: PyYAML writes an anchor and aliases, as before
    old = yaml.safe_dump(doc, sort_keys=False)
    assert "&id001" in old and FACTS_TABLE not in old
    read = parse_text(old)
    assert read["layers"] == doc["layers"] and compute_keys(read) == doc["key"]
    loaded = parse_policy(old, "old.yaml", strict=True)  # the CLI's reader: keys checked
    assert loaded.doc.schema_version == "2.2" and loaded.raw["key"] == doc["key"]


def test_a_22_document_is_written_with_its_facts_per_layer_and_reads_back():
    doc = _as_22(BEFORE[2])  # what 'validate --rekey' rewrites: the table is 2.3's
    text = dumps(doc)
    assert FACTS_TABLE not in yaml.safe_load(text) and "&id" not in text
    assert parse_policy(text, "old.yaml", strict=True).raw["key"] == doc["key"]


def _written(tmp_path, edit) -> Path:
    raw = yaml.safe_load(dumps(_document(BEFORE[0])))  # DeepSeek-V3: dense-1, moe-1, moe-2
    edit(raw)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _set_facts(n, value):
    def edit(raw):
        raw["layers"][n]["facts"] = value

    return edit


def _table(value):
    def edit(raw):
        raw[FACTS_TABLE] = value

    return edit


def _as_version(version):
    def edit(raw):
        raw["schema_version"] = version

    return edit


def _without_table(raw):
    del raw[FACTS_TABLE]


BROKEN = {
    "unknown-name": (
        _set_facts(3, "moe-9"),
        "layers[3].facts: 'moe-9' is not in layer_facts (it names dense-1, moe-1, moe-2)",
    ),
    "no-table": (
        _without_table,
        "layers[0].facts: 'dense-1' names a set in layer_facts, but the document has no "
        "layer_facts (write the layer's facts there, or add the table)",
    ),
    "table-not-a-mapping": (
        _table(["dense-1", "moe-1"]),
        "layer_facts: must map each name to a set of layer facts (moe-1: {layer.kind: moe, ...}), "
        "got list",
    ),
    "set-not-a-mapping": (
        _table({"dense-1": {"layer.kind": "dense"}, "moe-1": "fp8", "moe-2": {}}),
        "layer_facts.moe-1: a set of layer facts is a mapping (layer.kind: moe, ...), got str fp8",
    ),
    "table-in-2.2": (
        _as_version("2.2"),
        "layer_facts needs schema_version 2.3 (the document says 2.2)",
    ),
}


@pytest.mark.parametrize("name", BROKEN)
def test_named_facts_that_do_not_resolve_are_one_line_from_validate_and_the_runtime(
    tmp_path, name
):
    import moepolicy

    edit, message = BROKEN[name]
    path = _written(tmp_path, edit)
    result = run_cli("validate", str(path))
    assert result.returncode == PolicyError.exit_code
    assert result.stderr.strip().splitlines() == [f"moepolicy: {path}: {message}"]
    with pytest.raises(PolicyError) as caught:
        moepolicy.load_policy(path, ep_size=8, strict=True)
    assert str(caught.value) == f"{path}: {message}"
    safe = moepolicy.load_policy(path, ep_size=8)  # not strict: the safe policy, saying why
    assert safe.fallback_reason == f"damaged policy: {path}: {message}"
