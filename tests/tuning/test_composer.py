"""A tune returns what it kept (``deepep.kept.KeptDeepEP``); one composer (``api.policy_document``,
through ``document.compose.build_document``) turns the plan and it into the document, entering the
planner at most twice along the way (the tuner itself composes nothing)."""

import sys

import pytest

pytest.importorskip("optuna", reason="tuning needs optuna")

import moepolicy.document.compose as compose  # noqa: E402
import moepolicy.planner as planner  # noqa: E402
from moepolicy.checkpoint.reader import read_model  # noqa: E402
from moepolicy.deepep.configs import default_configs  # noqa: E402
from moepolicy.deepep.kept import KeptDeepEP  # noqa: E402
from moepolicy.document.deepep_section import chunk_doc  # noqa: E402
from moepolicy.rules.packs import pack_stack  # noqa: E402
from moepolicy.target import TargetSpec, resolve_target  # noqa: E402
from moepolicy.api import policy_document  # noqa: E402
from moepolicy.tuning.model_bench import ModelBench  # noqa: E402
from moepolicy.tuning.options import TuneOptions  # noqa: E402
from moepolicy.tuning.runner import tune_plan  # noqa: E402
from moepolicy.tuning.space import load_objective, load_space  # noqa: E402

PLANNER = vars(planner)  # a frame runs planner.py's code where its globals are the module's


def _plan(model: str, ep: int):
    target = resolve_target(TargetSpec(gpu="h200", ep_size=ep), probe=False)
    return planner.make_plan(read_model(model, hub=False), target, pack_stack())


def _planner_entries(run) -> list[str]:
    """The planner's functions called from outside planner.py while ``run`` runs."""
    entries = []

    def profile(frame, event, arg):  # called for every Python call: kept cheap (no path work)
        if event == "call" and frame.f_globals is PLANNER:
            caller = frame.f_back
            if caller is None or caller.f_globals is not PLANNER:
                entries.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        result = run()
    finally:
        sys.setprofile(None)
    return entries, result


@pytest.mark.parametrize(
    "model, ep", [("Qwen3-30B-A3B-FP8", 2), ("DeepSeek-V3", 8)]
)  # tuned; extrapolated
def test_a_tune_enters_the_planner_at_most_twice_and_returns_what_it_kept(tmp_path, model, ep):
    plan = _plan(model, ep)
    options = TuneOptions(
        buckets=((1024, 1.0), (4096, 1.0)), trials=2, storage=f"sqlite:///{tmp_path}/s.db"
    )

    def tune_and_compose():
        result = tune_plan(plan, ModelBench("h200"), options, load_space(), load_objective())
        return result, policy_document(result)

    entries, (result, document) = _planner_entries(tune_and_compose)
    entries = [
        name for name in entries if name != "kernel_label"
    ]  # a property read, not a call into it
    assert len(entries) <= 2, entries
    assert isinstance(result.deepep, KeptDeepEP)
    section = document["deepep"]
    assert section["num_sms"] == result.deepep.num_sms == result.num_sms
    assert [b["max_tokens"] for b in section["buckets"]] == [
        b.max_tokens for b in result.deepep.buckets
    ]
    assert [b["dispatch"] for b in section["buckets"]] == [
        chunk_doc(b.dispatch) for b in result.deepep.buckets
    ]
    assert section["provenance"]["source"] == result.label


def test_a_plan_writes_deepeps_defaults_through_the_same_builder():
    plan = _plan("Qwen3-30B-A3B-FP8", 2)
    section = compose.build_document(plan)["deepep"]
    dispatch, combine = default_configs(plan.target.deepep, 2)
    assert section["buckets"] == [
        {"max_tokens": None, "dispatch": chunk_doc(dispatch), "combine": chunk_doc(combine)}
    ]
    assert section["provenance"]["source"] == "default" and section["schedule"] == "serial"
    assert section["num_nvl_bytes"] > 0


def test_the_buckets_a_tune_keeps_are_what_the_runtime_loads(tmp_path):
    """One bucket type from the tuner to the plugin: the document, its YAML and the loader hand the
    kept ``Bucket`` values back unchanged (with DeepEP's effective RDMA receive capacity)."""
    from moepolicy.deepep.settings import Bucket
    from moepolicy.document.yaml_io import write_document
    from moepolicy.runtime import load_policy

    plan = _plan("Qwen3-30B-A3B-FP8", 2)
    options = TuneOptions(
        buckets=((128, 1.0), (4096, 1.0)), trials=2, storage=f"sqlite:///{tmp_path}/s.db"
    )
    result = tune_plan(plan, ModelBench("h200"), options, load_space(), load_objective())
    write_document(policy_document(result), tmp_path / "p.yaml")
    policy = load_policy(tmp_path / "p.yaml", ep_size=2, strict=True)
    kept = tuple(
        Bucket(b.max_tokens, b.dispatch.effective(), b.combine.effective())
        for b in result.deepep.buckets
    )
    assert policy.deepep.buckets == kept and all(type(b) is Bucket for b in policy.deepep.buckets)
    assert policy.deepep.num_sms == result.deepep.settings.num_sms


def test_a_section_the_builder_cannot_write_is_named_by_its_place_in_one_line():
    """The builder checks each section against the document's model: a value that does not fit
    (a moepolicy bug) is refused before anything is written, naming where in the document."""
    import dataclasses

    from moepolicy.errors import PolicyError

    plan = _plan("Qwen3-30B-A3B-FP8", 2)
    odd = dataclasses.replace(compose.default_deepep(plan), num_sms=21)  # DeepEP takes even counts
    with pytest.raises(PolicyError, match=r"at deepep\.num_sms: ") as info:
        compose.build_document(plan, odd)
    assert "\n" not in str(info.value) and "please report it" in str(info.value)


_SEARCH = {"note": "", "num_sms": 20, "best_us": 100.0}
_FIGURE = {"contender": "kept", "baseline": "the engine's default", "rounds": 9, "speedup": 1.1}


@pytest.mark.parametrize(
    "change, where, seen",
    [
        (
            {"provenance": {"source": "default", "nte": "a typo"}},
            r"deepep\.provenance\.nte",
            "'a typo'",
        ),
        (
            {"evidence": ({"mesured": {"p50_us": 1.0}},)},
            r"deepep\.buckets\[0\]\.mesured",
            "{'p50_us': 1.0}",
        ),
        (
            {"evidence": ({"search": {**_SEARCH, "bset_us": 99.0}},)},
            r"deepep\.buckets\[0\]\.search\.bset_us",
            "99.0",
        ),
        (
            {
                "evidence": (
                    {"measured": {"report": {"rounds": 9, "median_us": {}, "vs_engin": _FIGURE}}},
                )
            },
            r"deepep\.buckets\[0\]\.measured\.report\.vs_engin",
            r"\{'contender'",
        ),
        (
            {"overlap": {"comm_sms": 24, "gate": {"why": "", "loses": {}}}},
            r"deepep\.overlap\.gate\.loses",
            r"\{\}",
        ),
        (
            {"provenance": {"source": "measured", "protocol": {"gate": {"smss": None}}}},
            r"deepep\.provenance\.protocol\.gate\.smss",
            "None",
        ),
        (
            {
                "provenance": {
                    "source": "measured",
                    "v2": {"report": {"128": {"median_us": {}, "vs_defualt": None}}},
                }
            },
            r"deepep\.provenance\.v2\.report\.128\.vs_defualt",
            "None",
        ),
    ],
)
def test_a_misspelled_provenance_or_evidence_key_is_refused_on_write_and_read_on_load(
    change, where, seen
):
    """The builder refuses a key the document does not define, at any level of the evidence (a
    writer's typo, in the tuner's provenance, a bucket's evidence or the overlap split), in one line
    naming the field and its value; a reader still takes it (a newer writer's)."""
    import dataclasses

    from moepolicy.document.model import PolicyDoc, unknown_keys
    from moepolicy.errors import PolicyError

    plan = _plan("Qwen3-30B-A3B-FP8", 2)
    typo = dataclasses.replace(compose.default_deepep(plan), **change)
    with pytest.raises(PolicyError, match=f"does not define: {where} = {seen}") as info:
        compose.build_document(plan, typo)
    assert "\n" not in str(info.value) and "please report it" in str(info.value)
    doc = compose.build_document(plan)
    doc["deepep"]["provenance"]["newer"] = "a detail"
    doc["deepep"]["buckets"][0]["newer"] = {"p50_us": 1.0}
    assert unknown_keys(PolicyDoc.model_validate(doc)) == ["deepep.buckets[0].newer"]
