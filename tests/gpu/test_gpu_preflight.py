"""``moepolicy validate --live`` on real DeepEP at EP 2, 4 and 8 (ranks share the GPU where fewer are
visible): catalog policies pass, and a byte changed after DeepEP's dispatch fails its case."""

import pytest

from conftest import run_cli
from gpu_support import WORLDS, gpu_here, require

pytestmark = pytest.mark.gpu

MODELS = ("Qwen3-30B-A3B-FP8", "DeepSeek-V3", "nvidia/Qwen3-30B-A3B-NVFP4")


def plan(tmp_path, model: str, ep_size: int):
    out = tmp_path / f"{model.replace('/', '_')}-ep{ep_size}.yaml"
    done = run_cli(
        "plan", "--model", model, "--ep-size", str(ep_size), "--gpu", gpu_here(), "-o", str(out)
    )
    assert done.returncode == 0, done.stderr
    return out


def run_live(*paths, timeout=900):
    import os
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "moepolicy", "validate", *map(str, paths), "--live"],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "MOEPOLICY_OFFLINE": "1"},
    )


@pytest.mark.parametrize("world", WORLDS, ids=lambda w: f"ep{w}")
def test_catalog_policies_pass_the_live_preflight(tmp_path, world):
    require(1, need_deep_ep=True)
    paths = [plan(tmp_path, model, world) for model in MODELS]
    done = run_live(*paths)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(": DeepEP num_sms") == len(MODELS)
    assert " failed" not in done.stdout
    assert "combine (bf16)" in done.stdout


def test_a_byte_changed_after_deepeps_dispatch_fails_its_case(tmp_path):
    """The comparison against the reference is what can fail: one byte flipped in what DeepEP
    delivered to rank 1 fails every dispatched case of that rank (a buffer too small for its configs
    is refused earlier, by validate's own check of DeepEP's size formula)."""
    require(1, need_deep_ep=True)
    from moepolicy.measure.placement import visible_placement
    from moepolicy.preflight import describe_failure, plan_preflight, run_preflight
    from moepolicy.testing.preflight_links import CorruptingDeepEPLink

    live = plan_preflight(str(plan(tmp_path, "Qwen3-30B-A3B-FP8", 2)))
    (report,) = run_preflight([live], visible_placement(2), link=CorruptingDeepEPLink())
    failed = [r for r in report.rows if r.status == "failed"]
    assert failed and all("rank 1" in r.detail for r in failed), report.rows
    assert "differ" in describe_failure(report)
