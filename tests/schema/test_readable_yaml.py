"""Policies are written for people (issue 34 item 17): no YAML anchors, each distinct set of
layer facts once in ``layer_facts``; what the keys cover is unchanged (plans keep the keys they
had before the change, kept in plan_keys_before_readable_yaml.json) and earlier files still
read."""

import json
from pathlib import Path

import pytest
import yaml

from moepolicy.checkpoint.reader import read_model
from moepolicy.document.keys import compute_keys
from moepolicy.document.yaml_io import FACTS_TABLE, dumps, parse_text
from moepolicy.planner import build_document, make_plan
from moepolicy.rules.packs import pack_stack
from moepolicy.target import TargetSpec, resolve_target

BEFORE = json.loads((Path(__file__).parent / "plan_keys_before_readable_yaml.json").read_text())[
    "plans"
]


def _document(case: dict) -> dict:
    target = resolve_target(TargetSpec(gpu=case["gpu"], ep_size=case["ep_size"]), probe=False)
    return build_document(make_plan(read_model(case["model"], hub=False), target, pack_stack()))


@pytest.mark.parametrize("case", BEFORE, ids=lambda c: f"{c['model']}-ep{c['ep_size']}")
def test_a_plan_keeps_its_keys_and_is_written_without_anchors_and_with_facts_once(case):
    doc = _document(case)
    text = dumps(doc)
    assert doc["key"] == case["key"]
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
    assert compute_keys(read) == case["key"]


def test_a_policy_written_with_anchors_and_facts_per_layer_still_reads_the_same():
    doc = _document(BEFORE[0])
    shared = doc["layers"][5]["facts"]
    for layer in doc["layers"]:
        if layer["facts"] == shared:
            layer["facts"] = shared  # one object: PyYAML writes an anchor and aliases, as before
    old = yaml.safe_dump(doc, sort_keys=False)
    assert "&id001" in old
    read = parse_text(old)
    assert read["layers"] == doc["layers"] and compute_keys(read) == BEFORE[0]["key"]


def test_a_layer_naming_facts_the_table_lacks_is_left_for_the_validator_to_name():
    from moepolicy.document.reader import parse_policy
    from moepolicy.errors import PolicyError

    raw = yaml.safe_load(dumps(_document(BEFORE[2])))
    raw["layers"][3]["facts"] = "moe-99"
    with pytest.raises(PolicyError, match=r"layers\[3\]\.facts"):
        parse_policy(yaml.safe_dump(raw, sort_keys=False), "p.yaml")
