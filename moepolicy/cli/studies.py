"""``moepolicy studies [--storage URL] [--delete NAME]``: the tunes' optuna studies in a storage,
listed (name, sub-studies, trials, start) or one deleted with its sub-studies (as ``optuna studies``
and ``optuna delete-study`` do)."""

from __future__ import annotations

import argparse

from moepolicy.cli._output import add_format_flag, note, print_json, table
from moepolicy.redact import redact_url
from moepolicy.tuning.options import DEFAULT_STORAGE
from moepolicy.tuning.studies import delete_study, list_studies


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "studies", help="list the tunes' optuna studies in a storage, or delete one"
    )
    p.add_argument(
        "--storage",
        default=DEFAULT_STORAGE,
        help=f"optuna storage URL (default {DEFAULT_STORAGE})",
    )
    p.add_argument(
        "--delete",
        metavar="NAME",
        help="delete this study and its sub-studies (its trials are gone: a tune of it starts afresh)",
    )
    add_format_flag(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from moepolicy.api import require_tuner  # the library's front door imports the planner

    require_tuner()
    where = redact_url(args.storage)
    if args.delete:
        gone = delete_study(args.storage, args.delete)
        note(f"deleted study '{args.delete}' from {where} ({gone - 1} sub-studies with it)")
        return 0
    rows = list_studies(args.storage)
    if rows is None:
        note(f"no study database at {where}: no tune has stored a study there yet")
        if args.format == "json":
            print_json([])
        return 0
    if args.format == "json":
        print_json([{**vars(row), "storage": where} for row in rows])
        return 0
    table(
        ["study", "sub-studies", "trials", "started"],
        [
            [
                r.name,
                r.sub_studies,
                r.trials,
                r.started.isoformat(" ", "seconds") if r.started else "-",
            ]
            for r in rows
        ],
    )
    return 0
