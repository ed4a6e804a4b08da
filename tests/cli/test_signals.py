"""Ctrl-C and SIGTERM end every command with one line and the shell's exit code, wherever the
signal lands. Each case delivers the signal at a chosen point of a command, deterministically (the
process signals itself), in a process of its own, started as ``python -m`` starts the CLI (under
``-m`` CPython checks, after the program's exit, whether a KeyboardInterrupt went unhandled)."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from conftest import Watched

# A command stand-in: the CLI's real main(), with the command's work replaced by ``WORK``.
DRIVER = textwrap.dedent("""
    import argparse, sys
    import moepolicy.cli.main as cli

    WORK = {work!r}

    def build_parser(argv=None):
        parser = argparse.ArgumentParser()
        parser.set_defaults(command="stand-in", run=lambda args: exec(WORK, {{}}))
        return parser

    cli.build_parser = build_parser
    sys.exit(cli.main([]))
""")


@pytest.fixture
def driver(tmp_path):
    """The stand-in's command line and environment, doing ``work``."""

    def made(work: str) -> tuple[list[str], dict]:
        (tmp_path / "signal_driver.py").write_text(DRIVER.format(work=textwrap.dedent(work)))
        path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
        return [sys.executable, "-m", "signal_driver"], {**os.environ, "PYTHONPATH": path}

    return made


@pytest.fixture
def run_driver(driver):
    def run(work: str) -> subprocess.CompletedProcess:
        args, env = driver(work)
        return subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)

    return run


@pytest.mark.parametrize(
    "sig, code, line",
    [
        ("SIGINT", 130, "moepolicy: interrupted"),
        ("SIGTERM", 143, "moepolicy: terminated"),
        ("SIGHUP", 129, "moepolicy: hung up"),
    ],
)
def test_a_signal_inside_execd_code_exits_with_its_code_not_by_the_signal(
    run_driver, sig, code, line
):
    """CPython ends the interpreter by SIGINT when a plain KeyboardInterrupt escaped code run by
    ``exec`` (``dataclasses`` runs exec while the commands import), even after the CLI handled it."""
    done = run_driver(f"""
        import os, signal
        exec("os.kill(os.getpid(), signal.{sig})\\nfor _ in range(10 ** 7): pass",
             {{"os": os, "signal": signal}})
    """)
    assert done.returncode == code, (done.returncode, done.stderr)
    assert done.stderr.strip().splitlines() == [line]


def test_an_interrupt_turned_into_another_exception_while_importing_ends_as_the_interrupt(
    run_driver,
):
    """Ctrl-C inside a class body being built surfaces as RuntimeError ('Error calling
    __set_name__'), inside a compiled extension's import as its own error: still exit 130, one line."""
    done = run_driver("""
        import os, signal
        class Field:
            def __set_name__(self, owner, name):
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(10 ** 7): pass
        class Built:
            works = Field()
    """)
    assert done.returncode == 130, (done.returncode, done.stderr)
    assert done.stderr.strip().splitlines() == ["moepolicy: interrupted"]


def test_a_librarys_log_record_of_the_interrupt_is_not_printed(run_driver):
    """SQLAlchemy logs 'Exception during reset or similar' with the interrupt's traceback when
    Ctrl-C lands while a connection is checked in; the CLI reports the interrupt once, in one line."""
    done = run_driver("""
        import logging, os, signal
        try:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(10 ** 7): pass
        except BaseException:
            logging.getLogger("sqlalchemy.pool.impl.QueuePool").error(
                "Exception during reset or similar", exc_info=True)
            raise
    """)
    assert done.returncode == 130, (done.returncode, done.stderr)
    assert done.stderr.strip().splitlines() == ["moepolicy: interrupted"]


def test_other_library_records_still_reach_stderr(run_driver):
    done = run_driver("""
        import logging
        logging.getLogger("optuna.storages").warning("a library warning")
    """)
    assert done.returncode == 0, done.stderr
    assert "a library warning" in done.stderr


def test_an_interrupt_that_lands_in_a_weakref_callback_is_delivered_again(run_driver):
    """Python cannot raise from a weakref callback or ``__del__`` (it prints 'Exception ignored' and
    goes on): the interrupt must still end the command, in one line."""
    done = run_driver("""
        import os, signal, weakref
        class Owner:
            pass
        def callback(ref):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(10 ** 6): pass
        owner = Owner()
        ref = weakref.ref(owner, callback)
        del owner
        for _ in range(10 ** 8): pass
    """)
    assert done.returncode == 130, (done.returncode, done.stderr)
    assert done.stderr.strip().splitlines() == ["moepolicy: interrupted"]


def test_ctrl_c_after_the_output_was_written_says_the_file_is_whole(driver, tmp_path):
    """A command that wrote its file (a tune's "wrote policy.yaml") and is then interrupted still
    exits 130 (the user asked to stop: a script's next step does not run), and its last line says the
    file was written whole, not a bare 'interrupted' that reads as lost work."""
    out = tmp_path / "policy.yaml"
    args, env = driver(f"""
        import time
        from moepolicy.cli._output import write_output
        write_output({str(out)!r}, "schema_version: '2.4'\\n", "48 layers")
        time.sleep(120)  # the command's work after its write (a tune's exit)
    """)
    proc = Watched(args, env=env)
    proc.wait_for(r"^wrote ")
    proc.proc.send_signal(signal.SIGINT)
    err = proc.finish()
    assert proc.returncode == 130, (proc.returncode, err)
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"moepolicy: interrupted after writing {out} (48 layers)"), err
    assert "whole" in last and "Traceback" not in err
    assert out.read_text() == "schema_version: '2.4'\n"
