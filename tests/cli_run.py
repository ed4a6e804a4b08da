"""The ``moepolicy`` command line run in this process, seen as a test sees a subprocess.

:func:`run_in_process` calls ``moepolicy.cli.main.main(argv)`` (or ``moepolicy.testing.cli``'s
``main`` where a fake bench source is asked for) and returns a ``subprocess.CompletedProcess``: the
exit code (``SystemExit``'s too: argparse's 2, ``--help``'s 0), standard output and standard error
as text a pipe would have given (UTF-8, universal newlines, not a terminal), with the call's
environment, current folder and standard input. Starting an interpreter for each command was most of
the fast profile's time; the tests whose point is the process (signals, exit codes the interpreter
sets, pipes, terminals, start-up and import isolation) still run it as one
(``conftest.run_cli_process``), and ``tests/cli/test_in_process.py`` runs each command both ways.

Standard output and standard error are files for the call, at both levels: ``sys.stdout`` /
``sys.stderr`` and descriptors 1 and 2 (what a process the command starts, as bench's ranks, writes
there lands in the same place, in order, as it does in a subprocess's pipe).

What a command leaves behind in the process is put back after each call, so that no call sees
another's: the environment, the folder, the standard streams and descriptors, the signal handlers
and the unraisable-exception hook the CLI installs, ``sys.argv``, the root logger's handlers and
level, a library's stderr handler (optuna's), the CLI's logging settings (``cli._logging.Settings``,
its ``--log-file`` handler), ``tempfile``'s folder (read from ``TMPDIR`` once per process), what a
module says once per process (the runtime loader's warnings) and the warning filters.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import subprocess
import sys
import tempfile
import traceback
import warnings
from pathlib import Path
from typing import Iterator, Optional

# what a fresh interpreter starts with (this module is imported by conftest.py, before pytest's
# per-test warning capture replaces the filters and the way a warning is shown)
_PROCESS_WARNING_FILTERS = list(warnings.filters)
_SHOW_WARNING = warnings.showwarning
_SHOW_WARNING_IMPL = getattr(warnings, "_showwarnmsg_impl", None)

# what a module says once per process (a warning), emptied for each call and put back after it
_ONCE_PER_PROCESS = (
    ("moepolicy.runtime.loader", "_WARNED"),
    ("moepolicy.integrations.vllm.report", "_SAID"),
)

_SIGNALS = [signal.SIGINT, signal.SIGTERM] + ([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])


def run_in_process(
    *args: str,
    cwd: Path | str | None = None,
    env: dict | None = None,
    input: Optional[str] = None,
    fake_deepep: int = 0,
    model_bench_delay: float = 0.0,
) -> subprocess.CompletedProcess:
    """Run ``moepolicy ARGS`` in this process; the result as ``subprocess.run(..., text=True,
    capture_output=True)`` gives it, ``env`` added to this process's environment as
    ``conftest.run_cli_process`` adds it."""
    argv = [str(a) for a in args]
    out, err = _pipe("strict"), _pipe("backslashreplace")
    with contextlib.ExitStack() as stack:
        stack.enter_context(_environment(env, cwd))
        stack.enter_context(_process_state(argv))
        stack.enter_context(_logging_state(err))
        stack.enter_context(_standard_streams(out, err, input))
        code = _exit_status(argv, fake_deepep, model_bench_delay, err)
    return subprocess.CompletedProcess(
        ["moepolicy", *argv], code, stdout=_read_back(out), stderr=_read_back(err)
    )


def _exit_status(argv: list[str], fake_deepep: int, model_bench_delay: float, err) -> int:
    """The code the process would exit with; what the interpreter prints on stderr where it would."""
    try:
        code = _run_main(argv, fake_deepep, model_bench_delay)
        code = 0 if code is None else int(code) & 0xFF
    except SystemExit as exc:
        code = _system_exit_code(exc, err)
    except KeyboardInterrupt:
        traceback.print_exc(file=err)
        code = 130
    except BaseException:  # noqa: BLE001 (what the interpreter does: a traceback, exit 1)
        traceback.print_exc(file=err)
        code = 1
    for stream in (sys.stdout, sys.stderr):  # the interpreter's last flush
        try:
            stream.flush()
        except Exception as exc:  # noqa: BLE001
            print(f"Exception ignored on flushing sys.stdout: {exc!r}", file=err)
            code = code or 120
    return code


def _run_main(argv: list[str], fake_deepep: int, model_bench_delay: float) -> Optional[int]:
    if not fake_deepep and not model_bench_delay:
        from moepolicy.cli.main import main

        return main(argv)
    from moepolicy.testing.cli import main as testing_main

    fakes = ["--fake-deepep", str(fake_deepep), "--model-bench-delay", str(model_bench_delay)]
    return testing_main([*fakes, "--", *argv])


def _system_exit_code(exc: SystemExit, stderr) -> int:
    """The code the interpreter exits with for ``SystemExit(exc.code)`` (a message: printed, 1)."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=stderr)
    return 1


# ------------------------------------------------------------------------------------ standard streams
def _pipe(errors: str) -> io.TextIOWrapper:
    """A text stream over an unnamed temporary file, written through (no buffer of its own, so that
    what this process and its children write to it stays in order): a real descriptor, not a
    terminal, UTF-8 as the pipe of a test's subprocess is."""
    raw = tempfile.TemporaryFile(buffering=0)
    return io.TextIOWrapper(raw, encoding="utf-8", errors=errors, write_through=True)


def _read_back(stream: io.TextIOWrapper) -> str:
    """What was written, decoded as ``subprocess.run(text=True)`` decodes a pipe (universal
    newlines: ``\\r\\n`` and ``\\r`` read as ``\\n``)."""
    with contextlib.suppress(OSError, ValueError):
        stream.flush()
    raw = stream.buffer
    raw.seek(0)
    data = raw.read()
    stream.close()
    return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")


@contextlib.contextmanager
def _standard_streams(out: io.TextIOWrapper, err: io.TextIOWrapper, text: Optional[str]):
    """``out`` and ``err`` as sys.stdout / sys.stderr (and ``sys.__stdout__`` / ``__stderr__``,
    which the CLI points at /dev/null when a reader left) and as descriptors 1 and 2; ``text`` (or
    nothing) on standard input."""
    saved = (sys.stdin, sys.stdout, sys.stderr, sys.__stdin__, sys.__stdout__, sys.__stderr__)
    for stream in saved[1:3]:
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    saved_fds = os.dup(1), os.dup(2)
    if text is None:  # as a test's subprocess, which reads nothing a person types
        stdin = open(os.devnull, encoding="utf-8")
    else:
        stdin = io.TextIOWrapper(io.BytesIO(text.encode("utf-8")), encoding="utf-8")
    try:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        sys.stdin = sys.__stdin__ = stdin
        sys.stdout = sys.__stdout__ = out
        sys.stderr = sys.__stderr__ = err
        yield
    finally:
        (sys.stdin, sys.stdout, sys.stderr, sys.__stdin__, sys.__stdout__, sys.__stderr__) = saved
        os.dup2(saved_fds[0], 1)
        os.dup2(saved_fds[1], 2)
        os.close(saved_fds[0])
        os.close(saved_fds[1])
        stdin.close()


# ---------------------------------------------------------------------------------- process state
@contextlib.contextmanager
def _environment(env: Optional[dict], cwd) -> Iterator[None]:
    """This process's environment with ``env`` (and offline, as every test's CLI), in ``cwd``."""
    saved_environ, saved_cwd = dict(os.environ), os.getcwd()
    try:
        os.environ.update({"MOEPOLICY_OFFLINE": "1", **(env or {})})
        if cwd is not None:
            os.chdir(cwd)
        yield
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_environ)


@contextlib.contextmanager
def _process_state(argv: list[str]) -> Iterator[None]:
    """``sys.argv``, the signal handlers and the unraisable hook the CLI installs, ``tempfile``'s
    folder, the once-per-process sayings and the warning filters, fresh for the call and put back."""
    saved_argv, saved_tempdir = sys.argv, tempfile.tempdir
    saved_handlers = {s: signal.getsignal(s) for s in _SIGNALS}
    saved_unraisable = sys.unraisablehook
    said_once = [
        (said, set(said))
        for module, name in _ONCE_PER_PROCESS
        if (said := getattr(sys.modules.get(module), name, None)) is not None
    ]
    with warnings.catch_warnings():
        warnings.filters[:] = _PROCESS_WARNING_FILTERS
        warnings.showwarning = _SHOW_WARNING
        if _SHOW_WARNING_IMPL is not None:
            warnings._showwarnmsg_impl = _SHOW_WARNING_IMPL
        warnings._filters_mutated()
        try:
            sys.argv = ["moepolicy", *argv]
            tempfile.tempdir = None  # read from TMPDIR again, as a new process does
            for said, _ in said_once:
                said.clear()
            yield
        finally:
            sys.argv, tempfile.tempdir = saved_argv, saved_tempdir
            for signum, handler in saved_handlers.items():
                signal.signal(signum, handler)
            sys.unraisablehook = saved_unraisable
            for said, before in said_once:
                said.clear()
                said.update(before)


# ------------------------------------------------------------------------------------------ logging
@contextlib.contextmanager
def _logging_state(err) -> Iterator[None]:
    """No root handler (pytest's capture handlers stand aside, so the CLI installs its stderr
    handler as in a new process), every library stderr handler writing to ``err``, the CLI's
    logging settings fresh; all put back after the call."""
    from moepolicy.cli import _logging

    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    stderr = sys.__stderr__  # the process's, for a handler made during the call
    saved_streams = {h: h.stream for h in _stream_handlers()}
    try:
        for handler in saved_streams:
            handler.stream = err
        root.handlers = []
        _reset_logging_settings(_logging)
        yield
    finally:
        _reset_logging_settings(_logging)
        for handler in root.handlers:
            if handler not in saved_handlers:
                handler.close()
        root.handlers = saved_handlers
        root.setLevel(saved_level)
        for handler in _stream_handlers():  # one made during the call held this call's stderr
            handler.stream = saved_streams.get(handler, stderr)


def _stream_handlers() -> list[logging.StreamHandler]:
    """Every plain ``logging.StreamHandler`` alive (a library's, as optuna's stderr handler)."""
    alive = (ref() for ref in list(logging._handlerList))  # weak references to every handler made
    return [h for h in alive if h is not None and type(h) is logging.StreamHandler]


def _reset_logging_settings(_logging) -> None:
    """The CLI's logging choices as a fresh process starts with them (its log file closed)."""
    settings = _logging.Settings
    if settings.file_handler is not None:
        logging.getLogger().removeHandler(settings.file_handler)
        settings.file_handler.close()
    settings.quiet, settings.level, settings.file_handler = False, logging.WARNING, None
