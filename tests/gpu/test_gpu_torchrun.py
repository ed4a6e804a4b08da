"""``tune --launcher torchrun --bench live`` on real DeepEP: torchrun starts the ranks, rank 0 drives
the study, every rank measures in the job's process group. With a GPU per rank (NCCL) it is a
measured tune; on one GPU the ranks share it (gloo, the test-only switch), a functional run whose
policy is marked not for serving."""

import shutil
import socket
import subprocess

import pytest
import yaml

from gpu_support import CLI_TIMEOUT_S, gpu_here, ranks_env, require

pytestmark = pytest.mark.gpu


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_torchrun_live_tune_measures_on_every_rank(tmp_path):
    require(1, need_deep_ep=True)
    pytest.importorskip("optuna")
    torchrun = shutil.which("torchrun")
    if torchrun is None:
        pytest.skip("torchrun is not installed (it comes with torch)")
    env, shared = ranks_env(2)
    out = tmp_path / "p.yaml"
    tune = ["tune", "--launcher", "torchrun", "--bench", "live", "--model", "Qwen3-30B-A3B-FP8"]
    tune += ["--gpu", gpu_here(), "--sms", "24", "--tokens", "1024", "--trials", "3"]
    tune += ["--confirm-rounds", "9", "--storage", f"sqlite:///{tmp_path}/s.db", "-o", str(out)]
    done = subprocess.run(
        [torchrun, "--nproc-per-node", "2", "--master-port", str(_free_port()), "-m", "moepolicy"]
        + tune,
        capture_output=True,
        text=True,
        env=env,
        timeout=CLI_TIMEOUT_S[2],
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rank 1: measured" in done.stderr  # the other rank served every measurement
    deepep = yaml.safe_load(out.read_text())["deepep"]
    if shared:
        assert "functional run" in deepep["partial"]["reason"]
    else:
        assert deepep.get("partial") is None and deepep["provenance"]["source"] == "measured"
