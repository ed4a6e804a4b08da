"""``moepolicy models``: list the built-in catalog."""

from __future__ import annotations

import argparse

from moepolicy.checkpoint import catalog
from moepolicy.checkpoint.reader import facts_from_raw
from moepolicy.checkpoint.source import resolve
from moepolicy.cli._output import add_format_flag, print_json, table
from moepolicy.settings import offline_reason


def _scheme(facts) -> str:
    layer = facts.first_moe
    if layer is None:
        return facts.quant_method
    w, a = layer.weights, layer.activations
    act = "bf16" if a.dtype == "none" else a.dtype
    if a.granularity == "group" and a.group:
        act += f"/1x{a.group}"
    elif a.granularity not in ("none",):
        act += f"/{a.granularity}"
    if a.dynamic in ("static", "dynamic"):
        act += f" {a.dynamic}"
    weight = "bf16" if w.dtype == "none" else w.dtype
    return f"{facts.quant_method}: W {weight}, A {act}"


HEADERS = (
    "model",
    "quant scheme (experts)",
    "moe",
    "dense",
    "experts",
    "top-k",
    "hidden",
    "config",
)
KEYS = ("model", "scheme", "moe_layers", "dense_layers", "experts", "top_k", "hidden", "config")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list the built-in catalog of MoE checkpoints")
    add_format_flag(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    rows = []
    for entry in catalog.entries():
        facts = facts_from_raw(resolve(str(entry.folder)))
        moe = facts.first_moe
        rows.append(
            [
                entry.repo_id,
                _scheme(facts),
                len(facts.moe_layers),
                len(facts.dense_layers),
                moe.num_experts if moe else 0,
                moe.top_k if moe else 0,
                facts.hidden_size,
                "partial" if entry.partial else "complete",
            ]
        )
    if args.format == "json":
        print_json([dict(zip(KEYS, row)) for row in rows])
        return 0
    table(HEADERS, rows)
    partial = [entry for entry in catalog.entries() if entry.partial]
    if partial:
        reason = offline_reason()
        where = (  # offline, no revision can be downloaded
            f"its folder or config.json, or its snapshot in the Hugging Face cache ({reason}: the hub "
            "is not read)"
            if reason
            else "its folder, or its id with a revision (org/name@main) from the hub"
        )
        print(
            "partial: the catalog's copy lacks part of the real config (its SOURCE.md, below, says "
            f"what); plan from the checkpoint instead: {where}"
        )
        for entry in partial:
            print(f"  {entry.repo_id}: {entry.folder / 'SOURCE.md'}")
    return 0
