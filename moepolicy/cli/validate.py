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


def _rekey(path: str, strict: bool) -> None:
    """Recompute the keys and rewrite the file, only if the rekeyed document then validates:
    a document that would be refused anyway is left as it is."""
    from moepolicy.policy_yaml import atomic_write, dumps
    from moepolicy.keys import compute_keys
    from moepolicy.policy_reader import MAX_POLICY_BYTES, _parse_raw, parse_policy
    from moepolicy.files import read_bounded
    from moepolicy.cli._replay import stored_facts_problem

    raw = _parse_raw(read_bounded(path, MAX_POLICY_BYTES, PolicyError).decode("utf-8", "replace"), path)
    if "layers" not in raw or "target" not in raw:
        raise PolicyError(f"{path}: cannot rekey: not a policy (no layers or target)")
    try:
        raw["key"] = compute_keys(raw)
    except (KeyError, TypeError, AttributeError) as exc:
        raise PolicyError(f"{path}: cannot rekey, a key part is missing or malformed ({exc})") from None
    fmt = "json" if path.endswith(".json") else "yaml"
    text = dumps(raw, fmt)
    loaded = parse_policy(text, f"{path} (rekeyed, not written)", strict=strict)  # refuses before anything is written
    problem = stored_facts_problem(loaded.doc)
    if problem:
        raise PolicyError(f"{path} (rekeyed, not written): {problem}")
    atomic_write(path, text)
    note(f"rekeyed {path}")


def run(args: argparse.Namespace) -> int:
    from moepolicy.policy_reader import read_policy

    if args.rekey:
        _rekey(args.policy, args.strict)
    loaded = read_policy(args.policy, strict=args.strict)
    for warning in loaded.warnings:
        note(f"warning: {warning}")
    doc = loaded.doc
    from moepolicy.cli._replay import stored_facts_problem

    problem = stored_facts_problem(doc)
    if problem:
        raise PolicyError(f"{args.policy}: {problem}")
    if doc.deepep.partial is not None:
        raise PolicyError(f"{args.policy}: a partial result ({doc.deepep.partial.reason}); load_policy uses DeepEP's "
                          "default configs and the decisions without measured facts for it; re-run the tune")
    print(f"ok: {args.policy}: schema {doc.schema_version}, {doc.model.name}, {len(doc.layers)} layers, "
          f"{doc.target.gpu} EP{doc.target.ep_size} {doc.target.backend}, deepep {doc.deepep.provenance.source}, "
          f"keys intact")
    return 0
