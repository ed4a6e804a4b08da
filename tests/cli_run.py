"""The ``moepolicy`` command line run in this process, seen as a test sees a subprocess.

:func:`run_in_process` calls ``moepolicy.cli.main.main(argv)`` (or ``moepolicy.testing.cli``'s
``main`` where a fake bench source is asked for) and returns a ``subprocess.CompletedProcess``: the
exit code (``SystemExit``'s too: argparse's 2, ``--help``'s 0), standard output and standard error
as text a pipe would have given (UTF-8, universal newlines, not a terminal), with the call's
environment, current folder and standard input. Starting an interpreter for each command was most of
the fast profile's time; the tests whose point is the process (signals, exit codes the interpreter
sets, pipes, start-up and import isolation) still run it as one (``conftest.run_cli_process``).

What a command leaves behind in the process is put back after each call, so that no call sees
another's: the environment, the folder, the standard streams, the signal handlers and the
unraisable-exception hook the CLI installs, the root logger's handlers and level and the CLI's
logging settings (``cli._logging.Settings``, its ``--log-file`` handler), ``tempfile``'s folder
(read from ``TMPDIR`` once per process), what a module says once per process (the runtime
loader's warnings) and the warning filters.
"""

from __future__ import annotations

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
from typing import Optional

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


def _pipe(errors: str) -> io.TextIOWrapper:
    """A text stream over an unnamed temporary file: a real descriptor (``fileno()`` works, as the
    CLI's broken-pipe and full-disk handling uses it), not a terminal, UTF-8 as the pipe of a test's
    subprocess is."""
    return io.TextIOWrapper(
        tempfile.TemporaryFile(), encoding="utf-8", errors=errors, line_buffering=False
    )


def _read_back(stream: io.TextIOWrapper) -> str:
    """What was written, decoded as ``subprocess.run(text=True)`` decodes a pipe (universal
    newlines: ``\\r\\n`` and ``\\r`` read as ``\\n``)."""
    try:
        stream.flush()
    except (OSError, ValueError):
        pass
    raw = stream.buffer.raw if hasattr(stream.buffer, "raw") else stream.buffer
    raw.seek(0)
    data = raw.read()
    stream.close()
    return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")


def _stdin(text: Optional[str]) -> io.TextIOBase:
    if text is None:  # as a test's subprocess, which reads nothing a person types
        return open(os.devnull, encoding="utf-8")
    return io.TextIOWrapper(io.BytesIO(text.encode("utf-8")), encoding="utf-8")


def _exit_code(exc: SystemExit, stderr) -> int:
    """The code the interpreter would exit with for ``SystemExit(exc.code)``."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=stderr)
    return 1


def _run_main(argv: list[str], fake_deepep: int, model_bench_delay: float) -> int:
    if not fake_deepep and not model_bench_delay:
        from moepolicy.cli.main import main

        return main(argv)
    from moepolicy.testing.cli import main as testing_main

    return testing_main(
        [
            "--fake-deepep",
            str(fake_deepep),
            "--model-bench-delay",
            str(model_bench_delay),
            "--",
            *argv,
        ]
    )


def run_in_process(
    *args: str,
    cwd: Path | str | None = None,
    env: dict | None = None,
    input: Optional[str] = None,
    fake_deepep: int = 0,
    model_bench_delay: float = 0.0,
) -> subprocess.CompletedProcess:
    """Run ``moepolicy ARGS`` in this process; the result as ``subprocess.run(..., text=True,
    capture_output=True)`` would give it (``args`` is the command line the test asked for)."""
    from moepolicy.cli import _logging

    argv = [str(a) for a in args]
    saved_environ = dict(os.environ)
    saved_cwd = os.getcwd()
    saved_streams = (
        sys.stdin,
        sys.stdout,
        sys.stderr,
        sys.__stdin__,
        sys.__stdout__,
        sys.__stderr__,
    )
    saved_argv = sys.argv
    saved_tempdir = tempfile.tempdir  # read from TMPDIR once per process, then kept
    said_once = [
        (said, set(said))
        for module, name in _ONCE_PER_PROCESS
        if (said := getattr(sys.modules.get(module), name, None)) is not None
    ]
    saved_handlers = {s: signal.getsignal(s) for s in _SIGNALS}
    saved_unraisable = sys.unraisablehook
    root = logging.getLogger()
    saved_root = (root.handlers[:], root.level)
    # a library's own stderr handler (optuna's) holds the stderr of when it was made: this call's
    saved_handler_streams = {h: h.stream for h in _stream_handlers()}

    out, err = _pipe("strict"), _pipe("backslashreplace")
    stdin = _stdin(input)
    code = 1
    with warnings.catch_warnings():
        warnings.filters[:] = _PROCESS_WARNING_FILTERS
        warnings.showwarning = _SHOW_WARNING
        if _SHOW_WARNING_IMPL is not None:
            warnings._showwarnmsg_impl = _SHOW_WARNING_IMPL
        warnings._filters_mutated()
        try:
            os.environ.update({"MOEPOLICY_OFFLINE": "1", **(env or {})})
            if cwd is not None:
                os.chdir(cwd)
            sys.argv = ["moepolicy", *argv]
            tempfile.tempdir = None
            for said, _ in said_once:
                said.clear()
            sys.stdin = sys.__stdin__ = stdin
            sys.stdout = sys.__stdout__ = out
            sys.stderr = sys.__stderr__ = err
            for handler in saved_handler_streams:
                handler.stream = err
            root.handlers = []  # pytest's capture handlers: the CLI installs its stderr handler
            _reset_logging_settings(_logging)
            try:
                code = _run_main(argv, fake_deepep, model_bench_delay)
                code = 0 if code is None else int(code) & 0xFF
            except SystemExit as exc:
                code = _exit_code(exc, err)
            except KeyboardInterrupt:
                traceback.print_exc(file=err)
                code = 130
            except BaseException:  # noqa: BLE001 (what the interpreter prints: a traceback, exit 1)
                traceback.print_exc(file=err)
                code = 1
            for stream in (sys.stdout, sys.stderr):  # the interpreter's last flush
                try:
                    stream.flush()
                except Exception as exc:  # noqa: BLE001
                    print(f"Exception ignored on flushing: {exc!r}", file=err)
                    code = code or 120
        finally:
            _reset_logging_settings(_logging)
            for handler in root.handlers:
                if handler not in saved_root[0]:
                    handler.close()
            root.handlers = saved_root[0]
            root.setLevel(saved_root[1])
            for handler in _stream_handlers():  # one made during the call held this call's stderr
                handler.stream = saved_handler_streams.get(handler, saved_streams[5])
            (
                sys.stdin,
                sys.stdout,
                sys.stderr,
                sys.__stdin__,
                sys.__stdout__,
                sys.__stderr__,
            ) = saved_streams
            sys.argv = saved_argv
            tempfile.tempdir = saved_tempdir
            for said, before in said_once:
                said.clear()
                said.update(before)
            for signum, handler in saved_handlers.items():
                signal.signal(signum, handler)
            sys.unraisablehook = saved_unraisable
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_environ)
    stdin.close()
    return subprocess.CompletedProcess(
        ["moepolicy", *argv], code, stdout=_read_back(out), stderr=_read_back(err)
    )


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
