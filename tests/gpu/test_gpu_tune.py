"""The live tuner end to end on real DeepEP at EP 2 and EP 8: search -> selection in fresh workers ->
report in fresh workers -> a policy. With a GPU per rank it is a measured tune, and the policy
records what the report rounds measured of the config it keeps; where fewer GPUs are visible the
ranks share them (the test-only switch MOEPOLICY_FUNCTIONAL_SHARED_RANKS=1): the protocol still runs
on real rounds, the output says it is functional only and the policy is marked not for serving."""

import pytest
import yaml

from gpu_support import gpu_here, moepolicy_cli, ranks_env, require

pytestmark = pytest.mark.gpu


def _tune(tmp_path, world: int, env: dict, *extra):
    out = tmp_path / "policy.yaml"
    done = moepolicy_cli(
        [
            "tune",
            "--model",
            "Qwen3-30B-A3B-FP8",
            "--ep-size",
            world,
            "--gpu",
            gpu_here(),
            "--bench",
            "live",
            "--sms",
            "20,24",
            "--tokens",
            "512,4096",
            "--trials",
            "3",
            "--confirm-rounds",
            "9",  # the least the protocol runs: 8 ranks time-slicing one GPU are slow
            "--storage",
            f"sqlite:///{tmp_path}/s.db",
            "-o",
            out,
            *extra,
        ],
        env,
        world,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out, done


@pytest.mark.parametrize("world", [2, 8], ids=lambda w: f"ep{w}")
def test_a_live_tune_runs_the_whole_protocol(tmp_path, world):
    require(1, need_deep_ep=True)
    pytest.importorskip("optuna")
    env, shared = ranks_env(world)
    out, done = _tune(tmp_path, world, env)
    assert "re-measuring" in done.stderr  # the protocol's selection and report ran
    if shared:
        _check_functional(out, done, env, world)
    else:
        _check_measured(out, done)


def _check_measured(out, done) -> None:
    """A GPU per rank: measured, with the report rounds of what was kept and the search apart."""
    assert "functional only" not in done.stderr
    deepep = yaml.safe_load(out.read_text())["deepep"]
    assert deepep.get("partial") is None
    assert (
        deepep["provenance"]["source"] == "measured"
        and deepep["provenance"]["protocol"]["rounds"] == 9
    )
    for bucket in deepep["buckets"]:
        report = bucket["measured"]["report"]
        assert report["rounds"] == 9 and report["median_us"]["kept"] > 0
        assert bucket["measured"]["num_sms"] == deepep["num_sms"]
        assert bucket["search"]["note"].startswith("selected minima")
    for timing in deepep.get("measured_orders") or ():  # fp8 payload: both orders with their test
        assert (
            timing["rounds"] == 9
            and len(timing["ci95"]) == 2
            and timing["faster"] in ("quant_then_dispatch", "dispatch_then_quant", "neither")
        )


def _check_functional(out, done, env: dict, world: int) -> None:
    """Ranks sharing a GPU: labelled, marked not for serving, refused by validate."""
    from moepolicy import load_policy
    from moepolicy.document.reader import read_policy

    assert "ranks share a GPU: functional only" in done.stderr
    doc = read_policy(out).doc
    assert doc.deepep.partial is not None and "functional run" in doc.deepep.partial.reason
    policy = load_policy(out, ep_size=world)
    assert policy.is_fallback and policy.deepep.is_default  # never served with these configs
    check = moepolicy_cli(["validate", out], env, world)
    assert check.returncode == 6 and "functional run" in check.stderr


def test_an_ep_size_below_the_gpu_count_tunes_on_that_many_gpus(tmp_path):
    """EP 2 on a host with more GPUs: a GPU per rank on the first two (skipped with fewer)."""
    require(3, need_deep_ep=True)
    pytest.importorskip("optuna")
    env, _ = ranks_env(2)
    out, done = _tune(tmp_path, 2, env, "--trials", "2")
    assert "functional only" not in done.stderr
    assert yaml.safe_load(out.read_text())["deepep"]["provenance"]["source"] == "measured"
