import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from cli_run import run_in_process

ROOT = Path(__file__).resolve().parents[1]

# Never reach the network from tests: unknown names must fail fast and offline.
os.environ.setdefault("MOEPOLICY_OFFLINE", "1")
# moepolicy's own cache (the rule-pack lint) in a folder of this run, not the user's
os.environ.setdefault("MOEPOLICY_CACHE_DIR", tempfile.mkdtemp(prefix="moepolicy-test-cache-"))


def cli_command(*args: str, fake_deepep: int = 0, model_bench_delay: float = 0.0) -> list[str]:
    """The CLI as a process: ``python -m moepolicy ARGS``, or with a test bench source injected."""
    if not fake_deepep and not model_bench_delay:
        return [sys.executable, "-m", "moepolicy", *args]
    return [
        sys.executable,
        "-m",
        "moepolicy.testing.cli",
        "--fake-deepep",
        str(fake_deepep),
        "--model-bench-delay",
        str(model_bench_delay),
        "--",
        *args,
    ]


def run_cli(
    *args: str,
    cwd: Path | None = None,
    env: dict | None = None,
    input: str | None = None,
    fake_deepep: int = 0,
    model_bench_delay: float = 0.0,
) -> subprocess.CompletedProcess:
    """Run the CLI as a user would, in this process (``cli_run.run_in_process``): the exit code,
    stdout and stderr as a subprocess's, with ``env`` added to this process's environment."""
    return run_in_process(
        *args,
        cwd=cwd,
        env=env,
        input=input,
        fake_deepep=fake_deepep,
        model_bench_delay=model_bench_delay,
    )


def run_cli_process(
    *args: str,
    cwd: Path | None = None,
    env: dict | None = None,
    input: str | None = None,
    fake_deepep: int = 0,
    model_bench_delay: float = 0.0,
) -> subprocess.CompletedProcess:
    """Run the installed CLI in a separate process (``python -m moepolicy``): for the tests whose
    point is the process (its start, its exit, the modules it imports) and one smoke test per command."""
    full_env = {**os.environ, "MOEPOLICY_OFFLINE": "1", **(env or {})}
    return subprocess.run(
        cli_command(*args, fake_deepep=fake_deepep, model_bench_delay=model_bench_delay),
        capture_output=True,
        text=True,
        cwd=cwd,
        env=full_env,
        input=input,
        timeout=120,
    )


class Watched:
    """A process whose stderr is read line by line as it comes, so a test can act on an event the
    process reports (a progress line) instead of sleeping a fixed time: under load a fixed sleep lands
    in the wrong phase. ``wait_for`` returns once a line matches; ``finish`` waits for the exit and
    returns all of stderr."""

    def __init__(self, args: list[str], env: dict | None = None, **popen):
        self.proc = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "MOEPOLICY_OFFLINE": "1", **(env or {})},
            **popen,
        )
        self.lines: list[str] = []
        self._seen = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        for line in self.proc.stderr:
            with self._seen:
                self.lines.append(line)
                self._seen.notify_all()
        with self._seen:
            self._seen.notify_all()

    def wait_for(self, pattern: str, timeout: float = 240.0) -> str:
        """The first stderr line matching ``pattern`` (a regular expression); fails the test if the
        process ends or ``timeout`` passes first."""
        wanted = re.compile(pattern)
        deadline = time.monotonic() + timeout
        checked = 0
        with self._seen:
            while True:
                for line in self.lines[checked:]:
                    if wanted.search(line):
                        return line
                checked = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0 or not self._reader.is_alive():
                    pytest.fail(f"no stderr line matched {pattern!r}: {''.join(self.lines)}")
                self._seen.wait(min(left, 1.0))

    def finish(self, timeout: float = 120.0) -> str:
        self.proc.wait(timeout=timeout)
        self._reader.join(timeout=timeout)
        return "".join(self.lines)

    @property
    def returncode(self):
        return self.proc.returncode


@pytest.fixture
def write_config(tmp_path):
    """Write a config.json (and optionally hf_quant_config.json) into a fresh model folder."""
    import json

    def _write(config: dict, hf_quant: dict | None = None, name: str = "model") -> Path:
        folder = tmp_path / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(config))
        if hf_quant is not None:
            (folder / "hf_quant_config.json").write_text(json.dumps(hf_quant))
        return folder

    return _write


HUB_COMMIT = "0123456789abcdef0123456789abcdef01234567"  # tests/checkpoint/fake_hub.COMMIT


def fake_cache(
    root: Path, repo_id: str, files: dict[str, bytes], commit: str = HUB_COMMIT
) -> Path:
    """huggingface_hub's cache layout: blobs by hash, a snapshot of links to them, refs/main."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for name, content in files.items():
        blob = repo / "blobs" / hashlib.sha1(content).hexdigest()
        blob.write_bytes(content)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / name)
    return snapshot


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def postgres(postgres_server):
    """A PostgreSQL database's URL (``studies``, user ``tuner``) on a server of this test's own."""
    return postgres_server[0]


@pytest.fixture
def postgres_server(tmp_path):
    """(the URL of its ``studies`` database, its data folder): a PostgreSQL server on a loopback
    port, from the distribution's binaries; stopped (immediately) after the test."""
    initdb = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not initdb:
        pytest.skip("PostgreSQL server binaries are not installed (.ci/run installs them)")
    pytest.importorskip(
        "psycopg", reason="psycopg is not installed (pip install 'moepolicy[postgres]')"
    )
    import tempfile
    from pathlib import Path

    bindir = os.path.dirname(initdb[-1])
    base = Path(
        tempfile.mkdtemp(prefix="moepolicy-pg-", dir="/tmp")
    )  # reachable by the postgres user
    data, sock = base / "pgdata", base / "pgsock"
    sock.mkdir()
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_postgres:
        shutil.chown(base, "postgres")
        shutil.chown(sock, "postgres")
        os.chmod(base, 0o755)
    port = _free_port()
    subprocess.run(
        [*as_postgres, f"{bindir}/initdb", "-D", str(data), "-U", "tuner", "--auth=trust"],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [
            *as_postgres,
            f"{bindir}/pg_ctl",
            "-D",
            str(data),
            "-l",
            str(base / "pg.log"),
            "-w",
            "-o",
            f"-p {port} -k {sock} -c listen_addresses=127.0.0.1",
            "start",
        ],
        check=True,
        capture_output=True,
    )
    try:
        subprocess.run(
            [
                f"{bindir}/psql",
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-U",
                "tuner",
                "-d",
                "postgres",
                "-c",
                "CREATE DATABASE studies",
            ],
            check=True,
            capture_output=True,
        )
        yield f"postgresql://tuner:secret-password@127.0.0.1:{port}/studies", data
    finally:
        subprocess.run(
            [*as_postgres, f"{bindir}/pg_ctl", "-D", str(data), "-m", "immediate", "stop"],
            capture_output=True,
        )
        shutil.rmtree(base, ignore_errors=True)


# The fast profile (`pytest -m "not slow"`) runs the plan, rules, runtime, schema, export and CLI
# tests; these modules run real tune subprocesses, fuzzing, kill/interrupt loops, worker groups or
# spawned ranks, and stay in the full profile (.ci/run).
SLOW_MODULES = {
    "test_fuzz.py",
    "tuning/test_crash_safety.py",
    "tuning/test_scaleout.py",
    "tuning/test_live_supervisor.py",
    "tuning/test_overlap.py",
    "tuning/test_tuning.py",
    "tuning/test_tune_serial.py",
    "moe_step/test_bench_cli.py",
    "reference/test_prepare_finalize_cpu.py",
    "reference/test_packed_transport_cpu.py",
    "measure/test_rank_harness.py",
    "measure/test_step_time.py",
    "export/test_report_plots.py",
}


def pytest_collection_modifyitems(config, items):
    tests = Path(__file__).parent
    for item in items:
        try:
            module = Path(str(item.fspath)).relative_to(tests).as_posix()
        except ValueError:
            continue
        if module in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
