"""The one rank harness (``moepolicy.measure.ranks``) on CPUs: every rank it starts, and every rank
torchrun starts for a tune, runs with NVLink multicast off whatever the caller exported; a rank that
raises or hangs ends the group in one line naming it. Spawned ranks: the slow profile."""

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the rank harness runs torch ranks")

from moepolicy.measure.ranks import SAFE_ENV, RanksFailed  # noqa: E402
from moepolicy.testing import a2a_harness as H  # noqa: E402

# what a caller may have exported: the opposite of the safe settings
UNSAFE = {
    "NCCL_NVLS_ENABLE": "1",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "0",
    "NVSHMEM_DISABLE_NVLS": "0",
}


def _report_env(rank: int, out: str) -> None:
    Path(out, f"rank{rank}.json").write_text(json.dumps({k: os.environ.get(k) for k in UNSAFE}))


def test_every_rank_runs_with_nvlink_multicast_off_whatever_the_caller_exported(
    tmp_path, monkeypatch
):
    for key, value in UNSAFE.items():
        monkeypatch.setenv(key, value)
    H.run_ranks(_report_env, (str(tmp_path),), 2)  # the tests' rank helper is the harness's
    for rank in range(2):
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == SAFE_ENV


def _raise_on_rank_1(rank: int) -> None:
    if rank == 1:
        raise RuntimeError("injected host assert (x_scales->dim() == 2)")


def _hang_on_rank_1(rank: int) -> None:
    if rank == 1:
        time.sleep(3600)


def test_a_rank_that_raises_is_named_in_one_line_with_its_reason():
    with pytest.raises(RanksFailed) as info:
        H.run_ranks(_raise_on_rank_1, (), 2, timeout_s=120)
    said = str(info.value)
    assert info.value.rank == 1 and "\n" not in said
    assert "RuntimeError: injected host assert (x_scales->dim() == 2)" in said


def test_a_hung_rank_ends_the_group_at_the_deadline():
    started = time.monotonic()
    with pytest.raises(RanksFailed) as info:
        H.run_ranks(_hang_on_rank_1, (), 2, timeout_s=20)
    assert info.value.hung and info.value.rank == 1, str(info.value)
    assert time.monotonic() - started < 20 + 60  # the deadline, and the kill and reap after it


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# each torchrun rank runs the real CLI, then writes what its own process's environment held
TORCHRUN_RANK = """
import json, os, sys
from moepolicy.cli.main import main
code = main(sys.argv[2:])
keys = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")
with open(os.path.join(sys.argv[1], "rank" + os.environ["RANK"] + ".json"), "w") as f:
    json.dump({k: os.environ.get(k) for k in keys}, f)
sys.exit(code)
"""


def test_the_torchrun_path_sets_the_safe_environment_in_its_own_processes(tmp_path):
    """torchrun, not moepolicy, starts these processes: the tune sets the switches itself."""
    pytest.importorskip("optuna")
    torchrun = shutil.which("torchrun")
    if torchrun is None:
        pytest.skip("torchrun is not installed (it comes with torch)")
    script = tmp_path / "rank.py"
    script.write_text(TORCHRUN_RANK)
    tune = ["tune", "--launcher", "torchrun", "--bench", "model", "--model", "Qwen3-30B-A3B-FP8"]
    tune += ["--gpu", "h200", "--tokens", "1024", "--storage", f"sqlite:///{tmp_path}/s.db"]
    done = subprocess.run(
        [torchrun, "--nproc-per-node", "2", "--master-port", str(_free_port())]
        + [str(script), str(tmp_path), *tune, "-o", str(tmp_path / "p.yaml")],
        capture_output=True,
        text=True,
        env={**os.environ, "MOEPOLICY_OFFLINE": "1", **UNSAFE},
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for rank in range(2):
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == SAFE_ENV
