"""``moepolicy bench --transport deepep`` on one GPU: DeepEP's ranks share it, the three arms run end
to end on real DeepEP, and nothing is compared (a functional run says so and prints no times)."""

import pytest

from conftest import run_cli
from gpu_support import require

pytestmark = pytest.mark.gpu


def test_bench_on_shared_ranks_runs_every_arm_and_compares_nothing(tmp_path):
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
    )
    assert done.returncode == 0, done.stderr
    assert "ranks share a GPU: functional only" in done.stderr
    assert (
        done.stdout.startswith("plumbing ok")
        and "faster" not in done.stdout
        and "slower" not in done.stdout
    )
