"""``moepolicy report POLICY --plots DIR``: pictures of the policy's tuning evidence (needs the
``[plots]`` extra: matplotlib)."""

from __future__ import annotations

import argparse
from pathlib import Path

from moepolicy.cli._output import note, output_path
from moepolicy.errors import OutputError, UsageError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="draw the policy's tuning evidence (SM scan, kept vs defaults, orders, overlap)")
    p.add_argument("policy", help="policy file")
    p.add_argument("--plots", required=True, metavar="DIR", help="folder for the PNG files (made if missing)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from moepolicy.export.plots import FIGURES, draw
    from moepolicy.policy_reader import read_policy

    folder = Path(args.plots)
    if folder.exists() and not folder.is_dir():
        raise OutputError(f"--plots {folder}: is not a folder")
    if not folder.parent.is_dir():
        raise OutputError(f"--plots {folder}: the folder {folder.parent} does not exist")
    for name in FIGURES if folder.is_dir() else ():  # before any work: the figures replace these files
        output_path(str(folder / f"{name}.png"), [("the policy being reported", args.policy)], flag="--plots")
    loaded = read_policy(args.policy)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("report --plots needs matplotlib: pip install 'moepolicy[plots]'") from None
    notes: list[str] = []
    written = draw(loaded.raw, folder, notes)
    for line in notes:
        note(f"{args.policy}: {line}")
    if not written:
        note(f"{args.policy}: DeepEP's default configs, nothing tuned to draw (tune it first)" if not notes else
             f"{args.policy}: nothing drawn")
        return 0
    for path in written:
        note(f"wrote {path}")
    return 0
