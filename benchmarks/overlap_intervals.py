#!/usr/bin/env python3
"""The overlap table's figures as paired comparisons: for each ``tune --overlap`` policy given, each
bucket's per-round ratios to vLLM's split (``vs_vllm_split_per_round``, the launch order the split was
chosen for) as a paired geometric mean with its 95 % t-interval, the exact signed-rank sign-flip test's one-sided
p-value, and the ratio of medians the policy's ``vs_vllm_split`` printed. CPU only.

    python benchmarks/overlap_intervals.py benchmarks/raw/2026-11-30-run49-overlap-*.yaml ...

The t-interval is descriptive: those runs had 5 rounds, too few for a 95 % sign-flip interval (its
smallest one-sided p-value is 1/32), and their rounds also chose the split (selected, not fresh).
"""

from __future__ import annotations

import math
import statistics
import sys

# Student's t, 97.5 % quantile, by degrees of freedom
T975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    11: 2.201,
    12: 2.179,
    13: 2.160,
    14: 2.145,
    15: 2.131,
    16: 2.120,
    17: 2.110,
    18: 2.101,
    19: 2.093,
}


def paired(ratios: list[float]) -> dict:
    from moepolicy.measure.rounds import signed_rank

    logs = [math.log(r) for r in ratios]
    n, mean = len(logs), statistics.fmean(logs)
    half = T975[n - 1] * statistics.stdev(logs) / math.sqrt(n)
    p_lower = signed_rank(
        [-x for x in logs]
    ).p_faster  # p of "this split is faster" (ratio below 1)
    return {
        "rounds": n,
        "geomean": round(math.exp(mean), 3),
        "t95": [round(math.exp(mean - half), 3), round(math.exp(mean + half), 3)],
        "p_faster": round(p_lower, 4),
    }


def main(paths: list[str]) -> int:
    import yaml

    for path in paths:
        doc = yaml.safe_load(open(path))
        print(path)
        previous = None
        for bucket in doc["deepep"]["buckets"]:
            m = bucket["measured"]
            name = f"<= {bucket['max_tokens']}" if bucket["max_tokens"] else f"> {previous}"
            previous = bucket["max_tokens"]
            r = paired(m["vs_vllm_split_per_round"])
            print(
                f"  {name} tokens ({m['objective']}): ratio of medians {m['vs_vllm_split']}; paired geometric mean "
                f"{r['geomean']} (95% t-interval {r['t95'][0]}-{r['t95'][1]}, {r['rounds']} rounds), "
                f"speed-up x{1 / r['geomean']:.3f} [x{1 / r['t95'][1]:.3f}-x{1 / r['t95'][0]:.3f}]; "
                f"sign-flip p = {r['p_faster']}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
