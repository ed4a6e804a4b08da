"""``moepolicy validate POLICY... [--strict] [--rekey] [--live]``."""

from __future__ import annotations

import argparse
from typing import Optional

from moepolicy.cli._output import add_format_flag, note, print_json
from moepolicy.errors import MeasurementError, PolicyError, UsageError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "validate", help="check a policy: schema, version, DeepEP rules, key integrity"
    )
    p.add_argument("policy", nargs="+", help="policy file(s) written by plan or tune")
    p.add_argument(
        "--strict", action="store_true", help="refuse unknown keys (from a newer minor version)"
    )
    p.add_argument(
        "--rekey",
        action="store_true",
        help="after a deliberate hand edit: recompute the keys and rewrite the file",
    )
    p.add_argument(
        "--live",
        action="store_true",
        help="also run the policy's DeepEP settings through real DeepEP on the GPUs visible, at its EP "
        "size (ranks share a GPU where there are fewer GPUs: a functional check, not a speed one): "
        "buffer, configs, every bucket and wire format, dispatch and combine against the reference",
    )
    add_serving_flags(p)
    add_format_flag(p)
    p.set_defaults(run=run)


def add_serving_flags(p: argparse.ArgumentParser) -> None:
    """--model / --ep-size: predict load_policy's decision for the served model and EP size."""
    p.add_argument(
        "--model",
        help="the model serving will load (catalog name, Hugging Face id, folder): "
        "checked as load_policy checks it, from the HF cache only; a catalog name against its "
        "snapshot there, as the plugin checks it (else moepolicy's copy of its config, said)",
    )
    p.add_argument(
        "--ep-size",
        type=int,
        help="the EP size serving will run with, checked as load_policy checks it",
    )


def serving_outcome(path: str, args: argparse.Namespace):
    """load_policy's decision in this process (the installed rule packs and sheets), for ``--model``
    as serving checks it (``cli._served``); exit 6 when serving would fall back."""
    from moepolicy.runtime.outcome import predict

    outcome = predict(path, ep_size=args.ep_size, model=_checked_model(args))
    if outcome.falls_back:
        raise PolicyError(f"{path}: {outcome.summary()}")
    return outcome


def _rekey(path: str, strict: bool) -> None:
    """Recompute the keys and rewrite the file, only if the rekeyed document then validates:
    a document that would be refused anyway is left as it is."""
    from moepolicy.document.yaml_io import atomic_write, dumps
    from moepolicy.document.keys import compute_keys
    from moepolicy.document.reader import MAX_POLICY_BYTES, _parse_raw, parse_policy
    from moepolicy.files import read_bounded
    from moepolicy.cli._replay import decisions_not_replayed, stored_facts_problem

    raw = _parse_raw(
        read_bounded(path, MAX_POLICY_BYTES, PolicyError).decode("utf-8", "replace"), path
    )
    if "layers" not in raw or "target" not in raw:
        raise PolicyError(f"{path}: cannot rekey: not a policy (no layers or target)")
    try:
        raw["key"] = compute_keys(raw)
    except (KeyError, TypeError, AttributeError) as exc:
        raise PolicyError(
            f"{path}: cannot rekey, a key part is missing or malformed ({exc})"
        ) from None
    fmt = "json" if path.endswith(".json") else "yaml"
    text = dumps(raw, fmt)
    # refuses before anything is written
    loaded = parse_policy(text, f"{path} (rekeyed, not written)", strict=strict)
    problem = stored_facts_problem(loaded.doc)
    if problem:
        raise PolicyError(f"{path} (rekeyed, not written): {problem}")
    # serving would apply the recorded decisions, explain and the export replay the facts
    stale = decisions_not_replayed(loaded.doc, path)
    if stale:
        raise PolicyError(
            f"{path} (rekeyed, not written): {_first(stale)}; --rekey keeps a hand edit only where "
            "the recorded decisions follow from the stored facts: edit the decision to match "
            "(explain --layer N shows it), or re-plan (a rule pack, --rules, overrides a decision)"
        )
    atomic_write(path, text)
    note(f"rekeyed {path}")


def serving_note(args: argparse.Namespace) -> None:
    """For export: the vLLM plugin runs load_policy, so a policy it would not apply is refused (exit 6);
    SGLang takes the exported settings as they are, and a note says what load_policy would decide."""
    from moepolicy.runtime.outcome import SAFE, predict

    outcome = predict(args.policy, ep_size=args.ep_size, model=_checked_model(args))
    if args.to == "vllm" and outcome.state == SAFE:
        raise PolicyError(f"{args.policy}: {outcome.summary('vllm')}")
    if outcome.falls_back:
        note(f"warning: {outcome.summary('vllm' if args.to == 'vllm' else 'runtime')}")


def _first(lines: list[str]) -> str:
    """The first of ``lines``, and how many more there are."""
    return lines[0] + (f" (and {len(lines) - 1} more layers)" if len(lines) > 1 else "")


def _checked_model(args: argparse.Namespace):
    """``--model`` as serving would check it, said once per command when that is not plain."""
    from moepolicy.cli._served import checked_model

    checked = getattr(args, "_checked_model", None)
    if checked is None:
        checked = args._checked_model = checked_model(args.model)
        if checked.said:
            note(("warning: " if checked.warn else "") + checked.said)
    return checked.model


def run(args: argparse.Namespace) -> int:
    if args.rekey and len(args.policy) > 1:
        raise UsageError("--rekey rewrites one policy at a time; name one file")
    results = []
    for path in args.policy:
        results.append(_validate(path, args))
        if args.format == "table":
            print(_ok_line(results[-1]))
            print(results[-1]["serving"]["summary"])
    live = _live(args.policy, show=args.format == "table") if args.live else []
    if args.format == "json":
        reports: list[Optional[dict]] = list(live) if live else [None] * len(results)
        for result, report in zip(results, reports):
            result["live"] = report
        print_json(results)
    failures = [r["failure"] for r in live if r["failure"]]
    if failures:
        raise PolicyError(
            failures[0]
            + (f" (and {len(failures) - 1} more polic(ies) failed)" if len(failures) > 1 else "")
        )
    return 0


def _ok_line(result: dict) -> str:
    return (
        f"ok: {result['policy']}: schema {result['schema_version']}, {result['model']}, {result['layers']} layers, "
        f"{result['gpu']} EP{result['ep_size']} {result['backend']}, deepep {result['deepep_source']}, "
        "keys intact"
    )


def _validate(path: str, args: argparse.Namespace) -> dict:
    """One policy checked (schema, keys, stored facts, complete, what serving would do); raises the
    first problem as a PolicyError."""
    from moepolicy.cli._replay import decisions_not_replayed, stored_facts_problem
    from moepolicy.document.reader import read_policy

    if args.rekey:
        _rekey(path, args.strict)
    loaded = read_policy(path, strict=args.strict)
    for warning in loaded.warnings:
        note(f"warning: {warning}")
    doc = loaded.doc
    problem = stored_facts_problem(doc)
    if problem:
        raise PolicyError(f"{path}: {problem}")
    stale = decisions_not_replayed(doc, path)
    if stale:
        note(
            f"warning: {path}: {_first(stale)}: serving applies the recorded decisions, explain and "
            "the export replay the facts; re-plan"
        )
    if doc.deepep.partial is not None:
        raise PolicyError(
            f"{path}: a partial result ({doc.deepep.partial.reason}); load_policy uses DeepEP's "
            "default configs and the decisions without measured facts for it; re-run the tune"
        )
    outcome = serving_outcome(path, args)
    return {
        "policy": path,
        "schema_version": doc.schema_version,
        "model": doc.model.name,
        "layers": len(doc.layers),
        "gpu": doc.target.gpu,
        "ep_size": doc.target.ep_size,
        "backend": doc.target.backend,
        "deepep_source": doc.deepep.provenance.source,
        "keys": "intact",
        "serving": {
            "state": outcome.state,
            "reason": outcome.reason,
            "checks": dict(outcome.report),
            "summary": outcome.summary(),
            "model_checked": args._checked_model.said or None,
        },
    }


def _live(paths: list[str], show: bool = True) -> list[dict]:
    """``--live``: the preflight on the GPUs visible, the policies of one EP size in one group of
    ranks; one result per policy, in the order given (``failure``: its one line, or None)."""
    from moepolicy.measure.ranks import gpu_placement
    from moepolicy.preflight import describe_failure, plan_preflight, render, run_preflight
    from moepolicy.tuning.live_bench import deep_ep_importable

    plans = [plan_preflight(path) for path in paths]
    missing = deep_ep_importable()
    reports = {}
    for ep_size in sorted({plan.ep_size for plan in plans}):
        try:
            placement = gpu_placement(ep_size)
        except (ImportError, ValueError) as exc:
            raise MeasurementError(f"--live runs DeepEP on CUDA GPUs: {exc}") from None
        if missing:
            raise MeasurementError(f"--live runs DeepEP on CUDA GPUs: {missing}")
        note(f"validate --live: EP {ep_size}: {placement.describe()}")
        shown: list = []

        def display(report, shown=shown) -> None:
            shown.append(report)
            if show:
                print("\n".join(render(report)), flush=True)

        for report in run_preflight(
            [plan for plan in plans if plan.ep_size == ep_size], placement, on_report=display
        ):
            if not any(report is r for r in shown):  # failed or not run: shown at the end
                display(report)
            reports[id(report.plan)] = report
    return [_live_result(reports[id(plan)], describe_failure) for plan in plans]


def _live_result(report, describe_failure) -> dict:
    return {
        "ok": report.ok,
        "placement": report.placement.describe(),
        "shared_gpu": report.placement.shared,
        "rows": [vars(row) for row in report.rows],
        "not_checked": list(report.plan.not_checked),
        "error": report.error or None,
        "failure": None if report.ok else describe_failure(report),
    }
