"""``moepolicy report POLICY [DIR]``: pictures of the policy's tuning evidence (needs the ``[plots]``
extra: matplotlib). DIR defaults to the policy's name with ``-plots`` beside it (``ds.yaml`` ->
``ds-plots/``); ``--plots DIR`` is the same. A policy with nothing tuned to draw makes no folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from moepolicy.cli._output import note, output_path
from moepolicy.errors import OutputError, UsageError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="draw the policy's tuning evidence (SM scan, kept vs defaults, orders, overlap)",
    )
    p.add_argument("policy", help="policy file")
    p.add_argument(
        "folder",
        nargs="?",
        metavar="DIR",
        help="folder for the PNG files, made if missing (default: the policy's name with -plots, beside it)",
    )
    p.add_argument("--plots", metavar="DIR", help="the same as DIR")
    p.set_defaults(run=run)


def _folder(args: argparse.Namespace) -> Path:
    if args.folder and args.plots and args.folder != args.plots:
        raise UsageError(f"give the folder once: {args.folder} or --plots {args.plots}")
    given = args.folder or args.plots
    if given:
        return Path(given)
    policy = Path(args.policy)
    return policy.with_name(policy.stem + "-plots")


def run(args: argparse.Namespace) -> int:
    from moepolicy.export.plots import FIGURES, draw
    from moepolicy.document.reader import read_policy

    folder = _folder(args)
    if folder.exists() and not folder.is_dir():
        raise OutputError(f"{folder}: is not a folder (the report's PNG files go into a folder)")
    if not folder.parent.is_dir():
        raise OutputError(f"{folder}: the folder {folder.parent} does not exist")
    for name in (
        FIGURES if folder.is_dir() else ()
    ):  # before any work: the figures replace these files
        output_path(
            str(folder / f"{name}.png"),
            [("the policy being reported", args.policy)],
            flag="--plots",
        )
    loaded = read_policy(args.policy)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError(
            "report needs matplotlib: pip install matplotlib (or, in a moepolicy checkout, "
            "pip install '.[plots]')"
        ) from None
    notes: list[str] = []
    written = draw(loaded.raw, folder, notes)
    for line in notes:
        note(f"{args.policy}: {line}")
    if not written:
        from moepolicy.errors import MoePolicyError

        raise MoePolicyError(
            f"{args.policy}: nothing tuned to draw (DeepEP's default configs: 'moepolicy tune' it "
            "first); no folder made"
            if not notes
            else f"{args.policy}: nothing drawn; no folder made"
        )
    for path in written:
        note(f"wrote {path}")
    return 0
