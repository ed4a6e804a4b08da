"""The policy's evidence typed (``moepolicy/document/evidence.py``): what the tuners write is what
the models define, written as given (order, and an int an int); a hand-edited block that does not
fit is refused by both readers in one line naming the field and the value seen; a field the reader
does not know is kept without a word; the renderers read the typed models."""

import math
import random
from pathlib import Path

import pytest
import yaml

from moepolicy.cli._deepep_summary import deepep_lines
from moepolicy.document.evidence import (
    MeasuredDoc,
    OverlapDoc,
    OverlapRowDoc,
    ProvenanceDoc,
    SearchDoc,
)
from moepolicy.document.keys import compute_keys
from moepolicy.document.model import BucketDoc, DeepEPDoc, unknown_fields
from moepolicy.document.reader import parse_policy, parse_policy_light, read_policy
from moepolicy.errors import PolicyError
from moepolicy.schema.locations import UNION_TAGS

MEASURED_21 = Path(__file__).parents[1] / "tuning" / "data" / "policy-2.1-measured.yaml"


def _as_typed(kind, plain):
    """``plain`` through the model ``kind``: nothing it does not define, and the items it writes."""
    typed = kind.model_validate(plain)
    assert unknown_fields(typed) == []
    return list(typed.model_dump(exclude_unset=True).items())


@pytest.fixture(scope="module")
def live_tune(tmp_path_factory):
    """What a live serial tune keeps (a flat bench standing in for the GPUs): schema 2.2's
    ``measured`` (selection, gate and report) and ``search``, and its provenance."""
    pytest.importorskip("optuna")
    from moepolicy.checkpoint.reader import read_model
    from moepolicy.planner import make_plan
    from moepolicy.rules.packs import pack_stack
    from moepolicy.target import TargetSpec, resolve_target
    from moepolicy.tuning.bench import Bench, Measurement
    from moepolicy.tuning.options import TuneOptions
    from moepolicy.tuning.runner import tune_plan
    from moepolicy.tuning.space import load_objective, load_space

    class Flat(Bench):
        rng = random.Random(0)

        def measure(self, workload, point):
            us = 500.0 * (20 / point.num_sms) * math.exp(self.rng.gauss(0, 0.02))
            return Measurement(us, us * 0.8, 100.0, "measured", {})

    plan = make_plan(
        read_model("Qwen3-30B-A3B-FP8", hub=False),
        resolve_target(TargetSpec(gpu="h200", ep_size=2, expert_kernel="deepgemm"), probe=False),
        pack_stack(),
    )
    folder = tmp_path_factory.mktemp("live")
    options = TuneOptions(
        buckets=((1024, 1.0), (4096, 1.0)),
        trials=2,
        sms=(20, 32),
        storage=f"sqlite:///{folder}/s.db",
        confirm_rounds=9,
    )
    return tune_plan(plan, Flat(), options, load_space(), load_objective())


def test_a_live_tunes_evidence_is_what_the_document_defines_written_as_given(live_tune):
    kept = live_tune.deepep
    assert kept.evidence and all("measured" in e and "search" in e for e in kept.evidence)
    for evidence in kept.evidence:
        assert _as_typed(MeasuredDoc, evidence["measured"]) == list(evidence["measured"].items())
        assert _as_typed(SearchDoc, evidence["search"]) == list(evidence["search"].items())
    assert _as_typed(ProvenanceDoc, kept.provenance) == list(kept.provenance.items())


def test_a_figure_keeps_its_type_and_a_block_its_order():
    """An int the tuner wrote stays an int (the YAML text unchanged); the keys in the order given."""
    plain = {"default_us": 7, "num_sms": 20, "best_us": 100, "note": "n", "trials": 1}
    typed = SearchDoc.model_validate(plain)
    assert list(typed.model_dump(exclude_unset=True).items()) == list(plain.items())
    assert isinstance(typed.best_us, int) and typed.model_dump(mode="json")["best_us"] == 100


def test_the_forms_of_measured_are_told_apart_and_named_as_the_locations_know_them():
    chunks = yaml.safe_load(MEASURED_21.read_text())["deepep"]["buckets"][0]
    bucket = {"dispatch": chunks["dispatch"], "combine": chunks["combine"]}
    row = BucketDoc.model_validate({**bucket, "measured": {"overlapped_us": 500.0}})
    serial = BucketDoc.model_validate({**bucket, "measured": {"kept": "default"}})
    assert isinstance(row.measured, OverlapRowDoc) and isinstance(serial.measured, MeasuredDoc)
    assert UNION_TAGS == (MeasuredDoc.__name__, OverlapRowDoc.__name__)


def _edited(path_in_deepep, value):
    """The 2.1 measured policy with one evidence field set by hand (its keys recomputed)."""
    doc = yaml.safe_load(MEASURED_21.read_text())
    node = doc["deepep"]
    for part in path_in_deepep[:-1]:
        node = node[part]
    node[path_in_deepep[-1]] = value
    doc["key"] = compute_keys(doc)
    return yaml.safe_dump(doc, sort_keys=False)


@pytest.mark.parametrize(
    "where, value, said",
    [
        (
            ("buckets", 0, "measured", "confirm", "vs_engine", "speedup"),
            "fast",
            "deepep.buckets[0].measured.confirm.vs_engine.speedup: Input should be a number "
            "above 0, got 'fast'",
        ),
        (
            ("buckets", 1, "measured", "confirm", "median_us", "kept"),
            0,
            "deepep.buckets[1].measured.confirm.median_us.kept: Input should be a number above 0, "
            "got 0",
        ),
        (
            ("provenance", "scan", 2, "tokens"),
            "many",
            "deepep.provenance.scan[2].tokens: Input should be a valid integer, unable to parse "
            "string as an integer, got 'many'",
        ),
        (
            ("buckets", 0, "measured"),
            {"overlapped_us": -3.0},
            "deepep.buckets[0].measured.overlapped_us: Input should be a number above 0, got -3.0",
        ),
        (
            ("overlap",),
            {"comm_sms": True},
            "deepep.overlap.comm_sms: Input should be a valid integer, got True",
        ),
    ],
)
def test_a_hand_edited_evidence_block_that_does_not_fit_is_refused_in_one_line(where, value, said):
    text = _edited(where, value)
    with pytest.raises(PolicyError) as full:
        parse_policy(text, "p.yaml")
    assert str(full.value) == f"p.yaml: {said}"
    with pytest.raises(PolicyError) as light:  # the runtime's reader refuses it at the same place
        parse_policy_light(text, "p.yaml")
    place = said.split(":")[0]
    assert str(light.value).startswith(f"p.yaml: {place}: ") and "\n" not in str(light.value)


def test_evidence_a_reader_does_not_know_is_kept_without_a_word():
    text = _edited(("buckets", 0, "measured", "confirm", "newer"), {"p50_us": 1.0})
    loaded = parse_policy(text, "p.yaml", strict=True)
    assert loaded.warnings == ()
    confirm = loaded.doc.deepep.buckets[0].measured.confirm
    assert confirm.model_extra == {"newer": {"p50_us": 1.0}}
    assert parse_policy_light(text, "p.yaml", strict=True).warnings == ()


def test_audit_renders_a_21_measured_policy_from_its_typed_evidence():
    lines = deepep_lines(read_policy(MEASURED_21).doc.deepep)
    assert (
        "    search (selected minima, not a claim): dispatch 205.94 us, combine 100.0 us" in lines
    )
    assert any(
        line.startswith("    vs the engine's default: x1.960 faster, beyond noise (95% CI")
        and line.endswith("7 rounds; schema 2.1: the rounds that also decided)")
        for line in lines
    ), lines


def test_audit_renders_a_live_tunes_report_rounds(live_tune):
    from moepolicy.api import policy_document
    from moepolicy.document.yaml_io import dumps

    doc = parse_policy(dumps(policy_document(live_tune)), "p.yaml").doc
    lines = deepep_lines(doc.deepep)
    assert any(line.startswith("    report rounds (9, fresh workers") for line in lines), lines
    assert any(line.startswith("    kept ") and " SMs: " in line for line in lines)
    assert any(
        line.startswith("    search (selected minima, not a claim): best ") for line in lines
    )


def _overlap_deepep(row: dict) -> DeepEPDoc:
    deepep = yaml.safe_load(MEASURED_21.read_text())["deepep"]
    for bucket in deepep["buckets"]:
        bucket["measured"] = row
    deepep["overlap"] = {"comm_sms": 24, "gemm_sms": 108, "gemm": "persistent", "why": "w"}
    return DeepEPDoc.model_validate(deepep)


def test_audit_renders_an_overlap_tunes_rows_and_split():
    from moepolicy.tuning.overlap_report import OverlapBucketRow, SplitTimes

    row = OverlapBucketRow(
        "gemm-first",
        9,
        SplitTimes(900.0, (880.0, 950.0), 600.0, 800.0, gemm_sms=108),
        1400.0,
        "full",
        vllm=SplitTimes(1000.0, (990.0, 1050.0), 650.0, 850.0, gemm_sms=112),
    ).to_doc()
    assert _as_typed(OverlapRowDoc, row) == list(row.items())
    lines = deepep_lines(_overlap_deepep(row))
    assert (
        "  overlap split: 24 communication SMs, expert GEMM on 108, chosen for the gemm-first launch order"
        in lines
    )
    assert (
        "    overlapped 900.0 us [880.0, 950.0], medians of 9 the rounds that chose the split (gemm-first launch order)"
        in lines
    )
    assert any(
        line.startswith("    vs its floor max(comm alone, GEMM alone) = 800.0 us")
        for line in lines
    )
    assert _as_typed(OverlapDoc, {"comm_sms": 24, "splits_us": {20: 10, 24: 9.5}})


def test_an_overlap_row_of_the_oldest_form_renders_without_the_figures_it_lacks():
    """A row with neither time alone (the oldest form) has no floor to compare with: the line is
    left out, nothing else."""
    lines = deepep_lines(_overlap_deepep({"overlapped_us": 900.0, "rounds": 5}))
    assert any(line.startswith("    overlapped 900.0 us") for line in lines)
    assert not any("vs its floor" in line for line in lines)
