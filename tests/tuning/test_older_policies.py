"""Policies the tuner wrote before schema 2.2 (``data/policy-2.1-*.yaml``, machine output of the code
of 2026-12-01) still load in the runtime with their keys matched, and ``audit`` words their figures
as what they are; a tune's document (2.2's fields, said as 2.4) validates strictly; a 2.1 document
that uses a 2.2 key is refused by name."""

from pathlib import Path

import pytest
import yaml

from conftest import run_cli
from moepolicy.api import policy_document
from moepolicy import load_policy
from moepolicy.document.keys import compute_keys
from moepolicy.document.reader import read_policy

DATA = Path(__file__).parent / "data"
OLD = {
    "modelled": DATA / "policy-2.1-modelled.yaml",
    "measured": DATA / "policy-2.1-measured.yaml",
}


@pytest.mark.parametrize("kind", sorted(OLD))
def test_a_policy_written_before_the_change_loads_with_its_keys_matched(kind):
    path = OLD[kind]
    doc = yaml.safe_load(path.read_text())
    assert (
        doc["schema_version"] == "2.1" and compute_keys(doc) == doc["key"]
    )  # the key computation is unchanged
    # what the runtime decodes of it is what it says (the tuned section and the measured orders)
    from moepolicy.document.reader import parse_policy_light
    from moepolicy.runtime.loader import policy_as_written

    policy = policy_as_written(read_policy(path, parse=parse_policy_light).doc, str(path))
    assert policy.deepep.num_sms == doc["deepep"]["num_sms"] == 48 and policy.deepep.source == kind
    assert [b.max_tokens for b in policy.deepep.buckets] == [
        b["max_tokens"] for b in doc["deepep"]["buckets"]
    ]
    layer = next(entry for entry in doc["layers"] if entry["kind"] == "moe")
    assert (
        policy.layer(layer["index"]).order == layer["order"]
    )  # the measured order fact is still in force
    assert read_policy(path).doc.deepep.buckets[0].measured  # the 2.1 key still reads
    # serving checks it against this moepolicy's rule packs and sheets: since these were written, both
    # changed (vLLM's real experts, measured NVFP4/MXFP8 transport, a rule's reason), so serving falls
    # back for them, and says that is the only reason
    served = load_policy(path, ep_size=2, model="Qwen3-30B-A3B-FP8")
    mismatched = {d.split(":")[0] for d in served.report_details if ": mismatched" in d}
    assert mismatched <= {"decision.rule_packs", "decision.data_sheets"}, served.report_details
    assert served.is_fallback == bool(mismatched)


def test_audit_words_older_figures_as_what_they_are():
    modelled = run_cli("audit", str(OLD["modelled"]))
    assert modelled.returncode == 0, modelled.stderr
    assert (
        "x1.649 faster, modelled (no interval" in modelled.stdout
        and "95% CI" not in modelled.stdout
    )
    measured = run_cli("audit", str(OLD["measured"]))
    assert "schema 2.1: the rounds that also decided" in measured.stdout
    assert "(one sample each: no test)" in measured.stdout  # its measured orders: one sample each


def test_a_21_document_with_a_22_key_is_refused_by_name(tmp_path):
    doc = yaml.safe_load(OLD["modelled"].read_text())
    doc["deepep"]["buckets"][0]["modelled"] = {"kept": "engine"}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(doc))
    from moepolicy.errors import PolicyError

    with pytest.raises(
        PolicyError, match=r"deepep.buckets\[0\].modelled needs schema_version 2.2"
    ):
        read_policy(path)


def test_a_22_tune_validates_strictly_with_its_new_keys(tmp_path):
    import math
    import random

    from moepolicy.checkpoint.reader import read_model
    from moepolicy.planner import make_plan
    from moepolicy.document.yaml_io import write_document
    from moepolicy.rules.packs import pack_stack
    from moepolicy.target import TargetSpec, resolve_target
    from moepolicy.tuning.bench import Bench, Measurement
    from moepolicy.tuning.options import TuneOptions
    from moepolicy.tuning.runner import tune_plan
    from moepolicy.tuning.space import load_objective, load_space

    pytest.importorskip("optuna")

    class Flat(Bench):
        rng = random.Random(0)

        def measure(self, workload, point):
            us = 500.0 * (20 / point.num_sms) * math.exp(self.rng.gauss(0, 0.02))
            orders = (
                {"quant_then_dispatch": us, "dispatch_then_quant": us * 1.3}
                if workload.both_orders
                else {}
            )
            return Measurement(us, us * 0.8, 100.0, "measured", orders)

    plan = make_plan(
        read_model("Qwen3-30B-A3B-FP8", hub=False),
        resolve_target(TargetSpec(gpu="h200", ep_size=2, expert_kernel="deepgemm"), probe=False),
        pack_stack(),
    )
    options = TuneOptions(
        buckets=((1024, 1.0), (4096, 1.0)),
        trials=2,
        sms=(20, 32),
        storage=f"sqlite:///{tmp_path}/s.db",
        confirm_rounds=9,
    )
    path = tmp_path / "p.yaml"
    write_document(
        policy_document(tune_plan(plan, Flat(), options, load_space(), load_objective())), path
    )
    doc = read_policy(path, strict=True).doc
    assert (
        doc.schema_version == "2.4"
        and doc.deepep.measured_orders[0].faster == "quant_then_dispatch"
    )
    assert doc.deepep.buckets[0].search.note.startswith("selected minima")
    policy = load_policy(path, ep_size=2, model="Qwen3-30B-A3B-FP8", strict=True)
    assert not policy.is_fallback and policy.deepep.num_sms == 32
