"""The live tuner end to end on real DeepEP with EP ranks sharing one GPU (the test-only switch
MOEPOLICY_FUNCTIONAL_SHARED_RANKS=1): search -> selection in fresh workers -> report in fresh workers
-> a policy, with the protocol's statistics on real rounds. Functional only: the output says so and
the policy is marked not for serving (the runtime uses DeepEP's defaults for it)."""

import os
import subprocess
import sys

import pytest

from gpu_support import require

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("world", [2, 8], ids=lambda w: f"ep{w}")
def test_a_shared_rank_tune_runs_the_whole_protocol_and_is_labelled(tmp_path, world):
    require(1, need_deep_ep=True)
    pytest.importorskip("optuna")
    import torch

    if torch.cuda.device_count() >= world:
        pytest.skip(f"{world} GPUs visible: this is the shared-ranks check")
    out = tmp_path / "policy.yaml"
    env = {**os.environ, "MOEPOLICY_OFFLINE": "1", "MOEPOLICY_FUNCTIONAL_SHARED_RANKS": "1"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "moepolicy",
            "tune",
            "--model",
            "Qwen3-30B-A3B-FP8",
            "--ep-size",
            str(world),
            "--gpu",
            "h200",
            "--bench",
            "live",
            "--sms",
            "20,24",
            "--tokens",
            "512",
            "--trials",
            "3",
            "--confirm-rounds",
            "7",  # the least the protocol runs: 8 ranks time-slicing one GPU are slow
            "--storage",
            f"sqlite:///{tmp_path}/s.db",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=1200,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert "ranks share a GPU: functional only" in done.stderr
    assert "re-measuring" in done.stderr  # the protocol's selection and report ran
    from moepolicy import load_policy
    from moepolicy.document.reader import read_policy

    doc = read_policy(out).doc
    assert doc.deepep.partial is not None and "functional run" in doc.deepep.partial.reason
    policy = load_policy(out, ep_size=world)
    assert policy.is_fallback and policy.deepep.is_default  # never served with these configs
    check = subprocess.run(
        [sys.executable, "-m", "moepolicy", "validate", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert check.returncode == 6 and "functional run" in check.stderr
