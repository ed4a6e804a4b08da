"""``validate --live``'s plan and checks, on CPUs: the emulated all-to-all stands in for DeepEP, and
links that corrupt a byte or hang show that the checks catch what they are for. DeepEP itself runs
in tests/gpu/test_gpu_preflight.py."""

import pytest

torch = pytest.importorskip(
    "torch", reason="the emulated all-to-all needs torch (the CPU build is enough)"
)

from conftest import run_cli  # noqa: E402
from moepolicy.measure.placement import RankPlacement  # noqa: E402


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    path = tmp_path_factory.mktemp("preflight") / "qwen.yaml"
    done = run_cli(
        "plan", "--model", "Qwen3-30B-A3B-FP8", "--ep-size", "2", "--gpu", "h200", "-o", str(path)
    )
    assert done.returncode == 0, done.stderr
    return str(path)


def small(plan):
    """The same plan with fewer tokens (the checks do not depend on the count; CPUs are slow)."""
    from dataclasses import replace

    return replace(plan, cases=tuple(replace(c, tokens=min(c.tokens, 48)) for c in plan.cases))


def test_the_plan_holds_every_bucket_and_every_wire_format_the_layers_send(policy):
    from moepolicy.document.reader import read_policy
    from moepolicy.preflight import plan_preflight

    plan = plan_preflight(policy)
    doc = read_policy(policy).doc
    assert (
        plan.ep_size == 2
        and plan.hidden == doc.model.hidden_size
        and plan.num_experts == doc.model.num_experts
    )
    assert plan.num_nvl_bytes == doc.deepep.num_nvl_bytes and plan.num_sms == doc.deepep.num_sms
    assert len(plan.cases) == len(doc.deepep.buckets)
    names = [f.name for f in plan.formats]
    assert names[0] == "bf16"
    sent = {
        (layer.wire.dtype, layer.wire.scale.granularity if layer.wire.scale else None)
        for layer in doc.layers
        if layer.kind == "moe"
    }
    if ("fp8_e4m3", "block") in sent:
        assert "fp8 block-128 + float32" in names


def test_every_case_passes_on_the_emulated_transport(policy):
    from moepolicy.preflight import describe_failure, plan_preflight, render, run_preflight
    from moepolicy.preflight.rank import EmulatedLink

    plan = small(plan_preflight(policy))
    (report,) = run_preflight([plan], RankPlacement(2, 2), step_timeout_s=120, link=EmulatedLink())
    assert report.ok, (report.error, report.rows)
    assert len(report.rows) == len(plan.cases) * (
        len(plan.formats) + 1
    )  # every format, and combine
    assert describe_failure(report) is None
    assert any("combine" in line for line in render(report))


def test_a_flipped_byte_fails_its_case_and_names_the_rank(policy):
    from moepolicy.preflight import describe_failure, plan_preflight, run_preflight
    from moepolicy.testing.preflight_links import CorruptingLink

    plan = small(plan_preflight(policy))
    (report,) = run_preflight(
        [plan], RankPlacement(2, 2), step_timeout_s=120, link=CorruptingLink()
    )
    assert not report.ok
    failed = [r for r in report.rows if r.status == "failed"]
    assert failed and all("rank 1" in r.detail for r in failed), report.rows
    assert "rows differ" in failed[0].detail
    assert "case(s) failed" in describe_failure(report)


def test_a_hung_rank_ends_the_run_with_the_step_it_hung_at(policy):
    from moepolicy.preflight import describe_failure, plan_preflight, run_preflight
    from moepolicy.testing.preflight_links import HangingLink

    plan = small(plan_preflight(policy))
    (report,) = run_preflight([plan], RankPlacement(2, 2), step_timeout_s=20, link=HangingLink())
    assert not report.ok and "no progress within 20 s" in report.error, report.error
    assert "bucket" in report.error  # the step it was at
    assert "failed" in describe_failure(report)


def test_ranks_are_placed_round_robin_and_shared_ranks_are_labelled():
    from moepolicy.measure.placement import SHARED_LABEL

    alone = RankPlacement(4, 8)
    assert (
        not alone.shared
        and alone.backend == "nccl"
        and [alone.device_index(r) for r in range(4)] == [0, 1, 2, 3]
    )
    shared = RankPlacement(8, 1)
    assert (
        shared.shared
        and shared.backend == "gloo"
        and {shared.device_index(r) for r in range(8)} == {0}
    )
    assert SHARED_LABEL in shared.describe()
    two = RankPlacement(4, 2)
    assert [two.device_index(r) for r in range(4)] == [0, 1, 0, 1]
    with pytest.raises(ValueError):
        RankPlacement(2, 0)


def test_validate_live_without_gpus_says_so_in_one_line(policy):
    done = run_cli("validate", policy, "--live")
    assert done.returncode == 9, done.stderr  # nothing to measure on: not a usage error
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith("moepolicy: --live runs DeepEP on CUDA GPUs")
    )


def test_several_policies_of_one_ep_size_run_in_one_group(policy, tmp_path):
    from moepolicy.preflight import plan_preflight, run_preflight
    from moepolicy.preflight.rank import EmulatedLink

    other = tmp_path / "ds.yaml"
    done = run_cli(
        "plan", "--model", "DeepSeek-V3", "--ep-size", "2", "--gpu", "h200", "-o", str(other)
    )
    assert done.returncode == 0, done.stderr
    plans = [small(plan_preflight(policy)), small(plan_preflight(str(other)))]
    reports = run_preflight(plans, RankPlacement(2, 2), step_timeout_s=120, link=EmulatedLink())
    assert [r.ok for r in reports] == [True, True], [(r.error, r.rows) for r in reports]
    assert reports[1].plan.hidden == 7168 and reports[0].plan.hidden == 2048


def test_each_policys_report_is_seen_as_soon_as_it_is_done(policy):
    from moepolicy.preflight import plan_preflight, run_preflight
    from moepolicy.preflight.rank import EmulatedLink

    plans = [small(plan_preflight(policy))] * 2
    seen = []
    reports = run_preflight(
        plans, RankPlacement(2, 2), step_timeout_s=120, link=EmulatedLink(), on_report=seen.append
    )
    assert seen == reports and all(r.ok for r in seen)
