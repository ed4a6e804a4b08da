"""``moepolicy bench --transport deepep`` on one GPU: DeepEP's ranks share it, the three arms run end
to end on real DeepEP, and nothing is compared (a functional run says so and prints no times)."""

import json

import pytest

from conftest import run_cli
from gpu_support import require

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("regime", ["policy's", "runahead"])
def test_bench_on_shared_ranks_runs_every_arm_and_compares_nothing(tmp_path, regime):
    require(1, need_deep_ep=True)
    import torch

    if torch.cuda.device_count() >= 2:
        pytest.skip("a GPU per rank: this is the shared-ranks check")
    policy = tmp_path / "q.yaml"
    assert (
        run_cli(
            "plan",
            "--model",
            "Qwen3-30B-A3B-FP8",
            "--ep-size",
            "2",
            "--gpu",
            "h200",
            "--expert-kernel",
            "deepgemm",
            "-o",
            str(policy),
        ).returncode
        == 0
    )
    done = run_cli(
        "bench",
        str(policy),
        "--transport",
        "deepep",
        "--tokens",
        "128",
        "--routing",
        "uniform",
        "--rounds",
        "9",
        "--reps",
        "3",
        *(("--regime", regime) if regime == "runahead" else ()),
        "-o",
        str(tmp_path / "bench.json"),
    )
    assert done.returncode == 0, done.stderr
    assert "ranks share a GPU: functional only" in done.stderr
    asked = "host" if regime == "policy's" else regime
    assert f"{asked} regime" in done.stderr
    raw = json.loads((tmp_path / "bench.json").read_text())
    assert raw["spec"]["regime"] == asked and all(
        len(xs) == 9 and min(xs) > 0 for xs in raw["times_us"]["uniform"]["128"].values()
    )
    assert (
        done.stdout.startswith("plumbing ok")
        and "faster" not in done.stdout
        and "slower" not in done.stdout
    )


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
