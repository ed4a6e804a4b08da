"""``moepolicy validate POLICY... [--strict] [--rekey] [--live]``."""

from __future__ import annotations

import argparse

from moepolicy.cli._output import note
from moepolicy.errors import PolicyError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="check a policy: schema, version, DeepEP rules, key integrity")
    p.add_argument("policy", nargs="+", help="policy file(s) written by plan or tune")
    p.add_argument("--strict", action="store_true", help="refuse unknown keys (from a newer minor version)")
    p.add_argument("--rekey", action="store_true",
                   help="after a deliberate hand edit: recompute the keys and rewrite the file")
    p.add_argument("--live", action="store_true",
                   help="also run the policy's DeepEP settings through real DeepEP on the GPUs visible, at its EP "
                        "size (ranks share a GPU where there are fewer GPUs: a functional check, not a speed one): "
                        "buffer, configs, every bucket and wire format, dispatch and combine against the reference")
    add_serving_flags(p)
    p.set_defaults(run=run)


def add_serving_flags(p: argparse.ArgumentParser) -> None:
    """--model / --ep-size: predict load_policy's decision for the served model and EP size."""
    p.add_argument("--model", help="the model serving will load (catalog name, Hugging Face id, folder): "
                                   "checked as load_policy checks it, from the HF cache only")
    p.add_argument("--ep-size", type=int, help="the EP size serving will run with, checked as load_policy checks it")


def serving_outcome(path: str, args: argparse.Namespace):
    """load_policy's decision in this process (the installed rule packs and sheets); exit 6 when
    serving would fall back."""
    from moepolicy.runtime.outcome import predict

    outcome = predict(path, ep_size=args.ep_size, model=args.model)
    if outcome.falls_back:
        raise PolicyError(f"{path}: {outcome.summary()}")
    return outcome


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
    if args.rekey and len(args.policy) > 1:
        from moepolicy.errors import UsageError

        raise UsageError("--rekey rewrites one policy at a time; name one file")
    for path in args.policy:
        _validate(path, args)
    if args.live:
        _live(args.policy)
    return 0


def _validate(path: str, args: argparse.Namespace) -> None:
    from moepolicy.policy_reader import read_policy

    if args.rekey:
        _rekey(path, args.strict)
    loaded = read_policy(path, strict=args.strict)
    for warning in loaded.warnings:
        note(f"warning: {warning}")
    doc = loaded.doc
    from moepolicy.cli._replay import stored_facts_problem

    problem = stored_facts_problem(doc)
    if problem:
        raise PolicyError(f"{args.policy}: {problem}")
    if doc.deepep.partial is not None:
        raise PolicyError(f"{path}: a partial result ({doc.deepep.partial.reason}); load_policy uses DeepEP's "
                          "default configs and the decisions without measured facts for it; re-run the tune")
    outcome = serving_outcome(path, args)
    print(f"ok: {path}: schema {doc.schema_version}, {doc.model.name}, {len(doc.layers)} layers, "
          f"{doc.target.gpu} EP{doc.target.ep_size} {doc.target.backend}, deepep {doc.deepep.provenance.source}, "
          f"keys intact")
    print(outcome.summary())


def _live(paths: list[str]) -> None:
    """``--live``: the preflight on the GPUs visible, the policies of one EP size in one group of
    ranks; a failed case is an error (exit 6)."""
    from moepolicy.errors import UsageError
    from moepolicy.measure.placement import visible_placement
    from moepolicy.preflight import describe_failure, plan_preflight, render, run_preflight
    from moepolicy.tuning.live_bench import deep_ep_importable

    plans = [plan_preflight(path) for path in paths]
    missing = deep_ep_importable()
    failures = []
    for ep_size in sorted({plan.ep_size for plan in plans}):
        try:
            placement = visible_placement(ep_size)
        except (ImportError, ValueError) as exc:
            raise UsageError(f"--live runs DeepEP on CUDA GPUs: {exc}") from None
        if missing:
            raise UsageError(f"--live runs DeepEP on CUDA GPUs: {missing}")
        note(f"validate --live: EP {ep_size}: {placement.describe()}")

        def show(report) -> None:
            print("\n".join(render(report)), flush=True)

        shown = []
        for report in run_preflight([plan for plan in plans if plan.ep_size == ep_size], placement,
                                    on_report=lambda r: (show(r), shown.append(r))):
            if not any(report is r for r in shown):  # failed or not run: shown at the end
                show(report)
            failures += [describe_failure(report)] if not report.ok else []
    if failures:
        raise PolicyError(failures[0] + (f" (and {len(failures) - 1} more polic(ies) failed)" if len(failures) > 1
                                         else ""))
