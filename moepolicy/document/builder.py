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
    RulesDoc,
    TargetDoc,
    unknown_fields,
)
from moepolicy.document.fast_validate import error_message
from moepolicy.errors import PolicyError
from moepolicy.schema.locations import yaml_path


def section(kind: type[BaseModel], where: str, /, **fields: Any) -> Any:
    """A ``kind`` (a model of the document) built from ``fields``, for the place ``where`` in the
    document (``deepep``, ``layers[3]``); a moepolicy bug, if they do not fit or hold a field the
    document does not define (readers take one, from a newer writer), said in one line."""
    try:
        value = kind(**fields)
    except ValidationError as exc:
        raise _internal(exc, where) from None
    unknown = unknown_fields(value, where)
    if unknown:
        field, seen = unknown[0]
        raise PolicyError(
            f"internal error: the document built has a field its schema does not define: {field} "
            f"= {_shown(seen)} (a writer's misspelling, or a field to add to "
            f"moepolicy/document/model.py or evidence.py); please report it"
        )
    return value


def _shown(value: Any) -> str:
    """A value in an error line: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


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
    loc = ((where,) if where else ()) + tuple(first.get("loc", ()))
    return PolicyError(
        f"internal error: the document built does not pass its own schema at "
        f"{yaml_path(loc) if loc else 'its root'}: {error_message(first)}; please report it"
    )
