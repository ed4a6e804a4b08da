"""Small helpers for printing tables and writing files from commands."""

from __future__ import annotations

import logging
import sys
from typing import Optional, Sequence


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], out=None) -> None:
    out = out or sys.stdout
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
              for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip(), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip(), file=out)


def note(message: str) -> None:
    """A line for the user on stderr (progress, the target used, warnings)."""
    print(message, file=sys.stderr, flush=True)


class progress_to_stderr:
    """While the block runs, show the ``moepolicy.tuning`` logger's lines on stderr and draw one
    progress bar per phase (with ETA) from ``moepolicy.tuning.progress`` events; with ``verbose``,
    per-trial lines (DEBUG) instead of bars."""

    def __init__(self, verbose: bool = False):
        self.verbose = verbose

    def __enter__(self):
        self._loggers = []
        bars = _Bars() if not self.verbose and sys.stderr.isatty() else None
        self._attach("moepolicy.tuning", _Lines(bars), logging.DEBUG if self.verbose else logging.INFO)
        if bars is not None:
            self._attach("moepolicy.tuning.progress", bars, logging.INFO)
        return self

    def _attach(self, name: str, handler, level: int) -> None:
        import logging

        logger = logging.getLogger(name)
        self._loggers.append((logger, handler, logger.level, logger.propagate))
        logger.addHandler(handler)
        logger.setLevel(level)
        logger.propagate = False

    def __exit__(self, *exc) -> None:
        for logger, handler, level, propagate in self._loggers:
            logger.removeHandler(handler)
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

            from moepolicy.text import printable

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
            self._bar = tqdm(total=record.total, desc=record.phase, unit="step", file=_terminal(), leave=False,
                             dynamic_ncols=True)
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


class SafeStream:
    """A text stream that writes control characters escaped (``\\x1b``): file-sourced text (a rule's
    ``why``, a model name, a reason) cannot move the cursor, recolour or rewrite the terminal."""

    def __init__(self, raw):
        self._raw = raw

    def write(self, text: str) -> int:
        from moepolicy.text import printable

        return self._raw.write(printable(text))

    def __getattr__(self, name: str):
        return getattr(self._raw, name)
