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
