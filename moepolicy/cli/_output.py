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
