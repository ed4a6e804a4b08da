"""The one place a policy document is assembled: its sections in (the planner maps a plan to them;
``deepep_section`` builds DeepEP's), the document out with its schema version, its keys and what made
it. The result is checked against the document's model (:class:`~moepolicy.document.model.PolicyDoc`,
what the reader returns) before it leaves, so a document this code cannot read back is never written.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any, Mapping, Sequence

from moepolicy._version import __version__
from moepolicy.document.keys import compute_keys
from moepolicy.document.model import SCHEMA_VERSION, PolicyDoc
from moepolicy.errors import PolicyError


def assemble(
    *,
    model: Mapping[str, Any],
    target: Mapping[str, Any],
    packs: Sequence[Mapping[str, Any]],
    deepep: Mapping[str, Any],
    layers: Sequence[Mapping[str, Any]],
    command: str = "",
) -> dict[str, Any]:
    """The policy document of these sections, keyed, stamped and checked."""
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "model": dict(model),
        "target": dict(target),
        "rules": {"packs": [dict(p) for p in packs]},
        "deepep": dict(deepep),
        "layers": [dict(entry) for entry in layers],
    }
    doc["key"] = compute_keys(doc)
    doc["generated"] = {
        "by": f"moepolicy {__version__}",
        "at": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        **({"command": command} if command else {}),
    }
    _check(doc)
    return doc


def _check(doc: dict[str, Any]) -> None:
    from pydantic import ValidationError

    try:
        PolicyDoc.model_validate(doc)
    except ValidationError as exc:  # a moepolicy bug: say where, in one line
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise PolicyError(
            f"internal error: the document built does not pass its own schema at {where}: "
            f"{first.get('msg', exc)}; please report it"
        ) from None
