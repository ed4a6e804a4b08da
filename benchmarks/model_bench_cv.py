#!/usr/bin/env python3
"""Cross-validated error of the model bench's dispatch fit (the calibration in moepolicy/data/tuning/calibration).

Leave-one-point-out and leave-one-shape-out (a shape = hidden size x wire dtype, all its SM counts):
refit on the rest with the model bench's own fitting, predict what was left out, report the relative
errors. Only the cached-handle dispatch has enough points to hold any out; the combine fit (4 points at
one SM count) and the full-call overhead (3 points) are reported as fitted, not cross-validated.

    python benchmarks/model_bench_cv.py [--out cv.json]
"""

from __future__ import annotations

import argparse
import json
import statistics


def main() -> int:
    from moepolicy._resources import data_dir
    from moepolicy.datasheets import read_yaml
    from moepolicy.tuning.model_bench import _fit, _row_bytes, destination_ranks

    p = argparse.ArgumentParser()
    p.add_argument("--out")
    args = p.parse_args()
    samples = []  # (shape, rows, row_bytes, sms, us)
    for path in sorted((data_dir("tuning") / "calibration").glob("*.yaml")):
        raw = read_yaml(path)
        ep = int(raw["provenance"]["ep_size"])
        for pt in raw["points"]:
            if pt["op"] != "dispatch" or pt["region"] != "cached":
                continue
            rows = pt["tokens"] * destination_ranks(pt["experts"], pt["top_k"], ep)
            for s, us in zip(pt["num_sms"], pt["us"]):
                samples.append(((pt["hidden"], pt["dtype"], pt["tokens"]), rows, _row_bytes(pt["hidden"], pt["dtype"]),
                                s, us))
    report = {}
    for name, held in (("leave-one-point-out", [[i] for i in range(len(samples))]),
                       ("leave-one-shape-out", [[i for i, s in enumerate(samples) if s[0] == shape]
                                                for shape in sorted({s[0] for s in samples})])):
        errors = []
        for out in held:
            fit = _fit([s[1:] for i, s in enumerate(samples) if i not in out])
            for i in out:
                _, rows, rb, sms, us = samples[i]
                errors.append(abs(fit(rows, rb, sms) - us) / us)
        report[name] = {"points": len(errors), "median_error": round(statistics.median(errors), 4),
                        "max_error": round(max(errors), 4), "mean_error": round(statistics.fmean(errors), 4)}
        print(f"{name}: {len(errors)} held-out points, median error {statistics.median(errors):.1%}, "
              f"max {max(errors):.1%}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
