"""Where in a document a validation error is, written as a YAML path (``deepep.buckets[0].dispatch``)."""

from __future__ import annotations


# the forms of the document's unions (a bucket's ``measured``: a serial tune's, or an overlap tune's
# row), by their models' names, which both validators put in an error's location after the field;
# never a key of the YAML
UNION_TAGS = ("MeasuredDoc", "OverlapRowDoc")


def yaml_path(loc: tuple) -> str:
    """A pydantic error location as a YAML path; ``(top)`` for the document itself."""
    out = ""
    for part in loc:
        if part in UNION_TAGS:
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top)"
