"""``moepolicy bench --transport deepep`` at EP 2 on real DeepEP: with a GPU per rank the three arms
are timed and compared (the headline's command); where one GPU is visible DeepEP's ranks share it,
the arms run end to end and nothing is compared (a functional run says so and prints no times)."""

import json

import pytest

from conftest import run_cli
from gpu_support import gpu_here, moepolicy_cli, ranks_env, require

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("regime", ["policy's", "runahead"])
def test_bench_runs_every_arm_and_compares_only_with_a_gpu_per_rank(tmp_path, regime):
    require(1, need_deep_ep=True)
    env, shared = ranks_env(2)
    policy = tmp_path / "q.yaml"
    assert (
        run_cli(
            "plan",
            "--model",
            "Qwen3-30B-A3B-FP8",
            "--ep-size",
            "2",
            "--gpu",
            gpu_here(),
            "--expert-kernel",
            "deepgemm",
            "-o",
            str(policy),
        ).returncode
        == 0
    )
    # DeepGEMM experts take fp8 sent first, as vLLM's do: the arms make the same choices, and bench
    # times them only as an A/A check (without --null it says there is nothing to compare)
    args = ["bench", policy, "--null", "--transport", "deepep", "--tokens", "128"]
    args += ["--routing", "uniform"]
    args += ["--rounds", "9", "--reps", "3", "--watchdog", "300", "-o", tmp_path / "bench.json"]
    done = moepolicy_cli(args + (["--regime", regime] if regime == "runahead" else []), env, 2)
    assert done.returncode == 0, done.stderr
    asked = "host" if regime == "policy's" else regime
    assert f"{asked} regime" in done.stderr
    raw = json.loads((tmp_path / "bench.json").read_text())
    # the real expert stage runs between dispatch and combine, at the model's shapes, and is named
    assert "the expert stage is DeepGEMM's" in done.stderr and "stand-in" not in done.stderr
    assert raw["spec"]["experts"] == "deepgemm" and raw["spec"]["intermediate"] == 768
    assert raw["spec"]["regime"] == asked and all(
        len(xs) == 9 and min(xs) > 0 for xs in raw["times_us"]["uniform"]["128"].values()
    )
    if shared:
        assert "ranks share a GPU: functional only" in done.stderr
        assert done.stdout.startswith("plumbing ok") and raw["comparison"] == []
        assert "faster" not in done.stdout and "slower" not in done.stdout
    else:  # one row per routing and bucket, each baseline compared under Holm's correction
        assert "functional only" not in done.stderr and "policy us" in done.stdout
        (row,) = raw["comparison"]
        assert {"vs_vllm", "vs_deepep-default"} <= set(row) and row["median_us"]["policy"] > 0


def test_the_steps_own_work_never_makes_the_host_wait():
    """What ``bench`` runs around DeepEP (quantizing in every format, the expert stand-in) makes no
    host sync, so under ``--regime runahead`` the host waits only where DeepEP's dispatch does."""
    require(1)
    import warnings

    import torch

    from moepolicy.moe_step.measure import StandInExperts
    from moepolicy.reference.prepare_finalize import QuantSpec, quantize

    device = torch.device("cuda", 0)
    g = torch.Generator().manual_seed(0)
    local, hidden, rows, top_k = 8, 2048, 1024, 4
    experts = StandInExperts(local, hidden, 682, device, torch.bfloat16)
    x = torch.randn(rows, hidden, generator=g).to(device, torch.bfloat16)
    idx = torch.randint(-1, local, (rows, top_k), generator=g)
    counts = [int((idx == e).sum()) for e in range(local)]
    idx, weights = idx.to(device), torch.rand(rows, top_k, generator=g).to(device)
    specs = [
        QuantSpec("block"),
        QuantSpec("block", ue8m0=True),
        QuantSpec("token"),
        QuantSpec("tensor_static", static_scale=0.05),
        QuantSpec("tensor_dynamic"),
        QuantSpec("none"),
    ]
    for spec in specs:  # compile and warm up outside the check
        q, s = quantize(x, spec)
        experts(q, s, idx, weights, counts)
    torch.cuda.synchronize()
    synced = {}
    for spec in specs:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                q, s = quantize(x, spec)
                experts(q, s, idx, weights, counts)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        synced[spec.kind + ("-ue8m0" if spec.ue8m0 else "")] = [
            str(w.message)[:120] for w in caught if "prototype feature" not in str(w.message)
        ]  # torch's one-time notice that the mode is a prototype is not a sync
    torch.cuda.synchronize()
    print({k: len(v) for k, v in synced.items()})
    assert not any(synced.values()), synced
