"""What every command shows on stderr, and where its log goes: ``-q``, ``--log-level``, ``--log-file``.

- ``-q`` / ``--quiet``: only warnings and errors (no target line, no progress, no "wrote ...").
- ``--log-level debug|info|warning|error``: the log records shown on stderr (default ``warning``;
  ``tune`` shows its own progress at ``info`` unless ``-q``; ``debug`` adds a line per trial).
- ``--log-file FILE``: every record at that level or above also appended to ``FILE``, with times and
  logger names (a long tune's record).

Library records (SQLAlchemy's, optuna's) reach stderr as Python's last-resort handler prints them,
except a record of an interrupt, which the CLI reports itself in one line.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Optional

from moepolicy.errors import OutputError

LEVELS = ("debug", "info", "warning", "error")


class Settings:
    """This process's choice (the CLI runs one command per process; tests run several: reset each time)."""

    quiet = False
    level = logging.WARNING
    file_handler: Optional[logging.Handler] = None


def add_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("output and logging")
    group.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="only warnings and errors on stderr (no target line, progress or 'wrote' lines)",
    )
    group.add_argument(
        "--log-level",
        choices=LEVELS,
        default=None,
        help="log records shown on stderr (default warning; tune's progress shows at info unless -q; "
        "debug: a line per trial)",
    )
    group.add_argument(
        "--log-file",
        metavar="FILE",
        help="also append every log record at --log-level or above to FILE, with times",
    )


def configure(args: argparse.Namespace) -> None:
    """Apply ``args``' choices: stderr's level, the log file, quiet notes."""
    Settings.quiet = bool(getattr(args, "quiet", False))
    name = getattr(args, "log_level", None)
    Settings.level = getattr(logging, name.upper()) if name else logging.WARNING
    root = logging.getLogger()
    for handler in root.handlers:
        if isinstance(handler, LastResortWithoutInterrupts):  # -q: warnings and errors only
            handler.setLevel(
                max(Settings.level, logging.WARNING) if Settings.quiet else Settings.level
            )
    if Settings.file_handler is not None:
        root.removeHandler(Settings.file_handler)
        Settings.file_handler.close()
        Settings.file_handler = None
    path = getattr(args, "log_file", None)
    if path:
        try:
            handler = logging.FileHandler(path, encoding="utf-8")
        except OSError as exc:
            raise OutputError(
                f"--log-file {path}: cannot be opened for appending ({exc.strerror or exc})",
                field="log_file",
            ) from None
        handler.setLevel(Settings.level)
        handler.setFormatter(
            _PrintableFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
        )
        root.addHandler(handler)
        Settings.file_handler = handler
    if Settings.level < root.getEffectiveLevel():
        root.setLevel(Settings.level)


class _PrintableFormatter(logging.Formatter):
    """Log-file lines with control characters escaped (``\\x1b``): file-sourced text (a rule's
    ``why``, a model name) cannot rewrite a terminal that later shows the log."""

    def format(self, record) -> str:
        from moepolicy.text import printable

        return printable(super().format(record))


class LastResortWithoutInterrupts(logging.Handler):
    """Records on stderr as Python's last-resort handler prints them (``sys.stderr`` at emit time),
    except a record of an interrupt: SQLAlchemy logs "Exception during reset or similar" with a
    traceback when Ctrl-C lands while a connection is checked in, and the CLI says it in one line."""

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and isinstance(record.exc_info[1], KeyboardInterrupt):
            return
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # noqa: BLE001 (as logging's own handlers: never let a log line fail a command)
            self.handleError(record)


def log_to_stderr() -> None:
    """The root logger's stderr handler, installed once (a root logger configured by whoever embeds
    the CLI stands)."""
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(LastResortWithoutInterrupts(logging.WARNING))
