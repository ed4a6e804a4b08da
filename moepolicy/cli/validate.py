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
    add_serving_flags(p)
    p.set_defaults(run=run)


def add_serving_flags(p: argparse.ArgumentParser) -> None:
    """--model / --ep-size: predict load_policy's decision for the served model and EP size."""
    p.add_argument("--model", help="the model serving will load (catalog name, Hugging Face id, folder): "
                                   "checked as load_policy checks it, from the HF cache only")
    p.add_argument("--ep-size", type=int, help="the EP size serving will run with, checked as load_policy checks it")


def serving_outcome(args: argparse.Namespace):
    """load_policy's decision in this process (the installed rule packs and sheets); exit 6 when
    serving would fall back."""
    from moepolicy.runtime.outcome import predict

    outcome = predict(args.policy, ep_size=args.ep_size, model=args.model)
    if outcome.falls_back:
        raise PolicyError(f"{args.policy}: {outcome.summary()}")
    return outcome


def _rekey(path: str, strict: bool) -> None:
    """Recompute the keys and rewrite the file, only if the rekeyed document then validates:
    a document that would be refused anyway is left as it is."""
    from moepolicy.policy_yaml import atomic_write, dumps
    from moepolicy.keys import compute_keys
    from moepolicy.policy_reader import MAX_POLICY_BYTES, _parse_raw, parse_policy
    from moepolicy.files import read_bounded

    raw = _parse_raw(read_bounded(path, MAX_POLICY_BYTES, PolicyError).decode("utf-8", "replace"), path)
    if "layers" not in raw or "target" not in raw:
        raise PolicyError(f"{path}: cannot rekey: not a policy (no layers or target)")
    try:
        raw["key"] = compute_keys(raw)
    except (KeyError, TypeError, AttributeError) as exc:
        raise PolicyError(f"{path}: cannot rekey, a key part is missing or malformed ({exc})") from None
    fmt = "json" if path.endswith(".json") else "yaml"
    text = dumps(raw, fmt)
    parse_policy(text, f"{path} (rekeyed, not written)", strict=strict)  # refuses before anything is written
    atomic_write(path, text)
    note(f"rekeyed {path}")


def serving_note(args: argparse.Namespace) -> None:
    """For export: the vLLM plugin runs load_policy, so a policy it would not apply is refused (exit 6);
    SGLang takes the exported settings as they are, and a note says what load_policy would decide."""
    from moepolicy.runtime.outcome import SAFE, predict

    outcome = predict(args.policy, ep_size=args.ep_size, model=args.model)
    if args.to == "vllm" and outcome.state == SAFE:
        raise PolicyError(f"{args.policy}: the plugin would apply nothing: {outcome.summary()}")
    if outcome.falls_back:
        note(f"warning: {outcome.summary()}")


def run(args: argparse.Namespace) -> int:
    from moepolicy.policy_reader import read_policy

    if args.rekey:
        _rekey(args.policy, args.strict)
    loaded = read_policy(args.policy, strict=args.strict)
    for warning in loaded.warnings:
        note(f"warning: {warning}")
    doc = loaded.doc
    if doc.deepep.partial is not None:
        raise PolicyError(f"{args.policy}: a partial result ({doc.deepep.partial.reason}); load_policy uses DeepEP's "
                          "default configs and the decisions without measured facts for it; re-run the tune")
    outcome = serving_outcome(args)
    print(f"ok: {args.policy}: schema {doc.schema_version}, {doc.model.name}, {len(doc.layers)} layers, "
          f"{doc.target.gpu} EP{doc.target.ep_size} {doc.target.backend}, deepep {doc.deepep.provenance.source}, "
          f"keys intact")
    print(outcome.summary())
    return 0
