"""Text helpers shared by the commands and the exports: index ranges, safe terminal text."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def index_ranges(indices: list[int]) -> str:
    """``[0, 1, 2, 5]`` → ``"0-2,5"``."""
    out, start, prev = [], None, None
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


def printable(text: object) -> str:
    """``text`` safe for a terminal: control characters (escape sequences, carriage returns,
    bidirectional overrides) shown escaped, as ``\\x1b``; tabs and newlines kept."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text))
