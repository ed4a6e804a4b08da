"""The tests run the CLI in their own process (``conftest.run_cli``, ``cli_run.run_in_process``):
each command once more as a process of its own (``python -m moepolicy``), giving what the in-process
run gives, and what the in-process run must leave as it found it."""

import logging
import os
import re
import signal
import sys
import tempfile
import warnings

import pytest

from conftest import run_cli, run_cli_process

MODEL = "Qwen3-30B-A3B-FP8"


@pytest.fixture(scope="module")
def policies(tmp_path_factory):
    """A planned and a tuned (model bench) policy, written in-process."""
    folder = tmp_path_factory.mktemp("policies")
    planned, tuned = folder / "p.yaml", folder / "t.yaml"
    done = run_cli("plan", "--model", MODEL, "--ep-size", "2", "--gpu", "h200", "-o", str(planned))
    assert done.returncode == 0, done.stderr
    done = run_cli(
        *("tune", "--model", MODEL, "--ep-size", "2", "--gpu", "h200", "--bench", "model"),
        *("--trials", "1", "--tokens", "128", "--storage", f"sqlite:///{folder}/s.db"),
        *("-o", str(tuned)),
    )
    assert done.returncode == 0, done.stderr
    return folder


def _commands(folder, out):
    """One run of each command that ends in its work (exit 0), writing its files under ``out``."""
    policy, tuned = str(folder / "p.yaml"), str(folder / "t.yaml")
    storage = f"sqlite:///{out}/s.db"
    return {
        "models": ["models"],
        "plan": [
            "plan",
            "--model",
            MODEL,
            "--ep-size",
            "2",
            "--gpu",
            "h200",
            "-o",
            f"{out}/p.yaml",
        ],
        "explain": [
            "explain",
            "--model",
            MODEL,
            "--ep-size",
            "2",
            "--gpu",
            "h200",
            "--layer",
            "0",
        ],
        "audit": ["audit", tuned],
        "validate": ["validate", tuned, "--model", MODEL, "--ep-size", "2"],
        "export": ["export", tuned, "--to", "vllm", "--format", "json"],
        "tune": [
            *("tune", "--model", MODEL, "--ep-size", "2", "--gpu", "h200", "--bench", "model"),
            *("--trials", "1", "--tokens", "128", "--storage", storage, "-o", f"{out}/t.yaml"),
        ],
        "studies": ["studies", "--storage", f"sqlite:///{folder}/s.db", "--format", "json"],
        "bench": ["bench", policy, "--transport", "emulated", "--dry-run"],
        "report": ["report", tuned, f"{out}/plots"],
        "doctor": ["doctor", "--format", "json"],
    }


def _same(text: str) -> str:
    """Output with what changes from run to run (times, durations, temporary names) masked, and
    where the package lies: a process runs the installed one, the test process may import the
    checkout's (``python -m pytest`` puts the working folder first on ``sys.path``)."""
    return re.sub(r"\d+(\.\d+)?", "N", re.sub(r"\S*/moepolicy/", "PKG/", text))


@pytest.mark.parametrize(
    "command",
    ["models", "plan", "explain", "audit", "validate", "export", "tune", "studies", "bench"]
    + ["report", "doctor"],
)
def test_each_command_as_a_process_says_what_it_says_in_process(policies, tmp_path, command):
    from moepolicy.cli.main import _COMMANDS

    assert set(_COMMANDS) <= {*_commands(policies, tmp_path)}  # every command has its smoke run
    own, inside = tmp_path / "process", tmp_path / "inside"
    own.mkdir()
    inside.mkdir()
    process = run_cli_process(*_commands(policies, own)[command], cwd=own)
    here = run_cli(*_commands(policies, inside)[command], cwd=inside)
    assert process.returncode == here.returncode == 0, (process.stderr, here.stderr)
    assert _same(process.stdout.replace(str(own), "OUT")) == _same(
        here.stdout.replace(str(inside), "OUT")
    )
    assert _same(process.stderr.replace(str(own), "OUT")) == _same(
        here.stderr.replace(str(inside), "OUT")
    )
    assert sorted(p.name for p in own.iterdir()) == sorted(p.name for p in inside.iterdir())


def test_a_usage_error_and_help_exit_as_the_process_does():
    for args, code in ((("plan", "--ep-size", "x"), 2), (("--help",), 0), (("nosuch",), 2)):
        here, process = run_cli(*args), run_cli_process(*args)
        assert here.returncode == process.returncode == code
        assert (here.stdout, here.stderr) == (process.stdout, process.stderr)


def test_a_call_leaves_the_process_as_it_found_it(tmp_path):
    root = logging.getLogger()
    before = (
        dict(os.environ),
        os.getcwd(),
        (sys.stdin, sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__),
        [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)],
        sys.unraisablehook,
        (root.handlers[:], root.level),
        list(warnings.filters),
        tempfile.tempdir,
    )
    done = run_cli(
        *("tune", "--model", MODEL, "--ep-size", "2", "--bench", "model", "--trials", "1"),
        *("--tokens", "128", "--storage", f"sqlite:///{tmp_path}/s.db", "-o", "t.yaml"),
        *("--log-level", "debug", "--log-file", str(tmp_path / "log.txt")),
        cwd=tmp_path,
        env={"TMPDIR": str(tmp_path), "MOEPOLICY_SOME_SETTING": "1"},
    )
    assert done.returncode == 0 and (tmp_path / "t.yaml").exists(), done.stderr
    after = (
        dict(os.environ),
        os.getcwd(),
        (sys.stdin, sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__),
        [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)],
        sys.unraisablehook,
        (root.handlers[:], root.level),
        list(warnings.filters),
        tempfile.tempdir,
    )
    assert after == before
    from moepolicy.cli._logging import Settings

    assert (Settings.quiet, Settings.level, Settings.file_handler) == (
        False,
        logging.WARNING,
        None,
    )


def test_what_one_call_chose_never_reaches_the_next(tmp_path):
    """-q and --log-level of one call, and a warning the runtime says once per process, are not
    carried into the next call."""
    policy = tmp_path / "p.yaml"
    quiet = run_cli("plan", "--model", MODEL, "--ep-size", "2", "-o", str(policy), "-q")
    assert quiet.returncode == 0 and quiet.stderr == ""
    loud = run_cli("plan", "--model", MODEL, "--ep-size", "2", "-o", str(policy))
    assert loud.returncode == 0 and f"wrote {policy}" in loud.stderr
    said = [
        run_cli("validate", str(policy), "--model", "DeepSeek-V3", "--ep-size", "2") for _ in "ab"
    ]
    assert said[0].stderr == said[1].stderr and said[0].returncode == said[1].returncode
