"""Small helpers for printing tables and writing files from commands.

Every command's ``-o`` goes through :func:`add_output_flag`, :func:`output_path` and
:func:`write_output`: ``-o FILE`` is written atomically (a symbolic link written through), ``-o -``
is standard output, and a path that names one of the command's own inputs (the policy, a rule pack,
the checkpoint's files, the study database), by name, link or inode, is refused before any work.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Optional, Sequence, Union

from moepolicy.cli._logging import Settings
from moepolicy.errors import MoePolicyError, OutputError, carry
from moepolicy.files import atomic_write, same_file, write_target
from moepolicy.text import printable
from moepolicy.tuning.storage import storage_file

STDOUT = "-"
# a file a command reads, as (what it is, its path; None: not given)
Input = tuple[str, Union[str, "os.PathLike[str]", None]]


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], out=None) -> None:
    """A plain-text table on ``out`` (stdout by default); a table on stderr is a note (``-q`` hides it)."""
    out = out or sys.stdout
    if Settings.quiet and out is sys.stderr:
        return
    cells = [[str(c) for c in row] for row in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
        for i, h in enumerate(headers)
    ]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip(), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip(), file=out)


def add_format_flag(p) -> None:
    """``--format table|json``: what a listing command prints (json: one document on stdout)."""
    p.add_argument(
        "--format",
        choices=["table", "json"],
        default="table",
        help="table (default, for people) or json (one document on standard output, for programs)",
    )


def print_json(value) -> None:
    import json

    print(json.dumps(value, indent=2, default=str))


def note(message: str) -> None:
    """A line for the user on stderr (progress, the target used, warnings); with ``-q`` only warnings."""
    if Settings.quiet and not message.startswith("warning"):
        return
    print(message, file=sys.stderr, flush=True)


class progress_to_stderr:
    """While the block runs, show the ``moepolicy.tuning`` logger's lines on stderr and draw one
    progress bar per phase (with ETA) from ``moepolicy.tuning.progress`` events; with ``verbose``,
    per-trial lines (DEBUG) instead of bars."""

    def __init__(self, verbose: bool = False):
        self.verbose = verbose

    def __enter__(self):
        self._loggers = []
        verbose = self.verbose or Settings.level <= logging.DEBUG
        if Settings.quiet:  # -q: no progress; warnings still reach stderr through the root logger
            return self
        bars = _Bars() if not verbose and sys.stderr.isatty() else None
        self._attach("moepolicy.tuning", _Lines(bars), logging.DEBUG if verbose else logging.INFO)
        if bars is not None:
            self._attach("moepolicy.tuning.progress", bars, logging.INFO, log_file=False)
        elif not verbose:  # a log file, a pipe, CI: no bar, but a long phase still shows it moves
            self._attach(
                "moepolicy.tuning.progress", _PlainProgress(), logging.INFO, log_file=False
            )
        return self

    def _attach(self, name: str, handler, level: int, log_file: bool = True) -> None:
        logger = logging.getLogger(name)
        self._loggers.append((logger, handler, logger.level, logger.propagate))
        logger.addHandler(handler)
        logger.setLevel(level)
        logger.propagate = False
        if (
            log_file
            and Settings.file_handler is not None
            and Settings.file_handler not in logger.handlers
        ):
            logger.addHandler(Settings.file_handler)  # --log-file keeps the tuning lines too
            self._loggers.append((logger, Settings.file_handler, logger.level, False))

    def __exit__(self, *exc) -> None:
        for logger, handler, level, propagate in reversed(self._loggers):
            logger.removeHandler(handler)
            if handler is not Settings.file_handler:
                handler.close()
            logger.setLevel(level)
            logger.propagate = propagate


def _terminal():
    """The terminal behind stderr: bars are drawn with carriage returns, which ``SafeStream`` would
    escape (the bars' text is ours, never file-sourced)."""
    return getattr(sys.stderr, "_raw", sys.stderr)


class _Lines(logging.Handler):
    """The tuning log's lines on stderr, above the progress bar while one is drawn."""

    def __init__(self, bars: "Optional[_Bars]"):
        super().__init__()
        self.bars = bars
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record) -> None:
        line = self.format(record)
        if self.bars is not None and self.bars.active:
            from tqdm import tqdm

            tqdm.write(printable(line), file=_terminal())
        else:
            print(line, file=sys.stderr, flush=True)


class _Bars(logging.Handler):
    """A logging handler that turns progress events into tqdm bars, one per phase."""

    def __init__(self):
        super().__init__()
        self._bar = None

    def emit(self, record) -> None:
        from tqdm import tqdm

        if hasattr(record, "phase"):
            if self._bar is not None:
                self._bar.close()
            self._bar = tqdm(
                total=record.total,
                desc=record.phase,
                unit="step",
                file=_terminal(),
                leave=False,
                dynamic_ncols=True,
            )
        elif hasattr(record, "advance") and self._bar is not None:
            self._bar.update(record.advance)

    @property
    def active(self) -> bool:
        return self._bar is not None

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        super().close()


class _PlainProgress(logging.Handler):
    """Progress without a terminal: a line at most every ``every_s`` seconds (none for a short run),
    with the phase, its steps done and, once a step is done, the time its remaining steps should take."""

    every_s = 30.0

    def __init__(self):
        super().__init__()
        self._last = time.monotonic()
        self._phase, self._total, self._done, self._began = None, 0, 0, self._last

    def emit(self, record) -> None:
        now = time.monotonic()
        if hasattr(record, "phase"):
            self._phase, self._total, self._done, self._began = record.phase, record.total, 0, now
        elif hasattr(record, "advance"):
            self._done += record.advance
        if self._phase is None or now - self._last < self.every_s:
            return
        self._last = now
        took = now - self._began
        left = ""
        if 0 < self._done < self._total:
            left = f", about {took / self._done * (self._total - self._done):.0f} s left"
        print(
            f"  {self._phase}: {self._done}/{self._total} steps in {took:.0f} s{left}",
            file=sys.stderr,
            flush=True,
        )


class SafeStream:
    """A text stream that writes control characters escaped (``\\x1b``): file-sourced text (a rule's
    ``why``, a model name, a reason) cannot move the cursor, recolour or rewrite the terminal.

    An ``OSError`` from writing or flushing it is marked with the stream's name
    (``exc.moepolicy_stream``), so the CLI says "cannot write to standard output" only for that. A
    reader that left (``moepolicy tune ... 2>&1 | head``: a broken pipe) ends what the stream shows,
    not the command: the stream goes to /dev/null and the work goes on (a tune's ``-o`` is written)."""

    def __init__(self, raw, name: str = "standard output"):
        self._raw = raw
        self._name = name

    def write(self, text: str) -> int:
        try:
            return self._raw.write(printable(text))
        except BrokenPipeError:
            self._reader_left()
            return len(text)
        except OSError as exc:
            carry(exc, moepolicy_stream=self._name)
            raise

    def flush(self) -> None:
        try:
            self._raw.flush()
        except BrokenPipeError:
            self._reader_left()
        except OSError as exc:
            carry(exc, moepolicy_stream=self._name)
            raise

    def _reader_left(self) -> None:
        """Point this stream's descriptor at /dev/null: later writes (and the interpreter's last
        flush) succeed and show nothing."""
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), self._raw.fileno())
        except (OSError, AttributeError, ValueError):
            pass

    def __getattr__(self, name: str):
        return getattr(self._raw, name)


def os_error_line(exc: OSError) -> str:
    """An ``OSError`` that escaped a command, as what really failed: the stream, or the file and why."""
    stream = getattr(exc, "moepolicy_stream", None)
    why = exc.strerror or str(exc) or type(exc).__name__
    if stream is not None:
        return f"cannot write to {stream} ({why})"
    if exc.filename is not None:
        other = f" -> {exc.filename2}" if exc.filename2 is not None else ""
        return f"{exc.filename}{other}: {why}"
    return f"{type(exc).__name__}: {why}"


# ------------------------------------------------------------------------------------------- outputs
OUTPUT_HELP = (
    "write it to this file (written atomically; a symbolic link is written through); '-': standard "
    "output"
)


def add_output_flag(p, what: str, default: Optional[str] = None) -> None:
    """The ``-o/--output`` flag, the same in every command. A command with a ``default`` file gets
    None when ``-o`` is not given, and says where its result goes (:func:`default_output`)."""
    where = f"default {default}" if default else "default: standard output"
    p.add_argument("-o", "--output", metavar="FILE", help=f"{what}: {OUTPUT_HELP} ({where})")


def default_output(given: Optional[str], default: str, what: str = "the policy") -> str:
    """``given``, or ``default`` with a line saying so: a file written without being named is said
    before any work, not only in the 'wrote' line at the end."""
    if given is not None:
        return given
    note(f"no -o: {what} goes to {default} in the working folder (-o FILE to choose)")
    return default


def output_path(
    path: Optional[str],
    inputs: Sequence[Input] = (),
    flag: str = "-o",
    what: str = "the policy",
) -> Optional[str]:
    """``path`` checked before any work (None: standard output): a writable regular file or a new
    one, and none of the command's ``inputs`` ((what, path) pairs, None skipped), compared by
    resolved path and by device and inode, symbolic links followed."""
    if path is None or path == STDOUT:
        return None
    for what, given in inputs:
        if given is not None and same_file(path, given):
            raise OutputError(
                f"{flag} {path}: is {what} ({given}), which this command reads; write to another file"
            )
    write_target(path, what)
    return path


def command_inputs(args) -> list[Input]:
    """What a command reads, which its ``-o`` and ``--log-file`` must not name: the checkpoint
    (``--model``), rule packs (``--rules``), the policy or policies with the user rule packs beside
    them that they name, and the study database."""
    found = [
        *model_inputs(getattr(args, "model", None)),
        *rules_inputs(getattr(args, "rules", ()) or ()),
    ]
    policies = getattr(args, "policy", None)
    for policy in [policies] if isinstance(policies, str) else policies or ():
        if isinstance(policy, str):
            found += policy_inputs(policy)
    storage = getattr(args, "storage", None)
    if isinstance(storage, str):
        found.append(("the study database", storage_file(storage)))
    return found


def policy_inputs(policy: str) -> list[Input]:
    """The policy file and the user rule packs it names that lie beside it (what serving and the
    replaying commands read with it); the policy alone where it cannot be read (the command then
    refuses it)."""
    # a policy's own reading (the document model, YAML, the rule packs): for the commands given one
    from moepolicy.document.reader import find_user_pack, read_policy
    from moepolicy.rules.packs import builtin_names

    found: list[Input] = [("the policy", policy)]
    try:
        doc = read_policy(policy).doc
    except (MoePolicyError, OSError):
        return found
    folder = Path(policy).absolute().parent
    for ref in doc.rules.packs:
        if ref.name in builtin_names():
            continue
        pack = find_user_pack(ref.name, ref.path, [folder])
        if pack is not None:
            found.append((f"the rule pack '{ref.name}' the policy uses", str(pack.path)))
    return found


def write_output(path: Optional[str], text: str, what: str = "") -> None:
    """``text`` to ``path`` atomically (and a line saying so), or to standard output for None."""
    if path is None:
        sys.stdout.write(text)
        return
    atomic_write(path, text)
    said = f"{path}" + (f" ({what})" if what else "")
    WRITTEN.append(said)
    note(f"wrote {said}")


# What this command's write_output wrote, as its "wrote" line said it: an interrupt that lands after
# a file was written says so (the file is whole; main.interrupt_exit)
WRITTEN: list[str] = []


def model_inputs(model: Optional[str]) -> list[Input]:
    """The files ``--model`` reads, where it is a local file or folder (a catalog or hub name is not)."""
    path = os.path.expanduser(model) if model else ""
    if not path or not os.path.exists(path):
        return []
    folder = path if os.path.isdir(path) else os.path.dirname(path) or "."
    config = os.path.join(path, "config.json") if os.path.isdir(path) else path
    return [
        ("the checkpoint's config", config),
        ("the checkpoint's hf_quant_config.json", os.path.join(folder, "hf_quant_config.json")),
    ]


def rules_inputs(rules: Sequence[str]) -> list[Input]:
    """The rule pack files ``--rules`` names (a built-in pack's name is not a file)."""
    return [
        ("a rule pack", os.path.expanduser(spec))
        for spec in rules
        if os.path.exists(os.path.expanduser(spec))
    ]


def write_result(path: Optional[str], text: str, what: str = "") -> None:
    """Write a result that took long to make (a tune's policy). Where ``path`` cannot be written
    (a full disk, a folder gone read-only meanwhile) the text is kept beside it or in the temporary
    folder, and the one-line error says where and how to put it in place; nothing is thrown away."""
    try:
        write_output(path, text, what)
        return
    except OutputError as exc:
        if path is None:  # standard output: there is no beside to keep it in
            raise
        failed = str(exc)
    kept = _keep_elsewhere(path, text)
    if kept is None:
        raise OutputError(
            f"{failed}; the result could not be kept beside it or in the temporary folder either: "
            "the study keeps every trial, so the same command run again writes it"
        )
    import shlex

    raise OutputError(
        f"{failed}; the result is kept in {kept}: put it in place with: mv {shlex.quote(kept)} "
        f"{shlex.quote(path)}"
    )


def _keep_elsewhere(path: str, text: str) -> Optional[str]:
    """Write ``text`` beside ``path`` (``policy.unsaved-20261202-101500.yaml``) or into the temporary
    folder; the first that works, or None."""
    import tempfile

    p = Path(path)
    name = f"{p.stem}.unsaved-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}{p.suffix or '.yaml'}"
    for folder in (p.parent, Path(tempfile.gettempdir())):
        try:
            atomic_write(folder / name, text)
        except OutputError:
            continue
        return str(folder / name)
    return None
