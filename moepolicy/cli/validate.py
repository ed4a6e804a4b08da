"""``moepolicy validate POLICY [--strict] [--rekey]``."""

from __future__ import annotations

import argparse

from moepolicy.cli._output import note
from moepolicy.errors import PolicyError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="check a policy: schema, version, DeepEP rules, key integrity")
    p.add_argument("policy")
    p.add_argument("--strict", action="store_true", help="refuse unknown keys (from a newer minor version)")
    p.add_argument("--rekey", action="store_true",
                   help="after a deliberate hand edit: recompute the keys and rewrite the file")
    p.set_defaults(run=run)


def _rekey(path: str) -> None:
    from pathlib import Path

    from moepolicy.document import parse_text, write_document
    from moepolicy.keys import compute_keys

    raw = parse_text(Path(path).read_text(encoding="utf-8"))
    if isinstance(raw, dict) and "layers" in raw and "target" in raw:
        try:
            raw["key"] = compute_keys(raw)
        except (KeyError, TypeError) as exc:
            from moepolicy.errors import PolicyError

            raise PolicyError(f"{path}: cannot rekey, a key part is missing or malformed ({exc})") from None
        write_document(raw, path)
        note(f"rekeyed {path}")


def run(args: argparse.Namespace) -> int:
    from moepolicy.policy_file import read_policy

    if args.rekey:
        _rekey(args.policy)
    loaded = read_policy(args.policy, strict=args.strict)
    for warning in loaded.warnings:
        note(f"warning: {warning}")
    doc = loaded.doc
    if doc.deepep.partial is not None:
        raise PolicyError(f"{args.policy}: a partial result ({doc.deepep.partial.reason}); load_policy uses DeepEP's "
                          "default configs and the decisions without measured facts for it; re-run the tune")
    print(f"ok: {args.policy}: schema {doc.schema_version}, {doc.model.name}, {len(doc.layers)} layers, "
          f"{doc.target.gpu} EP{doc.target.ep_size} {doc.target.backend}, deepep {doc.deepep.provenance.source}, "
          f"keys intact")
    return 0
