"""The conventions every command follows: -q, --log-level, --log-file, exit codes in --help, and
"did you mean" for a mistyped command or flag."""

import pytest

from conftest import run_cli


def test_quiet_leaves_only_warnings_and_errors(tmp_path):
    out = tmp_path / "p.yaml"
    loud = run_cli("plan", "--model", "Qwen3-30B-A3B-FP8", "--ep-size", "8", "-o", str(out))
    assert loud.returncode == 0 and "target:" in loud.stderr and "wrote" in loud.stderr
    quiet = run_cli("plan", "--model", "Qwen3-30B-A3B-FP8", "--ep-size", "8", "-o", str(out), "-q")
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    warned = run_cli("plan", "--model", "DeepSeek-V3", "--ep-size", "2", "-o", str(out), "-q")
    assert warned.returncode == 0 and warned.stderr.startswith(
        "warning:"
    )  # the weights do not fit


def test_log_file_keeps_the_tunes_lines_with_times(tmp_path):
    log = tmp_path / "tune.log"
    done = run_cli(
        "tune",
        "--model",
        "Qwen3-30B-A3B-FP8",
        "--ep-size",
        "2",
        "--bench",
        "model",
        "--tokens",
        "1024",
        "--storage",
        f"sqlite:///{tmp_path}/s.db",
        "-o",
        str(tmp_path / "p.yaml"),
        "-q",
        "--log-level",
        "info",
        "--log-file",
        str(log),
    )
    assert done.returncode == 0, done.stderr
    text = log.read_text()
    assert "moepolicy.tuning" in text and " INFO " in text
    assert done.stderr == ""  # -q: nothing on stderr, everything in the file


def test_the_log_file_gets_the_tunes_lines_not_its_progress_events(monkeypatch):
    import io
    import logging

    from moepolicy.cli import _output
    from moepolicy.cli._logging import Settings
    from moepolicy.tuning import progress

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    monkeypatch.setattr(Settings, "file_handler", handler)
    monkeypatch.setattr(Settings, "quiet", False)
    with _output.progress_to_stderr():  # stderr is not a terminal here: plain progress, no bar
        logging.getLogger("moepolicy.tuning").info("a tuning line")
        progress.phase("search", 3)
        progress.advance()
    assert stream.getvalue().splitlines() == ["moepolicy.tuning: a tuning line"]


def test_an_unopenable_log_file_is_one_line(tmp_path):
    done = run_cli("models", "--log-file", str(tmp_path / "no" / "such" / "x.log"))
    assert done.returncode == 8 and done.stderr.strip().startswith("moepolicy: --log-file")


def test_the_log_file_is_never_an_input_nor_a_fifo(tmp_path, write_config):
    """Pointed at what the command reads (the study journal, --model's config.json) or at a FIFO,
    --log-file is refused in one line before any work, and the input is left as it was."""
    import json
    import os

    folder = write_config(
        {"hidden_size": 2048, "num_hidden_layers": 2, "num_experts": 8, "num_experts_per_tok": 2}
    )
    config = folder / "config.json"
    before = config.read_text()
    done = run_cli("plan", "--model", str(folder), "--ep-size", "2", "--log-file", str(config))
    assert done.returncode == 8 and "which this command reads" in done.stderr, done.stderr
    assert config.read_text() == before and json.loads(before)
    journal = tmp_path / "studies.log"
    journal.write_text("")
    done = run_cli(
        "tune",
        "--model",
        "Qwen3-30B-A3B-FP8",
        "--ep-size",
        "2",
        "--bench",
        "model",
        "--storage",
        str(journal),
        "--log-file",
        str(journal),
        "-o",
        str(tmp_path / "p.yaml"),
    )
    assert done.returncode == 8 and "the study database" in done.stderr, done.stderr
    assert journal.read_text() == "" and not (tmp_path / "p.yaml").exists()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    done = run_cli("models", "--log-file", str(fifo))  # would block on open without a reader
    assert done.returncode == 8 and "is a FIFO" in done.stderr, done.stderr


def test_the_log_file_gets_file_sourced_text_escaped(tmp_path):
    import argparse
    import logging

    from moepolicy.cli import _logging

    log = tmp_path / "x.log"
    _logging.configure(argparse.Namespace(log_file=str(log), log_level="info", quiet=False))
    try:
        logging.getLogger("moepolicy.checkpoint").warning("model \x1b[2J\x07 \u202eevil")
    finally:
        _logging.configure(argparse.Namespace(log_file=None, log_level=None, quiet=False))
    text = log.read_text()
    assert "\\x1b[2J\\x07 \\u202eevil" in text and "\x1b" not in text and "\u202e" not in text


def test_help_lists_the_exit_codes():
    done = run_cli("--help")
    assert (
        "exit codes:" in done.stdout
        and "130 interrupted" in done.stdout
        and "  6 A policy file is missing or unreadable" in done.stdout
    )
    own = run_cli("validate", "--help").stdout  # the table once, in 'moepolicy --help'
    assert "exit codes: see 'moepolicy --help'" in own and "130 interrupted" not in own


def test_a_mistyped_command_gets_a_suggestion():
    done = run_cli("paln", "--model", "x")
    assert done.returncode == 2 and "(did you mean 'plan'?)" in done.stderr


@pytest.mark.parametrize(
    "args, said",
    [
        (("plan", "--modle", "X"), "unknown flag --modle: did you mean --model?"),
        (
            ("tune", "--ep-szie", "2", "--model", "X"),
            "unknown flag --ep-szie: did you mean --ep-size?",
        ),
        (  # a flag of another command, not close to any of this one's (never "--help")
            ("bench", "--model", "X"),
            "unknown flag --model: 'moepolicy bench' reads a policy file (moepolicy bench POLICY), "
            "which 'moepolicy tune --model MODEL -o POLICY' writes",
        ),
    ],
)
def test_a_mistyped_flag_gets_one_line_with_the_close_flag(args, said):
    """Not 'the following arguments are required: --model' (argparse checks that first) nor an
    'unrecognized arguments' line without a suggestion."""
    done = run_cli(*args)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"moepolicy: {said} (see 'moepolicy {args[0]} --help')"
    ]


@pytest.mark.parametrize("flag, value", [("--ep-size", "0"), ("--gpus-per-node", "two")])
def test_a_bad_count_is_refused_before_any_work(flag, value):
    """One line while the command line is read: no bench chosen, no default said, nothing planned."""
    done = run_cli("tune", "--model", "Qwen3-30B-A3B-FP8", flag, value)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"moepolicy: argument {flag}: must be a positive integer, got {value!r} "
        "(see 'moepolicy tune --help')"
    ]
