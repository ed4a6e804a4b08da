"""The one place a policy document is assembled: typed sections in (the planner maps a plan to
them, ``deepep_section`` builds DeepEP's), each a model of :mod:`moepolicy.document.model`, the
document out with its schema version, its keys and what made it. The sections and then the whole are
:class:`~moepolicy.document.model.PolicyDoc`, what the reader returns, so a document this code cannot
read back is never written; the tree written holds exactly the fields the sections were given.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any, Optional, Sequence

from pydantic import BaseModel, ValidationError

from moepolicy._version import __version__
from moepolicy.document.keys import compute_keys
from moepolicy.document.model import (
    SCHEMA_VERSION,
    DeepEPDoc,
    ExpertsDoc,
    KeyDoc,
    LayerDoc,
    ModelDoc,
    PackRefDoc,
    PolicyDoc,
    ProvenanceDoc,
    RulesDoc,
    TargetDoc,
    unknown_keys,
)
from moepolicy.errors import PolicyError


def section(kind: type[BaseModel], where: str, /, **fields: Any) -> Any:
    """A ``kind`` (a model of the document) built from ``fields``, for the place ``where`` in the
    document (``deepep``, ``layers[3]``); a moepolicy bug, if they do not fit or hold a field the
    document does not define (readers take one, from a newer writer), said in one line."""
    try:
        value = kind(**fields)
    except ValidationError as exc:
        raise _internal(exc, where) from None
    unknown = _not_defined(value, where)
    if unknown:
        raise PolicyError(
            f"internal error: the document built has a field its schema does not define at "
            f"{unknown[0]}; please report it"
        )
    return value


def _not_defined(value: BaseModel, where: str) -> list[str]:
    """The paths of ``value``'s keys the document does not define: the reader's unknown keys, and
    the DeepEP provenance's details moepolicy does not write (free-form to a reader)."""
    found = unknown_keys(value, where)
    provenance = getattr(value, "provenance", None)
    if isinstance(provenance, ProvenanceDoc):
        found += [f"{where}.provenance.{key}" for key in provenance.unknown_details()]
    return found


def tree(value: BaseModel) -> dict[str, Any]:
    """A section as the document's tree: the fields it was given, nested models as mappings."""
    return value.model_dump(exclude_unset=True)


def assemble(
    *,
    model: ModelDoc,
    target: TargetDoc,
    packs: Sequence[PackRefDoc],
    deepep: DeepEPDoc,
    layers: Sequence[LayerDoc],
    command: str = "",
    experts: Optional[ExpertsDoc] = None,
) -> dict[str, Any]:
    """The policy document of these sections, keyed, stamped and checked as a whole."""
    rules = section(RulesDoc, "rules", packs=list(packs))
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "model": tree(model),
        "target": tree(target),
        "rules": tree(rules),
        "deepep": tree(deepep),
        **({"experts": tree(experts)} if experts is not None else {}),
        "layers": [tree(entry) for entry in layers],
    }
    doc["key"] = compute_keys(doc)
    doc["generated"] = {
        "by": f"moepolicy {__version__}",
        "at": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        **({"command": command} if command else {}),
    }
    section(  # the whole: the checks across sections (layer order, schema version)
        PolicyDoc,
        "",
        schema_version=SCHEMA_VERSION,
        model=model,
        target=target,
        rules=rules,
        deepep=deepep,
        experts=experts,
        layers=list(layers),
        key=KeyDoc(**doc["key"]),
        generated=doc["generated"],
    )
    return doc


def _internal(exc: ValidationError, where: str) -> PolicyError:
    first = exc.errors()[0]
    path = ".".join([where] if where else [])
    for part in first.get("loc", ()):
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return PolicyError(
        f"internal error: the document built does not pass its own schema at {path or 'its root'}: "
        f"{first.get('msg', exc)}; please report it"
    )
