"""Small helpers for printing tables and writing files from commands."""

from __future__ import annotations

import sys
from typing import Sequence


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
    """Show the ``moepolicy.tuning`` logger's progress lines on stderr while the block runs."""

    def __enter__(self):
        import logging

        self._logger = logging.getLogger("moepolicy.tuning")
        self._handler = logging.StreamHandler(sys.stderr)
        self._handler.setFormatter(logging.Formatter("%(message)s"))
        self._level, self._propagate = self._logger.level, self._logger.propagate
        self._logger.addHandler(self._handler)
        self._logger.setLevel(logging.INFO)
        self._logger.propagate = False
        return self

    def __exit__(self, *exc) -> None:
        self._logger.removeHandler(self._handler)
        self._logger.setLevel(self._level)
        self._logger.propagate = self._propagate


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
