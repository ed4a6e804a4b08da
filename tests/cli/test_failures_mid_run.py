"""Commands that fail half-way, as machines make them fail: a bench rank dies, the study database
fills up, a torchrun peer never comes, Ctrl-C lands on every rank of a live tune. Each ends in one
line with the documented exit code, and a tune keeps what it measured. (Each test runs real
processes: the slow profile.)"""

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from conftest import Watched, cli_command, run_cli

pytestmark = pytest.mark.slow
ENV = {**os.environ, "MOEPOLICY_OFFLINE": "1"}
MODEL = "Qwen3-30B-A3B-FP8"
# a policy whose bench arms differ from vLLM's (static per-tensor fp8 first): equal arms are not timed
DIFFERING = "amd/Mixtral-8x7B-Instruct-v0.1-FP8-KV"


def _last_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    return stderr.strip().splitlines()[-1]


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def _spawned_ranks(pid: int) -> list[int]:
    ranks = []
    for child in _children(pid):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmdline:
            ranks.append(child)
    return sorted(ranks)


def test_a_bench_rank_that_dies_ends_the_bench_in_one_line(tmp_path):
    torch = pytest.importorskip("torch", reason="bench needs torch")  # noqa: F841
    policy = tmp_path / "p.yaml"
    assert (
        run_cli("plan", "--model", DIFFERING, "--ep-size", "2", "-o", str(policy)).returncode == 0
    )
    bench = Watched(
        cli_command(
            "bench",
            str(policy),
            "--transport",
            "emulated",
            "--tokens",
            "16",
            "--rounds",
            "200",
            "--reps",
            "5",
            "--routing",
            "uniform",
        ),
        env=ENV,
    )
    bench.wait_for(r"^bench: 2 ranks ready, measuring")  # both ranks are in the timing loop
    ranks = _spawned_ranks(bench.pid)
    assert len(ranks) == 2, "the bench did not start its ranks"
    os.kill(ranks[-1], signal.SIGKILL)  # a rank dies (the OOM killer, a device trap)
    err = bench.finish(timeout=120)
    assert bench.returncode == 9, err
    assert "a benchmark rank failed" in _last_line(err)


def test_a_hung_bench_rank_ends_the_bench_in_one_line_at_the_watchdog(tmp_path):
    """A rank that stops (SIGSTOP: alive, answering nothing, as a rank stuck in a collective or a
    device hang) ends the bench within --watchdog, not after gloo's or NCCL's own 10-30 minutes."""
    torch = pytest.importorskip("torch", reason="bench needs torch")  # noqa: F841
    policy = tmp_path / "p.yaml"
    assert (
        run_cli("plan", "--model", DIFFERING, "--ep-size", "2", "-o", str(policy)).returncode == 0
    )
    bench = Watched(
        cli_command(
            "bench",
            str(policy),
            "--transport",
            "emulated",
            "--tokens",
            "16",
            "--rounds",
            "200",
            "--reps",
            "5",
            "--routing",
            "uniform",
            "--watchdog",
            "15",
        ),
        env=ENV,
    )
    bench.wait_for(r"^bench: 2 ranks ready, measuring")
    ranks = _spawned_ranks(bench.pid)
    assert len(ranks) == 2, "the bench did not start its ranks"
    os.kill(ranks[-1], signal.SIGSTOP)
    stopped = time.monotonic()
    err = bench.finish(timeout=120)
    assert bench.returncode == 9, err
    last = _last_line(err)
    assert (
        last.startswith("moepolicy: a benchmark rank hung: ") and "within --watchdog 15 s" in last
    )
    assert time.monotonic() - stopped < 15 + 60  # the watchdog, then killing and reaping the ranks
    assert not any(Path(f"/proc/{pid}").exists() for pid in ranks), "a rank was left behind"


FULL_DISK = textwrap.dedent("""
    import sys
    from sqlalchemy import event
    from sqlalchemy.engine import Engine
    pages = int(sys.argv[1])
    @event.listens_for(Engine, "connect")
    def cap(connection, record):  # SQLite's own limit: it answers SQLITE_FULL, 'database or disk is full'
        cursor = connection.cursor()
        cursor.execute(f"PRAGMA max_page_count = {pages}")
        cursor.close()
    from moepolicy.cli.main import main
    sys.exit(main(sys.argv[2:]))
""")


def _tune_on_a_small_disk(tmp_path, pages: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-c",
            FULL_DISK,
            str(pages),
            "tune",
            "--model",
            MODEL,
            "--ep-size",
            "2",
            "--gpu",
            "h200",
            "--bench",
            "model",
            "--trials",
            "60",
            "--tokens",
            "128,1024",
            "--storage",
            f"sqlite:///{tmp_path}/s.db",
            "-o",
            str(tmp_path / "p.yaml"),
        ],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=600,
    )


def test_a_study_database_that_fills_up_mid_tune_ends_in_one_line_with_a_partial_policy(tmp_path):
    from moepolicy import load_policy

    result = _tune_on_a_small_disk(
        tmp_path, 60
    )  # about 40 trials fit of the 120 asked (one SM count is calibrated at both buckets)
    assert result.returncode == 7, result.stderr
    line = _last_line(result.stderr)
    assert "database or disk is full" in line and "run the same command to resume" in line, line
    assert result.stderr.count("database or disk is full") <= 3  # no chained tracebacks, no SQL
    partial = yaml.safe_load((tmp_path / "p.yaml").read_text())["deepep"]["partial"]
    assert "the study database failed (database or disk is full)" in partial["reason"]
    validate = run_cli("validate", str(tmp_path / "p.yaml"))
    assert validate.returncode == 6 and "partial result" in validate.stderr
    policy = load_policy(tmp_path / "p.yaml", ep_size=2)
    assert not policy.is_fallback or "partial" in policy.fallback_reason


def test_a_study_database_full_before_the_search_is_one_line(tmp_path):
    result = _tune_on_a_small_disk(tmp_path, 5)
    assert result.returncode == 7 and "database or disk is full" in _last_line(result.stderr)
    assert not (tmp_path / "p.yaml").exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "rank, sig, code, said",
    [
        ("0", signal.SIGINT, 130, "interrupted"),
        ("0", signal.SIGTERM, 143, "terminated"),
        ("1", signal.SIGINT, 130, "interrupted"),
        ("1", signal.SIGTERM, 143, "terminated"),
    ],
)
def test_a_torchrun_rank_waiting_for_a_missing_peer_says_so_and_honours_signals(
    tmp_path, rank, sig, code, said
):
    pytest.importorskip("torch.distributed", reason="--launcher torchrun needs torch")
    env = {
        **ENV,
        "RANK": rank,
        "WORLD_SIZE": "2",
        "LOCAL_RANK": rank,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
    }
    proc = subprocess.Popen(
        cli_command(
            "tune",
            "--launcher",
            "torchrun",
            "--bench",
            "model",
            "--model",
            MODEL,
            "--gpu",
            "h200",
            "--trials",
            "1",
            "--storage",
            f"sqlite:///{tmp_path}/s.db",
            "-o",
            str(tmp_path / "p.yaml"),
        ),
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    import threading

    silent = threading.Timer(60, proc.kill)  # a rank that says nothing for a minute fails the test
    silent.start()
    first = proc.stderr.readline()  # until the rank says what it waits for
    silent.cancel()
    waiting = "waiting for 1 more" if rank == "0" else "waiting for rank 0's store at 127.0.0.1:"
    assert f"rank {rank}:" in first and waiting in first, first
    proc.send_signal(sig)
    try:
        rest = proc.stderr.read()
        proc.wait(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == code and rest.strip() == f"moepolicy: {said}", rest


def test_ctrl_c_during_a_live_tune_prints_no_traceback_from_any_rank(tmp_path):
    """A terminal sends Ctrl-C to the whole process group: the tune and every worker rank."""
    cmd = cli_command(
        "tune",
        "--model",
        MODEL,
        "--ep-size",
        "2",
        "--gpu",
        "h200",
        "--bench",
        "live",
        "--trials",
        "30",
        "--tokens",
        "128,1024",
        "--storage",
        f"sqlite:///{tmp_path}/s.db",
        "-o",
        str(tmp_path / "p.yaml"),
        fake_deepep=2,
    )
    # while the ranks start (their interpreters importing), and while they measure: each moment is
    # an event the tune reports, never a fixed sleep
    for event in (r"^tuning hidden=", r"trial 1/"):
        proc = Watched([*cmd, "-v"], env=ENV, start_new_session=True)
        proc.wait_for(event)
        os.killpg(proc.pid, signal.SIGINT)
        err = proc.finish(timeout=120)
        assert proc.returncode == 130, err
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
        assert _last_line(err).startswith("moepolicy: interrupted"), err


def _gone(pid: int) -> bool:
    """The process has ended (a zombie nobody reaps counts as ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def _wait_gone(pids: list[int], timeout: float = 60.0) -> list[int]:
    """The pids still running after ``timeout`` (the event waited for: each process's end)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if not _gone(pid)]
        if not alive:
            return []
        time.sleep(0.2)
    return [pid for pid in pids if not _gone(pid)]


def _wait_for_ranks(pid: int, count: int, timeout: float = 240.0) -> list[int]:
    """The ranks ``pid`` spawned, once there are ``count`` of them (the event: the process started
    its worker group)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ranks = _spawned_ranks(pid)
        if len(ranks) >= count:
            return ranks
        if _gone(pid):
            break
        time.sleep(0.1)
    pytest.fail(f"process {pid} did not start {count} ranks")


def test_live_workers_exit_when_the_tune_is_killed_without_cleanup(tmp_path):
    """SIGKILL (or the OOM killer) ends the tune with no chance to stop its bench workers: they used
    to wait for the next command forever, holding their GPUs and DeepEP buffers."""
    tune = Watched(
        [
            *cli_command(
                "tune",
                "--model",
                MODEL,
                "--ep-size",
                "2",
                "--gpu",
                "h200",
                "--bench",
                "live",
                "--trials",
                "30",
                "--tokens",
                "128,1024",
                "--storage",
                f"sqlite:///{tmp_path}/s.db",
                "-o",
                str(tmp_path / "p.yaml"),
                fake_deepep=2,
            ),
            "-v",
        ],
        env=ENV,
    )
    try:
        tune.wait_for(r"trial 1/")  # the workers are up and measuring
        workers = _spawned_ranks(tune.pid)
        assert len(workers) == 2, "the tune did not start its workers"
        os.kill(tune.pid, signal.SIGKILL)
        tune.finish(timeout=60)
        assert _wait_gone(workers) == [], "bench workers outlived their tune"
    finally:
        for pid in _spawned_ranks(tune.pid) if not _gone(tune.pid) else []:
            os.kill(pid, signal.SIGKILL)


BENCH_MOMENTS = [
    "ranks spawned",  # the ranks' interpreters start (importing torch, before any rank code runs)
    r"^bench: 2 ranks ready, measuring",  # the ranks measure
]


@pytest.mark.parametrize("moment", BENCH_MOMENTS)
def test_ctrl_c_during_bench_ends_in_one_line_and_ends_its_ranks(tmp_path, moment):
    """A terminal's Ctrl-C reaches the bench and every rank: no KeyboardInterrupt traceback from a
    rank, one line saying nothing was written, exit 130, and no rank left running."""
    pytest.importorskip("torch", reason="bench needs torch")
    policy = tmp_path / "p.yaml"
    assert (
        run_cli("plan", "--model", DIFFERING, "--ep-size", "2", "-o", str(policy)).returncode == 0
    )
    bench = Watched(
        cli_command(
            "bench",
            str(policy),
            "--transport",
            "emulated",
            "--tokens",
            "16",
            "--rounds",
            "200",
            "--reps",
            "5",
            "--routing",
            "uniform",
            "-o",
            str(tmp_path / "b.json"),
        ),
        env=ENV,
        start_new_session=True,
    )
    if moment == "ranks spawned":
        bench.wait_for(r"^timing \d+ arms")
        ranks = _wait_for_ranks(bench.pid, 2)
    else:
        bench.wait_for(moment)
        ranks = _spawned_ranks(bench.pid)
    os.killpg(bench.pid, signal.SIGINT)
    err = bench.finish(timeout=120)
    assert bench.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert _last_line(err) == (
        "moepolicy: interrupted: nothing was written (a bench keeps no partial times; run it again)"
    )
    assert not (tmp_path / "b.json").exists()
    assert _wait_gone(ranks, timeout=30) == [], "a rank outlived the bench"


def test_an_interrupted_deepep_v2_tune_says_nothing_was_written_and_no_study_resumes(tmp_path):
    out = tmp_path / "v2.yaml"
    tune = Watched(
        [
            *cli_command(
                "tune",
                "--model",
                "DeepSeek-V3",
                "--ep-size",
                "2",
                "--deep-ep-version",
                "v2-dd758ca",
                "--bench",
                "live",
                "--tokens",
                "1024,4096",
                "--sms",
                "16,48",
                "-o",
                str(out),
                fake_deepep=2,
            ),
            "-v",
        ],
        env=ENV,
        start_new_session=True,
    )
    tune.wait_for(r"^DeepEP v2: measuring")
    _wait_for_ranks(tune.pid, 2)  # the v2 tune has started its workers: it is measuring
    os.killpg(tune.pid, signal.SIGINT)
    err = tune.finish(timeout=120)
    assert tune.returncode == 130, err
    assert _last_line(err) == (
        "moepolicy: interrupted: nothing was written (a DeepEP v2 tune keeps no study: the same "
        "command starts over)"
    )
    assert not out.exists()


def _server_processes(data: Path) -> list[int]:
    """A PostgreSQL server's postmaster (first line of its postmaster.pid) and its children."""
    postmaster = int((data / "postmaster.pid").read_text().split()[0])
    return [postmaster, *_children(postmaster)]


def test_a_study_database_that_stops_answering_is_said_and_ctrl_c_ends_the_tune(postgres_server):
    """A PostgreSQL server stopped mid-tune (SIGSTOP: the connection stays open, nothing answers)
    stalled the tune silently, and Ctrl-C was held back inside the storage call forever."""
    url, data = postgres_server
    tune = Watched(
        [
            *cli_command(
                "tune",
                "--model",
                MODEL,
                "--ep-size",
                "2",
                "--gpu",
                "h200",
                "--bench",
                "model",
                "--trials",
                "40",
                "--tokens",
                "128,1024",
                "--storage",
                url,
                "-o",
                str(data.parent / "p.yaml"),
                model_bench_delay=0.3,
            ),
            "-v",
        ],
        env=ENV,
    )
    stopped: list[int] = []
    try:
        tune.wait_for(r" us \(best ")  # a trial is stored: the study is in the database
        stopped = _server_processes(data)
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        said = tune.wait_for(r"the study database has not answered for \d+ s", timeout=120)
        assert "secret-password" not in said and "Ctrl-C ends it" in said
        tune.proc.send_signal(signal.SIGINT)
        err = tune.finish(timeout=120)  # psycopg cancels the query, waits, then closes (10 s)
    finally:
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        tune.proc.kill()
    assert tune.returncode == 130, err
    assert _last_line(err) == (
        "moepolicy: interrupted: nothing was written (run the same command again to resume the study)"
    )
