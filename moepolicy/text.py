"""Text helpers shared by the commands, the exports and the runtime: index ranges, safe terminal text.

:func:`printable` is the one place where text from files (a model name, a rule's ``why``, a path) is
made safe for a terminal or a log: the CLI's streams, the exports' comments and ``load_policy``'s
warnings all pass through it. Light on purpose (the runtime imports it inside serving processes).
"""

from __future__ import annotations

import re

# C0 and C1 controls but tab and newline; line and paragraph separators; every bidirectional
# formatting character (embeddings, overrides, isolates, the marks LRM, RLM and ALM)
_CONTROL = re.compile(
    r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)
_CONTROL_AND_LINES = re.compile(_CONTROL.pattern[:-1] + r"\t\n]")


def is_digits(text: str) -> bool:
    """Whether ``text`` is a non-negative integer in ASCII digits, as ``int`` reads it (``str.isdigit``
    also takes '²' and other digits ``int`` refuses)."""
    return text.isascii() and text.isdigit()


def index_ranges(indices: list[int]) -> str:
    """``[0, 1, 2, 5]`` → ``"0-2,5"``."""
    out: list[str] = []
    start: int | None = None
    prev = 0  # read only once start is set (together with it)
    for i in sorted(indices):
        if start is None:
            start = prev = i
        elif i == prev + 1:
            prev = i
        else:
            out.append(f"{start}-{prev}" if start != prev else str(start))
            start = prev = i
    if start is not None:
        out.append(f"{start}-{prev}" if start != prev else str(start))
    return ",".join(out)


def printable(text: object, *, one_line: bool = False) -> str:
    """``text`` safe for a terminal: control characters (escape sequences, carriage returns,
    bidirectional overrides) shown escaped, as ``\\x1b``; tabs and newlines kept, or, with
    ``one_line`` (a log record, a message that must stay one line), escaped too."""
    pattern = _CONTROL_AND_LINES if one_line else _CONTROL
    return pattern.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text))
