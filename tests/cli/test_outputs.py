"""Every command's ``-o``, the same way: a command never replaces its own input, a finished result is
never thrown away, concurrent writers never undo each other, and an error names what really failed."""

import errno
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from conftest import run_cli

MODEL = "Qwen3-30B-A3B-FP8"
PACK = {
    "pack": "mine",
    "version": "1",
    "rules": [
        {
            "id": "mine/all-bf16",
            "priority": 10000,
            "when": {"fact": "layer.kind", "op": "eq", "value": "moe"},
            "then": {"order": "dispatch_then_quant", "numerics": "exact"},
            "why": "w",
            "source": "s",
        }
    ],
}


def _one_line_refusal(result, code: int, fragment: str) -> str:
    assert result.returncode == code and "Traceback" not in result.stderr, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("moepolicy: ") and fragment in line, line
    return line


@pytest.fixture
def inputs(tmp_path, write_config):
    """A local checkpoint, a rule pack, a policy and a storage file, as a user has them."""
    from moepolicy.checkpoint.catalog import lookup

    folder = write_config(
        json.loads((lookup(MODEL).folder / "config.json").read_text()), name="ckpt"
    )
    pack = tmp_path / "mine.yaml"
    pack.write_text(yaml.safe_dump(PACK))
    policy = tmp_path / "p.yaml"
    assert (
        run_cli("plan", "--model", str(folder), "--ep-size", "2", "-o", str(policy)).returncode
        == 0
    )
    return {
        "model": folder,
        "config": folder / "config.json",
        "pack": pack,
        "policy": policy,
        "db": tmp_path / "s.db",
        "journal": tmp_path / "s.log",
    }


def _cases(i: dict) -> list[tuple[list[str], Path]]:
    """(command, the input its -o names)."""
    plan = ["plan", "--model", str(i["model"]), "--ep-size", "2"]
    tune = [
        "tune",
        "--model",
        str(i["model"]),
        "--ep-size",
        "2",
        "--bench",
        "model",
        "--trials",
        "1",
    ]
    return [
        ([*plan, "-o", str(i["config"])], i["config"]),
        (
            [*plan, "-o", str(i["model"] / "hf_quant_config.json")],
            i["model"] / "hf_quant_config.json",
        ),
        ([*plan, "--rules", str(i["pack"]), "-o", str(i["pack"])], i["pack"]),
        (
            ["plan", "--model", str(i["config"]), "--ep-size", "2", "-o", str(i["config"])],
            i["config"],
        ),
        ([*tune, "--storage", f"sqlite:///{i['db']}", "-o", str(i["db"])], i["db"]),
        ([*tune, "--storage", str(i["journal"]), "-o", str(i["journal"])], i["journal"]),
        ([*tune, "--storage", f"sqlite:///{i['db']}", "-o", str(i["config"])], i["config"]),
        (["export", str(i["policy"]), "--to", "vllm", "-o", str(i["policy"])], i["policy"]),
        (["export", str(i["policy"]), "--to", "sglang", "-o", str(i["policy"])], i["policy"]),
        (["bench", str(i["policy"]), "-o", str(i["policy"])], i["policy"]),
    ]


def test_an_output_that_names_the_command_s_own_input_is_refused_before_any_work(inputs, tmp_path):
    inputs["db"].write_bytes(b"SQLite format 3\0")  # an existing study database
    inputs["journal"].write_text("{}\n")
    for command, victim in _cases(inputs):
        before = victim.read_bytes() if victim.exists() else None
        result = run_cli(*command)
        _one_line_refusal(result, 8, "which this command reads")
        assert (
            "tuning hidden" not in result.stderr and "target:" not in result.stderr
        )  # before any work
        assert (victim.read_bytes() if victim.exists() else None) == before, command


def test_an_output_reaching_an_input_through_a_link_is_refused(inputs, tmp_path):
    soft = tmp_path / "soft.yaml"
    soft.symlink_to(inputs["policy"])
    hard = tmp_path / "hard.yaml"
    os.link(inputs["pack"], hard)
    dotted = str(inputs["model"]) + "/../ckpt/./config.json"
    for command in (
        ["export", str(inputs["policy"]), "--to", "vllm", "-o", str(soft)],
        [
            "plan",
            "--model",
            str(inputs["model"]),
            "--ep-size",
            "2",
            "--rules",
            str(inputs["pack"]),
            "-o",
            str(hard),
        ],
        ["plan", "--model", str(inputs["model"]), "--ep-size", "2", "-o", dotted],
    ):
        _one_line_refusal(run_cli(*command), 8, "which this command reads")
    assert yaml.safe_load(inputs["pack"].read_text()) == PACK


def test_export_and_bench_never_write_over_the_pack_beside_the_policy_nor_model_config(
    inputs, tmp_path
):
    """A policy planned with a user pack is deployed with the pack beside it (serving checks it
    there); export --model reads the checkpoint's config.json. -o naming either replaced it (serving
    then reported the pack 'unchecked')."""
    policy = tmp_path / "with-pack.yaml"
    planned = run_cli(
        "plan",
        "--model",
        str(inputs["model"]),
        "--ep-size",
        "2",
        "--rules",
        str(inputs["pack"]),
        "-o",
        str(policy),
    )
    assert planned.returncode == 0, planned.stderr
    pack, config = inputs["pack"], inputs["config"]
    cases = [
        (["export", str(policy), "--to", "vllm", "-o", str(pack)], pack),
        (["export", str(policy), "--to", "sglang", "-o", str(pack)], pack),
        (["bench", str(policy), "--dry-run", "-o", str(pack)], pack),
        (
            [
                "export",
                str(policy),
                "--to",
                "vllm",
                "--model",
                str(inputs["model"]),
                "-o",
                str(config),
            ],
            config,
        ),
        (
            ["export", str(policy), "--to", "sglang", "--model", str(config), "-o", str(config)],
            config,
        ),
    ]
    for command, victim in cases:
        before = victim.read_bytes()
        line = _one_line_refusal(run_cli(*command), 8, "which this command reads")
        assert str(victim) in line, line
        assert victim.read_bytes() == before, command
    # and --log-file, which shares the check
    before = pack.read_bytes()
    logged = run_cli("export", str(policy), "--to", "vllm", "--log-file", str(pack))
    assert logged.returncode == 8 and pack.read_bytes() == before


def test_report_never_draws_over_the_policy_it_reports(inputs, tmp_path):
    plots = tmp_path / "plots"
    plots.mkdir()
    policy = plots / "sms.png"
    policy.write_bytes(inputs["policy"].read_bytes())
    _one_line_refusal(
        run_cli("report", str(policy), "--plots", str(plots)), 8, "which this command reads"
    )
    assert policy.read_bytes() == inputs["policy"].read_bytes()


# ------------------------------------------------------------------------ the same -o in every command
COMMANDS_WITH_OUTPUT = ("plan", "export", "bench", "tune")


def test_every_command_s_output_flag_is_the_same():
    from moepolicy.cli._output import OUTPUT_HELP
    from moepolicy.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for name in COMMANDS_WITH_OUTPUT:
        flags = {a.dest: a for a in sub.choices[name]._actions}
        assert (
            flags["output"].option_strings == ["-o", "--output"]
            and OUTPUT_HELP in flags["output"].help
        ), name


def test_dash_is_standard_output_and_a_file_is_said_in_every_command(inputs, tmp_path):
    policy = str(inputs["policy"])
    for args in (
        ("plan", "--model", MODEL, "--ep-size", "2"),
        ("export", policy, "--to", "vllm", "--format", "json"),
        ("export", policy, "--to", "sglang"),
    ):
        to_stdout = run_cli(*args, "-o", "-")
        assert (
            to_stdout.returncode == 0
            and to_stdout.stdout.strip()
            and not (tmp_path / "-").exists()
        )
        target = tmp_path / f"{args[0]}.out"
        to_file = run_cli(*args, "-o", str(target))
        assert to_file.returncode == 0 and _same(target.read_text(), to_stdout.stdout)
        assert to_file.stderr.strip().splitlines()[-1].startswith(f"wrote {target}")


def _same(a: str, b: str) -> bool:
    """The same output, but the command line a policy records (``generated``)."""
    da, db = yaml.safe_load(a), yaml.safe_load(b)
    if isinstance(da, dict) and isinstance(db, dict):
        da.pop("generated", None), db.pop("generated", None)
    return da == db


def test_argparse_s_messages_are_escaped_as_every_other_message():
    hostile = "--\x1b]8;;https://evil\x07x\x1b[2J\u202e"
    for args in (
        ("plan", "--model", "m", hostile),
        ("validate", "p.yaml", hostile),
        ("export", "p", "--to", "\x1b[31mx"),
    ):
        result = run_cli(*args)
        assert result.returncode == 2
        assert not [c for c in result.stderr if c in "\x1b\x07\u202e"], result.stderr
        assert "\\x1b" in result.stderr and len(result.stderr.strip().splitlines()) == 1


# -------------------------------------------------------------------------- what really failed
def test_an_os_error_names_what_failed_and_only_stdout_says_standard_output(capsys):
    import argparse

    from moepolicy.cli._output import SafeStream
    from moepolicy.cli.main import _run

    def failing(_args):
        raise OSError(errno.ENOSPC, "No space left on device", "/data/plots/sms.png")

    assert _run(argparse.Namespace(command="report", run=failing), None) == 1
    line = capsys.readouterr().err.strip()
    assert line == "moepolicy: /data/plots/sms.png: No space left on device", line

    def reading(_args):
        raise PermissionError(errno.EACCES, "Permission denied", "/etc/shadow")

    _run(argparse.Namespace(command="plan", run=reading), None)
    assert capsys.readouterr().err.strip() == "moepolicy: /etc/shadow: Permission denied"

    class Full:
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

        def flush(self):
            pass

    def printing(_args):
        SafeStream(Full()).write("a table\n")

    _run(argparse.Namespace(command="models", run=printing), None)
    assert (
        capsys.readouterr().err.strip()
        == "moepolicy: cannot write to standard output (No space left on device)"
    )


# --------------------------------------------------------------------- a finished result is kept
def test_a_tune_whose_final_write_fails_keeps_the_result_and_says_where(tmp_path, monkeypatch):
    """The output folder fills up while the tune runs: the policy is kept elsewhere, one line says
    where and how to put it in place, exit non-zero."""
    out_dir, spare = tmp_path / "out", tmp_path / "spare"
    out_dir.mkdir()
    spare.mkdir()
    real = os.replace

    def full(
        src, dst, *args, **kwargs
    ):  # the output's disk is full: nothing can be renamed into it
        if os.path.abspath(dst).startswith(str(out_dir) + os.sep):
            raise OSError(errno.ENOSPC, "No space left on device", dst)
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", full)
    result = run_cli(
        "tune",
        "--model",
        MODEL,
        "--ep-size",
        "2",
        "--bench",
        "model",
        "--trials",
        "1",
        "--tokens",
        "128",
        "--storage",
        f"sqlite:///{tmp_path}/s.db",
        "-o",
        str(out_dir / "p.yaml"),
        env={"TMPDIR": str(spare)},
    )
    monkeypatch.undo()
    line = _one_line_refusal(result, 8, "No space left on device")
    kept = list(spare.glob("p.unsaved-*.yaml"))
    assert (
        len(kept) == 1
        and f"kept in {kept[0]}" in line
        and f"mv {kept[0]} {out_dir / 'p.yaml'}" in line
    )
    assert run_cli("validate", str(kept[0])).returncode == 0
    assert not list(out_dir.iterdir())  # nothing half-written where the write failed


# ---------------------------------------------------------------- two writers of one path
WRITER = textwrap.dedent("""
    import sys
    from moepolicy.errors import OutputError
    from moepolicy.files import atomic_write
    path, tag, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    failed = 0
    for i in range(n):
        try:
            atomic_write(path, f"{tag} {i}\\n" + "x" * 200_000 + "\\nend\\n")
        except OutputError as exc:
            failed += 1
            print(exc, file=sys.stderr)
    print(failed)
""")


def test_two_writers_of_one_path_never_delete_each_other_s_temporary_file(tmp_path):
    target = tmp_path / "policy.yaml"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(target), tag, "100"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for tag in ("a", "b")
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [int(out.strip()) for out, _ in outs] == [0, 0], [err[-500:] for _, err in outs]
    text = target.read_text()
    assert text.split()[0] in ("a", "b") and text.endswith("\nend\n")
    assert [p.name for p in tmp_path.iterdir()] == ["policy.yaml"]  # no temporary file left


def test_a_killed_writer_s_temporary_file_is_removed_and_a_live_one_is_not(tmp_path):
    from moepolicy.files import STALE_AGE_S, atomic_write, writer_id

    target = tmp_path / "p.yaml"
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    here = writer_id()
    stale = tmp_path / f".p.yaml.abc123.{here}.{dead}.tmp"
    live = tmp_path / f".p.yaml.def456.{here}.{os.getppid()}.tmp"
    elsewhere = (
        tmp_path / f".p.yaml.ghi789.{'0' * 12}.{dead}.tmp"
    )  # another host's: not checkable here
    legacy_old, legacy_new = tmp_path / ".p.yaml.jkl012.77.tmp", tmp_path / ".p.yaml.mno345.78.tmp"
    for path in (stale, live, elsewhere, legacy_old, legacy_new):
        path.write_text("partial")
    an_hour_ago = os.stat(legacy_old).st_mtime - STALE_AGE_S - 60
    os.utime(legacy_old, (an_hour_ago, an_hour_ago))
    atomic_write(target, "new\n")
    assert target.read_text() == "new\n"
    assert not stale.exists() and live.exists() and elsewhere.exists()
    assert not legacy_old.exists() and legacy_new.exists()


def _unshare() -> list[str]:
    """A command prefix that runs a process in a PID namespace of its own (as a container does)."""
    import shutil

    prefix = ["unshare", "--user", "--map-root-user", "--pid", "--fork"]
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed")
    if subprocess.run([*prefix, "true"], capture_output=True).returncode != 0:
        pytest.skip("this machine does not let a user make a PID namespace")
    return prefix


def test_writers_in_different_pid_namespaces_never_delete_each_other_s_temporary_file(tmp_path):
    """Two containers (or hosts) writing one path on a shared folder: each saw the other's process
    id as dead and removed its temporary file mid-write."""
    target = tmp_path / "policy.yaml"
    procs = [
        subprocess.Popen(
            [*prefix, sys.executable, "-c", WRITER, str(target), tag, "100"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for prefix, tag in (([], "host"), (_unshare(), "container"))
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [out.strip() for out, _ in outs] == ["0", "0"], [err[-500:] for _, err in outs]
    assert target.read_text().endswith("\nend\n")


# --------------------------------------------------------------------------- flags checked in one line
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "0", "1e300"])
def test_a_trial_timeout_that_would_turn_the_watchdog_off_is_refused(tmp_path, value):
    result = run_cli(
        "tune",
        "--model",
        MODEL,
        "--ep-size",
        "2",
        "--bench",
        "model",
        f"--trial-timeout={value}",
        "--storage",
        f"sqlite:///{tmp_path}/s.db",
        "-o",
        str(tmp_path / "p.yaml"),
    )
    _one_line_refusal(result, 2, "--trial-timeout must be")


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--ranks", "0"),
        ("--ranks", "-2"),
        ("--ranks", str(10**9)),
        ("--reps", "0"),
        ("--reps", "-1"),
        ("--reps", str(10**9)),
    ],
)
def test_bench_counts_are_checked_in_one_line(inputs, flag, value):
    result = run_cli("bench", str(inputs["policy"]), "--transport", "emulated", f"{flag}={value}")
    _one_line_refusal(result, 2, f"{flag} must be from 1 to")


def test_a_storage_that_is_a_fifo_a_device_or_a_folder_is_refused_before_it_is_opened(tmp_path):
    fifo = tmp_path / "s.db"
    os.mkfifo(fifo)
    journal_fifo = tmp_path / "j.log"
    os.mkfifo(journal_fifo)
    for storage, what in (
        (f"sqlite:///{fifo}", "is a FIFO"),
        (str(journal_fifo), "is a FIFO"),
        ("sqlite:////dev/zero", "is a device"),
        ("journal:/dev/zero", "is a device"),
        (f"sqlite:///{tmp_path}", "is a folder"),
        ("/dev/null", "expected an optuna RDB URL"),
    ):
        result = run_cli(
            "tune",
            "--model",
            MODEL,
            "--ep-size",
            "2",
            "--bench",
            "model",
            "--trials",
            "1",
            "--storage",
            storage,
            "-o",
            str(tmp_path / "p.yaml"),
        )
        _one_line_refusal(result, 7, what)
    assert not (tmp_path / "p.yaml").exists()


def test_without_a_terminal_a_long_phase_prints_a_progress_line_and_a_short_one_nothing(
    capsys, monkeypatch
):
    from moepolicy.cli import _output
    from moepolicy.tuning import progress

    clock = [1000.0]
    monkeypatch.setattr(_output.time, "monotonic", lambda: clock[0])
    with _output.progress_to_stderr():  # capsys's stderr is not a terminal
        progress.phase("select T=512", 10)
        for _ in range(4):
            clock[0] += 5
            progress.advance()
        assert capsys.readouterr().err == ""  # 20 s: too short to say anything
        for _ in range(4):
            clock[0] += 5
            progress.advance()
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["  select T=512: 6/10 steps in 30 s, about 20 s left"]  # then none for 30 s
    progress.advance()  # after the block the handler is gone
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("command", ["plan", "tune"])
def test_a_reader_that_left_ends_what_is_shown_not_the_work(tmp_path, command):
    """``moepolicy tune ... -o t.yaml 2>&1 | head -2``: once head has its lines the pipe breaks; the
    file is still written and the command says done (it exited 0 having written nothing)."""
    from conftest import cli_command

    out = tmp_path / "p.yaml"
    args = [command, "--model", "Qwen3-30B-A3B-FP8", "--ep-size", "2", "-o", str(out)]
    if command == "tune":
        args += ["--storage", f"sqlite:///{tmp_path}/s.db"]
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line: every write breaks the pipe
    try:
        done = subprocess.run(
            cli_command(*args),
            stdout=write,
            stderr=write,
            env={**os.environ, "MOEPOLICY_OFFLINE": "1"},
            timeout=120,
        )
    finally:
        os.close(write)
    assert done.returncode == 0
    assert out.exists() and run_cli("validate", str(out)).returncode == 0
