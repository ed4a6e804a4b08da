"""Schema 2.0: measured facts decided by the rules (per token bucket where the faster order changes),
the rules' decision without them for a tuning-key mismatch, the schedule and regime, the partial
marker, the fused order; 1.x documents still load, and a 1.x document with 2.0 fields is refused."""

from pathlib import Path

import pytest
import yaml

from moepolicy import load_policy
from moepolicy.checkpoint import read_model
from moepolicy.document.yaml_io import write_document
from moepolicy.errors import PolicyError
from moepolicy.document.keys import compute_keys
from moepolicy.document.compose import build_document
from moepolicy.planner import make_plan, with_measurements
from moepolicy.schema.measured import OrderTiming
from moepolicy.document.reader import parse_policy, parse_policy_light, read_policy
from moepolicy.rules.engine import decide
from moepolicy.rules.packs import pack_stack
from moepolicy.document.constraints import SCHEMA_VERSION
from moepolicy.runtime import loader
from moepolicy.target import TargetSpec, resolve_target

# DeepSeek-V3's shape measured both orders with a crossover: quantizing first wins at 1024 tokens,
# dispatching bf16 wins at 4096 (the shape of the finding in BENCHMARKS.md); the totals favour bf16
CROSSOVER = (OrderTiming(1024, 300.0, 320.0), OrderTiming(4096, 1100.0, 900.0))


@pytest.fixture(autouse=True)
def fresh_warnings():
    loader._WARNED.clear()
    yield
    loader._WARNED.clear()


def ds_plan(ep_size=2):
    # the experts that read block fp8 (vLLM's default on SM90 with EP, FlashInfer CUTLASS, takes bf16)
    target = TargetSpec(gpu="h200", ep_size=ep_size, expert_kernel="deepgemm")
    return make_plan(read_model("DeepSeek-V3"), resolve_target(target, probe=False), pack_stack())


def write(tmp_path: Path, doc: dict, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    write_document(doc, path)
    return path


def test_measured_facts_are_decided_by_the_rules_per_bucket():
    plan = with_measurements(ds_plan(), CROSSOVER)
    layer = plan.layers[3]
    assert layer.facts["measured.faster_order"] == "dispatch_then_quant"  # 1400 vs 1220 us overall
    assert (layer.decision.order, layer.decision.rule) == (
        "dispatch_then_quant",
        "deepep-ht/measured-bf16-faster",
    )
    assert (
        layer.unmeasured.order == "quant_then_dispatch"
        and layer.unmeasured.rule == "deepep-ht/block-fp8"
    )
    assert [(bound, d.order) for bound, d in layer.bucket_decisions] == [
        (1024, "quant_then_dispatch"),
        (None, "dispatch_then_quant"),
    ]
    # the file's rule id is what the rules give for the file's facts (explain replays the same)
    replay = decide(layer.facts, plan.packs, plan.target.deepep, lambda then, f: None)
    assert replay.rule == layer.decision.rule
    assert (
        plan.layers[0].unmeasured is None and not plan.layers[0].bucket_decisions
    )  # dense: not measured


def test_no_crossover_means_one_order_and_no_alternatives():
    plan = with_measurements(
        ds_plan(), (OrderTiming(1024, 300.0, 320.0), OrderTiming(4096, 900.0, 1100.0))
    )
    layer = plan.layers[3]
    assert (
        layer.decision.order == "quant_then_dispatch"
        and layer.unmeasured is None
        and not layer.bucket_decisions
    )


def test_per_bucket_orders_round_trip_through_the_file_validate_and_load(tmp_path):
    doc = build_document(with_measurements(ds_plan(), CROSSOVER))
    assert doc["schema_version"] == SCHEMA_VERSION
    assert doc["deepep"]["measured_orders"][1] == {
        "tokens": 4096,
        "quant_then_dispatch_us": 1100.0,
        "dispatch_then_quant_us": 900.0,
    }
    path = write(tmp_path, doc)
    for parse in (parse_policy, parse_policy_light):
        read_policy(path, strict=True, parse=parse)  # both readers accept it, keys intact
    policy = load_policy(path, ep_size=2, model="DeepSeek-V3")
    assert not policy.is_fallback
    layer = policy.layer(3)
    assert layer.order_for(128) == layer.order_for(1024) == "quant_then_dispatch"
    assert layer.bucket_order(1024).wire.dtype == "fp8_e4m3"
    assert layer.order_for(1025) == layer.order_for(10**6) == "dispatch_then_quant"
    assert layer.bucket_order(4096).wire.dtype == "bf16"
    assert policy.layer(0).order_for(4096) == "none" and layer.combine == "bf16"


def test_a_tuning_key_mismatch_drops_the_measured_facts(tmp_path):
    path = write(tmp_path, build_document(with_measurements(ds_plan(), CROSSOVER)))
    policy = load_policy(path, ep_size=4, model="DeepSeek-V3")  # tuned on EP2
    assert policy.is_fallback and policy.report["tuning"] == "mismatched"
    layer = policy.layer(3)
    assert (layer.order, layer.rule) == ("quant_then_dispatch", "deepep-ht/block-fp8")
    assert layer.order_for(4096) == "quant_then_dispatch" and not layer.orders


def test_the_schedule_is_checked_when_the_engine_says_it(tmp_path):
    path = write(tmp_path, build_document(ds_plan()))
    assert not load_policy(path, ep_size=2, schedule="serial").is_fallback
    overlapped = load_policy(path, ep_size=2, schedule="overlapped")
    assert overlapped.is_fallback and "schedule" in overlapped.fallback_reason
    assert "tuning.schedule: unchecked" in " ".join(load_policy(path, ep_size=2).report_details)


def as_v1(doc: dict) -> dict:
    """``doc`` as a 1.x writer wrote it: none of 2.0's fields."""
    doc["schema_version"] = "1.0"
    for layer in doc["layers"]:
        layer.pop("combine", None)
    for name in ("schedule", "regime"):
        doc["deepep"].pop(name)
    return doc


def test_a_1x_document_still_loads_with_its_keys(tmp_path):
    doc = as_v1(build_document(ds_plan()))
    doc["key"] = compute_keys(doc)
    path = write(tmp_path, doc)
    policy = load_policy(path, ep_size=2, model="DeepSeek-V3", strict=True)
    assert policy.layer(3).order == "quant_then_dispatch" and policy.layer(3).combine == "bf16"
    assert read_policy(path, strict=True).doc.deepep.schedule == "serial"


@pytest.mark.parametrize(
    "mutate, what",
    [
        (
            lambda d: d["deepep"].update(partial={"reason": "x"}),
            "deepep.partial needs schema_version 2.0",
        ),
        (
            lambda d: d["layers"][3].update(
                orders=[
                    {"max_tokens": 1, "order": "no_quant", "wire": {"dtype": "bf16"}, "rule": "r"}
                ]
                * 2
            ),
            "layers[3].orders needs schema_version 2.0",
        ),
        (
            lambda d: d["layers"][3].update(order="fused"),
            "layers[3].order fused needs schema_version 2.0",
        ),
    ],
)
def test_a_1x_document_with_a_2x_field_is_refused_by_both_readers(tmp_path, mutate, what):
    doc = as_v1(build_document(ds_plan()))
    mutate(doc)
    doc["key"] = compute_keys(doc)
    path = write(tmp_path, doc)
    for parse in (parse_policy, parse_policy_light):
        with pytest.raises(PolicyError, match=what.replace("[", r"\[").replace("]", r"\]")):
            read_policy(path, parse=parse)


def test_a_3x_document_is_refused_with_the_versions_this_reader_reads(tmp_path):
    doc = build_document(ds_plan())
    doc["schema_version"] = "3.0"
    doc["key"] = compute_keys(doc)
    with pytest.raises(PolicyError, match="reads 1.x and 2.x"):
        read_policy(write(tmp_path, doc))


def test_the_fused_order_validates_for_moe_layers_only(tmp_path):
    doc = build_document(ds_plan())
    doc["layers"][3].update(
        order="fused",
        wire={
            "dtype": "fp8_e4m3",
            "scale": {"granularity": "block", "group": 32, "dtype": "ue8m0", "layout": "row"},
        },
    )
    doc["key"] = compute_keys(doc)
    for parse in (parse_policy, parse_policy_light):
        read_policy(write(tmp_path, doc), parse=parse)
    doc["layers"][0].update(order="fused")
    doc["key"] = compute_keys(doc)
    for parse in (parse_policy, parse_policy_light):
        with pytest.raises(PolicyError, match="kind dense does not go with order fused"):
            read_policy(write(tmp_path, doc, "dense.yaml"), parse=parse)


def test_per_bucket_orders_must_increase_and_fit_the_layer(tmp_path):
    doc = build_document(with_measurements(ds_plan(), CROSSOVER))
    doc["layers"][3]["orders"][0]["max_tokens"] = None
    doc["key"] = compute_keys(doc)
    for parse in (parse_policy, parse_policy_light):
        with pytest.raises(PolicyError, match="only the last bucket may have no max_tokens"):
            read_policy(write(tmp_path, doc), parse=parse)


def test_the_written_file_names_the_new_fields(tmp_path):
    path = write(tmp_path, build_document(with_measurements(ds_plan(), CROSSOVER)))
    raw = yaml.safe_load(path.read_text())
    assert raw["deepep"]["schedule"] == "serial" and raw["deepep"]["regime"] == "host"
    assert raw["layers"][3]["combine"] == {"dtype": "bf16"} and "combine" not in raw["layers"][0]
    assert raw["layers"][3]["unmeasured"]["rule"] == "deepep-ht/block-fp8"


def test_per_bucket_orders_show_in_validate_explain_and_audit(tmp_path):
    from conftest import run_cli

    path = write(tmp_path, build_document(with_measurements(ds_plan(), CROSSOVER)))
    assert run_cli("validate", str(path)).returncode == 0
    explained = run_cli("explain", str(path), "--layer", "3")
    assert explained.returncode == 0, explained.stderr
    assert "dispatch_then_quant" in explained.stdout and "4096" in explained.stdout
    audited = run_cli("audit", str(path))
    assert audited.returncode == 0 and "dispatch_then_quant" in audited.stdout


def nvfp4_plan():
    facts = read_model("nvidia/Qwen3-30B-A3B-NVFP4")
    return make_plan(
        facts, resolve_target(TargetSpec(gpu="b200", ep_size=8), probe=False), pack_stack()
    )


def test_an_nvfp4_wire_round_trips_through_both_readers_and_the_runtime(tmp_path):
    path = write(tmp_path, build_document(nvfp4_plan()))
    for parse in (parse_policy, parse_policy_light):
        read_policy(path, parse=parse, strict=True)
    layer = load_policy(path, ep_size=8, model="nvidia/Qwen3-30B-A3B-NVFP4", strict=True).layer(0)
    assert (layer.order, layer.wire.dtype, layer.wire.scale.dtype, layer.wire.scale.group) == (
        "quant_then_dispatch",
        "nvfp4",
        "e4m3",
        16,
    )


@pytest.mark.parametrize(
    "what",
    [r"layers\[0\]\.wire\.dtype nvfp4", r"layers\[0\]\.wire\.scale\.dtype e4m3", r"deepep\.v2"],
)
def test_a_2_0_document_with_a_2_1_value_is_refused_by_both_readers(tmp_path, what):
    doc = build_document(nvfp4_plan())
    doc["schema_version"] = "2.0"
    if "scale" in what:
        doc["layers"][0]["wire"]["dtype"] = "fp8_e4m3"
    if "v2" in what:
        doc["layers"][0]["wire"] = {"dtype": "fp8_e4m3"}
        doc["deepep"]["v2"] = {"num_sms": 0}
    doc["key"] = compute_keys(doc)
    path = write(tmp_path, doc)
    for parse in (parse_policy, parse_policy_light):
        with pytest.raises(PolicyError, match=what + r" needs schema_version 2\.1"):
            read_policy(path, parse=parse)


def test_the_keys_hold_contents_and_names_not_where_the_data_lives():
    """Moving the packs and sheets inside the package keeps existing policies' keys: a key part is a
    content hash, a name or a version, never a path."""
    import json

    from moepolicy._resources import DATA
    from moepolicy.document.keys import decision_parts, tuning_parts

    doc = build_document(nvfp4_plan())
    text = json.dumps([decision_parts(doc), tuning_parts(doc)])
    assert "/" not in text and str(DATA) not in text and "yaml" not in text
    assert all(
        pack.get("path") is None for pack in doc["rules"]["packs"]
    )  # the built-in packs go by name
