"""The runtime's pydantic-core validator and the CLI's Pydantic models accept and refuse the same
policy documents, and agree on what they read (fuzzed with the same mutations as test_fuzz.py)."""

import os

from hypothesis import HealthCheck, given, settings

from moepolicy.errors import PolicyError
from moepolicy.document.reader import parse_policy, parse_policy_light

from test_fuzz import POLICY_TEXT, mutated_policy

EXAMPLES = int(os.environ.get("MOEPOLICY_FUZZ_EXAMPLES", "300"))


def outcome(parse, text):
    try:
        return "ok", parse(text, "p.yaml", strict=False)
    except PolicyError as exc:
        return "refused", str(exc)


def summary(loaded):
    doc = loaded.doc
    if not isinstance(doc, dict):
        doc = doc.model_dump(mode="json")
    return (
        doc["deepep"]["num_sms"],
        [(layer["index"], layer["order"], layer["wire"]["dtype"]) for layer in doc["layers"]],
        [
            (b["max_tokens"], b["dispatch"]["num_max_rdma_chunked_recv_tokens"])
            for b in doc["deepep"]["buckets"]
        ],
        doc["target"]["arch"],
        doc["target"]["layout"],
        tuple(loaded.warnings),
    )


def test_the_real_policy_reads_the_same():
    a, b = outcome(parse_policy, POLICY_TEXT), outcome(parse_policy_light, POLICY_TEXT)
    assert a[0] == b[0] == "ok"
    assert summary(a[1]) == summary(b[1])


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(mutated_policy())
def test_both_validators_agree(text):
    full, light = outcome(parse_policy, text), outcome(parse_policy_light, text)
    assert full[0] == light[0], (full, light)
    if full[0] == "ok":
        assert summary(full[1]) == summary(light[1])
    else:  # both name the file and a place (with several problems they may report different ones first)
        assert full[1].startswith("p.yaml: ") and light[1].startswith("p.yaml: ")
