#!/usr/bin/env python3
"""Does the model bench pick configs that are good live? On a shape it was not fitted to
(Qwen3-235B-A22B: hidden 4096, 128 experts, top-8, bf16 on the wire), tune with the model bench,
tune live, then re-measure both picks (and DeepEP's default) in a fresh worker group.

    python benchmarks/validate_model_bench.py --out validate_model_bench.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import statistics
import sys


def main() -> int:
    import optuna

    from moepolicy.tuning.bench import TunePoint, Workload
    from moepolicy.tuning.live_bench import LiveBench
    from moepolicy.tuning.model_bench import ModelBench
    from moepolicy.tuning.space import load_space
    from moepolicy.tuning.study import BucketResult, SubStudy, tune_bucket

    p = argparse.ArgumentParser()
    p.add_argument("--out", default="validate_model_bench.json")
    p.add_argument("--sms", type=int, default=24)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--trials", type=int, default=24)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    work = Workload(4096, 128, 8, 2, "bf16")
    default = ((24, 256, 6, 132), (10, 256, 6, 132))
    space = load_space()
    picks = {}
    for name, bench in (("model", ModelBench("h200")), ("live", LiveBench(2, 1 << 30, reps=20))):
        bucket = BucketResult(args.tokens, 1.0)
        tune_bucket(
            optuna.storages.InMemoryStorage(),
            SubStudy(name, args.sms, args.trials, default),
            bench,
            work,
            space,
            bucket,
        )
        bench.close()
        picks[name] = bucket.best
        print(
            f"{name} bench picks d{bucket.best.dispatch[:2]} c{bucket.best.combine[:2]}",
            flush=True,
        )
    picks["default"] = TunePoint(args.sms, args.tokens, *default)
    fresh = LiveBench(2, 1 << 30, reps=20)
    results = {}
    for name, point in picks.items():
        xs = [fresh.measure(work, point).objective("full") for _ in range(args.repeats)]
        mean = statistics.mean(xs)
        half = 2.78 * statistics.stdev(xs) / math.sqrt(len(xs))
        results[name] = {
            "point": [point.num_sms, list(point.dispatch), list(point.combine)],
            "samples_us": xs,
            "mean_us": mean,
            "ci95_us": half,
        }
        print(f"{name:8} {mean:8.1f} +- {half:5.1f} us", flush=True)
    fresh.close()
    ratio = results["model"]["mean_us"] / results["live"]["mean_us"]
    print(f"model pick / live pick = {ratio:.3f} (target <= 1.03)")
    json.dump(
        {
            "provenance": {
                "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                "command": " ".join(["validate_model_bench.py", *sys.argv[1:]]),
                "shape": "hidden 4096, 128 experts, top-8, bf16 (Qwen3-235B-A22B)",
                "deepep_commit": "29d31c0",
            },
            "results": results,
            "ratio_model_over_live": ratio,
        },
        open(args.out, "w"),
        indent=2,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
