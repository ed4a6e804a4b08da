"""Which bench a tune uses: the live bench needs a GPU per EP rank; ranks that share a GPU are refused
with what to run instead, except as the test-only functional run (whose policy is not for serving)."""

import pytest

from moepolicy.errors import InfeasibleError, TuningError
from moepolicy.measure import ranks
from moepolicy.tuning import bench_source, live_bench
from moepolicy.tuning.bench_source import SHARED_RANKS_ENV, BenchSource


@pytest.fixture
def machine(monkeypatch):
    """This process's view of the machine: ``gpus`` visible, deep_ep importable or not, and what
    the peer-link probe answers for a pair of GPUs (NVLink between every pair unless ``links``)."""

    def set_machine(gpus: int, deep_ep: bool = True, links=None):
        monkeypatch.setattr(live_bench, "visible_gpus", lambda: gpus)
        monkeypatch.setattr(
            live_bench,
            "deep_ep_importable",
            lambda: None if deep_ep else "no module named deep_ep",
        )
        answer = {**(links or {})}
        monkeypatch.setattr(
            ranks,
            "probe_peer_links",
            lambda devices: {
                (a, b): answer.get((a, b), ranks.PeerLink(True, True))
                for i, a in enumerate(devices)
                for b in devices[i + 1 :]
            },
        )

    monkeypatch.delenv(SHARED_RANKS_ENV, raising=False)
    return set_machine


def test_one_gpu_live_is_refused_with_why_and_what_to_run_instead(machine):
    machine(1)
    with pytest.raises(TuningError) as info:
        BenchSource().choose("live")
    message = str(info.value)
    assert "cannot measure communication" in message
    assert "--bench model" in message and "validate POLICY --live" in message


def test_fewer_gpus_than_the_ep_size_is_refused_too(machine):
    machine(2)
    with pytest.raises(TuningError, match="for EP 8"):
        BenchSource().choose("live", 8)


def test_the_functional_switch_runs_shared_ranks_and_says_so(machine, monkeypatch):
    machine(1)
    monkeypatch.setenv(SHARED_RANKS_ENV, "1")
    choice = BenchSource().choose("live", 8)
    assert choice.kind == "live" and choice.ranks == 8 and choice.shared
    assert "not for serving" in choice.why
    with pytest.raises(TuningError):  # the switch needs the EP size to place ranks on
        BenchSource().choose("live")


def test_a_functional_run_times_with_few_repetitions_and_a_real_one_with_all(machine, monkeypatch):
    machine(1)
    monkeypatch.setenv(SHARED_RANKS_ENV, "1")
    shared = BenchSource().choose("live", 8)
    bench = BenchSource().build(shared, "h200", 1 << 28, 60.0, 20)
    assert bench.world == 8 and bench.reps == bench_source.FUNCTIONAL_REPS < 20
    assert f"{bench_source.FUNCTIONAL_REPS} repetitions" in shared.why
    machine(2)
    monkeypatch.delenv(SHARED_RANKS_ENV)
    assert (
        BenchSource().build(BenchSource().choose("live", 2), "h200", 1 << 28, 60.0, 20).reps == 20
    )


def test_a_gpu_per_rank_is_the_ordinary_live_bench(machine):
    machine(2)
    choice = BenchSource().choose("live", 2)
    assert (choice.kind, choice.ranks, choice.shared) == ("live", 2, False)
    assert BenchSource().choose(None).kind == "live"


@pytest.mark.parametrize("gpus, ep_size", [(4, 2), (8, 2), (8, 4)], ids=lambda n: str(n))
def test_an_ep_size_below_the_gpu_count_tunes_live_on_a_gpu_per_rank(machine, gpus, ep_size):
    """On a 4- or 8-GPU host EP 2 or 4 runs on that many of the GPUs, one each, as bench and
    validate --live do; the tune that follows is not refused either."""
    from moepolicy.api import check_bench_fits

    machine(gpus)
    for asked in ("live", None):
        choice = BenchSource().choose(asked, ep_size)
        assert (choice.kind, choice.ranks, choice.shared) == ("live", ep_size, False)
        check_bench_fits(choice, ep_size)
    assert BenchSource().build(choice, "h200", 1 << 28, 60.0, 20).world == ep_size
    with pytest.raises(TuningError, match=f"{gpus} GPU\\(s\\) visible for EP 16"):
        BenchSource().choose("live", 16)
    assert BenchSource().choose(None, 16).kind == "model"


def test_gpus_without_peer_access_are_refused_before_any_worker_starts(machine):
    machine(8, links={(0, 1): ranks.PeerLink(False)})
    choice = BenchSource().choose("live", 4)
    with pytest.raises(InfeasibleError, match="^GPUs 0 and 1 have no peer access"):
        BenchSource().build(choice, "h200", 1 << 28, 60.0, 20)
    machine(8, links={(0, 1): ranks.PeerLink(True, False)})  # PCIe: EP 2 runs, EP 4 does not
    BenchSource().build(BenchSource().choose("live", 2), "h200", 1 << 28, 60.0, 20)
    with pytest.raises(InfeasibleError, match="^GPUs 0 and 1 are joined by PCIe"):
        BenchSource().build_v2(choice, 60.0, 20)


def test_torchrun_ranks_get_a_gpu_each_or_share_one_only_as_the_functional_run(
    machine, monkeypatch
):
    machine(8)
    placement = BenchSource.torchrun_placement(8)
    assert (placement.shared, placement.backend, placement.device_index(7)) == (False, "nccl", 7)
    machine(1)
    with pytest.raises(TuningError, match="1 GPU\\(s\\) visible for 2 ranks on this node"):
        BenchSource.torchrun_placement(2)
    monkeypatch.setenv(SHARED_RANKS_ENV, "1")
    shared = BenchSource.torchrun_placement(2)
    assert (shared.shared, shared.backend, shared.device_index(1)) == (True, "gloo", 0)
    machine(4, links={(2, 3): ranks.PeerLink(False)})
    with pytest.raises(InfeasibleError, match="^GPUs 2 and 3 have no peer access"):
        BenchSource.torchrun_placement(4)


def test_without_deep_ep_or_gpus_the_default_is_the_model_bench(machine):
    machine(1)
    assert BenchSource().choose(None).kind == "model"
    machine(0, deep_ep=False)
    assert BenchSource().choose(None).kind == "model"
    with pytest.raises(TuningError, match="CUDA GPUs"):
        BenchSource().choose("live")
    machine(2, deep_ep=False)
    with pytest.raises(TuningError, match="DeepEP"):
        BenchSource().choose("live")


def test_the_functional_policy_is_marked_not_for_serving(tmp_path):
    """A shared-ranks result is composed marked partial (keys as the composer computes them):
    validate refuses it and serving uses DeepEP's defaults for it."""
    pytest.importorskip("optuna")
    from conftest import run_cli
    from moepolicy import load_policy
    from moepolicy.api import policy_document, tune_with, write_policy
    from moepolicy.checkpoint.reader import read_model
    from moepolicy.document.reader import read_policy
    from moepolicy.planner import make_plan
    from moepolicy.rules.packs import pack_stack
    from moepolicy.target import TargetSpec, resolve_target
    from moepolicy.tuning.model_bench import ModelBench
    from moepolicy.tuning.options import TuneOptions
    from moepolicy.tuning.runner import tune_plan
    from moepolicy.tuning.space import load_objective, load_space

    target = resolve_target(TargetSpec(gpu="h200", ep_size=2), probe=False)
    plan = make_plan(read_model("Qwen3-30B-A3B-FP8", hub=False), target, pack_stack())
    options = TuneOptions(buckets=((1024, 1.0),), trials=2, storage=f"sqlite:///{tmp_path}/s.db")
    result = tune_plan(plan, ModelBench("h200"), options, load_space(), load_objective())
    assert policy_document(result)["deepep"].get("partial") is None
    shared = bench_source.BenchChoice("live", "2 ranks on 1 GPU(s)", 2, shared=True)
    # the library's tune marks it, not only the CLI (a stand-in bench in place of the shared ranks)
    marked = tune_with(
        plan, shared, options, load_objective(), load_space(), bench=ModelBench("h200")
    )
    path = tmp_path / "p.yaml"
    write_policy(marked, path)
    assert "functional run" in read_policy(path).doc.deepep.partial.reason
    policy = load_policy(path, ep_size=2)
    assert policy.is_fallback and policy.deepep.is_default
    done = run_cli("validate", str(path))
    assert done.returncode == 6 and "functional run" in done.stderr


def test_a_functional_result_never_replaces_a_complete_policy(tmp_path):
    import types

    from conftest import run_cli
    from moepolicy.cli.tune import _output_for

    path = tmp_path / "p.yaml"
    done = run_cli("plan", "--model", "Qwen3-30B-A3B-FP8", "--ep-size", "2", "-o", str(path))
    assert done.returncode == 0, done.stderr
    functional = types.SimpleNamespace(
        interrupted=False, deepep=types.SimpleNamespace(partial="functional run, ...")
    )
    assert _output_for(functional, str(path)) == str(tmp_path / "p.partial.yaml")
    complete = types.SimpleNamespace(interrupted=False, deepep=types.SimpleNamespace(partial=None))
    assert _output_for(complete, str(path)) == str(path)
