"""Where in a document a validation error is, written as a YAML path (``deepep.buckets[0].dispatch``)."""

from __future__ import annotations


def yaml_path(loc: tuple) -> str:
    """A pydantic error location as a YAML path; ``(top)`` for the document itself."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top)"
