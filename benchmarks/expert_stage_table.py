"""The expert-stage campaign's table for docs/BENCHMARKS.md, from a raw file of
benchmarks/expert_stage.py: per cell, the verdict of the exact paired sign-flip test on the even
(decide) rounds, Holm over the cells of one model, regime and EP size, and the figures (medians,
speed-up, 95 % interval) from the odd (report) rounds, which decided nothing.

    python benchmarks/expert_stage_table.py benchmarks/raw/2026-12-04-1xh200-expert-stage-deepgemm.json --regime gpu
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    from moepolicy.measure.rounds import holm, interval_words, paired_speedup, speedup_words

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw")
    ap.add_argument("--regime", default="gpu", choices=["host", "gpu"])
    args = ap.parse_args()
    raw = json.loads(Path(args.raw).read_text())
    cells = [c for c in raw["cells"] if c["regime"] == args.regime]
    if cells and "a" in cells[0]["us"]:
        return null_table(cells, raw, args.regime)
    families: dict = {}
    for c in cells:
        families.setdefault((c["model"], c["ep"]), []).append(c)
    print(
        "| model | EP | tokens/rank | rows received | quant->dispatch us | dispatch->quant us "
        "| quant sent / received us | quantizing first (report rounds) | decide rounds |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for (model, ep), group in families.items():
        decide = holm(
            [
                paired_speedup(
                    c["us"]["dispatch_then_quant"][0::2], c["us"]["quant_then_dispatch"][0::2]
                )
                for c in group
            ],
            side="both",
            family="buckets",
        )
        for c, d in zip(group, decide):
            q, r = c["us"]["quant_then_dispatch"][1::2], c["us"]["dispatch_then_quant"][1::2]
            rep = paired_speedup(r, q)
            qs = statistics.median(c["us"]["quant_sent"][1::2])
            qr = statistics.median(c["us"]["quant_received"][1::2])
            print(
                f"| {model} | {ep} | {c['tokens']} | {c['rows']} | {statistics.median(q):.0f} | "
                f"{statistics.median(r):.0f} | {qs:.1f} / {qr:.1f} | {speedup_words(rep.speedup)} "
                f"({interval_words(rep.low, rep.high)}) | {d.verdict} |"
            )
    print(
        f"\n{raw['gpu']}, {raw['torch']}, {raw['deep_gemm']}, {raw['date']}; {raw['rounds']} rounds "
        f"({raw['rounds'] // 2} decide + {raw['rounds'] // 2} report) x {raw['reps']} repetitions, "
        f"{args.regime} regime; verdicts: exact sign-flip, 2.5 % per side, Holm over each row group"
    )
    return 0


def null_table(cells, raw, regime) -> int:
    """An A/A run (``expert_stage.py --null``): how often the test claims a difference between two
    arms that run the same work, per cell unadjusted and per row group under Holm."""
    from moepolicy.measure.rounds import holm, paired_speedup

    families: dict = {}
    for c in cells:
        families.setdefault((c["model"], c["ep"]), []).append(c)
    unadjusted = adjusted = groups_claiming = 0
    for group in families.values():
        tests = [paired_speedup(c["us"]["a"][0::2], c["us"]["b"][0::2]) for c in group]
        unadjusted += sum(t.verdict != "within noise" for t in tests)
        family = holm(tests, side="both", family="buckets")
        claims = sum(t.verdict != "within noise" for t in family)
        adjusted += claims
        groups_claiming += claims > 0
    print(
        f"A/A, {regime} regime, {len(cells)} cells in {len(families)} groups: {unadjusted} cells "
        f"claimed a difference unadjusted (5 % expected at most), {adjusted} under Holm; "
        f"{groups_claiming} of {len(families)} groups claimed any (5 % per group at most); "
        f"{raw['gpu']}, {raw['date']}, {raw['rounds']} rounds ({raw['rounds'] // 2} decide)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
