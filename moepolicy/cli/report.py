"""``moepolicy report POLICY [DIR]``: pictures of the policy's tuning evidence (needs the ``[plots]``
extra: matplotlib). DIR defaults to the policy's name with ``-plots`` beside it (``ds.yaml`` ->
``ds-plots/``); ``--plots DIR`` is the same. A policy with nothing tuned to draw makes no folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from moepolicy.cli._output import note, output_path
from moepolicy.errors import MoePolicyError, OutputError, UsageError


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
    # before any work: the figures replace these files
    for name in FIGURES if folder.is_dir() else ():
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
    partial = loaded.doc.deepep.partial
    if partial is not None:
        note(
            f"{args.policy}: a partial result ({partial.reason}): the figures show what was found "
            "before it stopped, marked PARTIAL; not a complete tune"
        )
    written = draw(loaded.doc, folder)
    if not written:
        raise MoePolicyError(
            f"{args.policy}: {nothing_to_draw(loaded.doc.deepep.provenance)}; no folder made"
        )
    for path in written:
        note(f"wrote {path}")
    return 0


# what draws figures: the SM scan and the kept configs come from a search that timed something
WHAT_DRAWS = (
    "a live tune (--bench live: DeepEP and a GPU per rank) or a modelled tune where the model "
    "bench is calibrated (--bench model) records the SM scan and the kept configs that report draws"
)


def nothing_to_draw(provenance) -> str:
    """Why a policy has no figure, and what would give it one."""
    if provenance.source == "default":
        return f"nothing tuned to draw, a plan holds DeepEP's defaults; {WHAT_DRAWS}"
    if provenance.source == "extrapolated":
        why = provenance.note or "DeepEP's default configs"
        return f"nothing tuned to draw, the tune kept DeepEP's defaults (extrapolated): {why}; {WHAT_DRAWS}"
    return f"nothing tuned to draw ({provenance.source}, no SM scan or kept configs recorded)"
