#!/usr/bin/env python3
"""Cross-validated error of the model bench (the calibration in moepolicy/data/tuning/calibration,
whose raw source is benchmarks/raw/2026-11-29-deepep-calibration-FACTS.md).

Refits the model bench's own fits (``model_bench.fit_ops``: the dispatch's exponent by grid search, the
combine with the same exponent) without what is held out and compares the prediction with the
measurement:

- leave-one-point-out, per op: the error the tuner uses (``CalibratedEnvelope.error_at``: the largest
  at a hidden size, token count and SM count, over both ops), listed per point;
- leave-one-shape-out (a shape = op x hidden x wire dtype x token count, all its SM counts);
- every point at 20 SMs held out at once: what the model says at 128 and 1024 tokens when the only
  SM count measured there is not seen (every 128/1024-token point is at 20 SMs).

    python benchmarks/model_bench_cv.py [--out cv.json]
"""

from __future__ import annotations

import argparse
import json
import statistics


def _summary(errors: list[float]) -> dict:
    return {
        "points": len(errors),
        "median_error": round(statistics.median(errors), 4),
        "max_error": round(max(errors), 4),
        "mean_error": round(statistics.fmean(errors), 4),
    }


def _held_out(samples, groups) -> list[tuple]:
    from moepolicy.tuning.model_bench import fit_ops

    out = []
    for held in groups:
        dfit, cfit = fit_ops([x for i, x in enumerate(samples) if i not in held])
        for i in held:
            x = samples[i]
            fit = dfit if x.op == "dispatch" else cfit
            out.append((x, abs(fit(x.rows, x.row_bytes, x.sms) - x.us) / x.us))
    return out


def main() -> int:
    from moepolicy._resources import data_dir
    from moepolicy.datasheets import read_yaml
    from moepolicy.tuning.model_bench import calibration_samples, held_out_errors

    p = argparse.ArgumentParser()
    p.add_argument("--out")
    args = p.parse_args()
    report = {}
    for path in sorted((data_dir("tuning") / "calibration").glob("*.yaml")):
        raw = read_yaml(path)
        samples, _ = calibration_samples(raw["points"], int(raw["provenance"]["ep_size"]))
        lopo = held_out_errors(samples)
        shapes = sorted({(x.op, x.hidden, x.dtype, x.tokens) for x in samples})
        loso = _held_out(
            samples,
            [
                [i for i, x in enumerate(samples) if (x.op, x.hidden, x.dtype, x.tokens) == s]
                for s in shapes
            ],
        )
        at20 = _held_out(samples, [[i for i, x in enumerate(samples) if x.sms == 20]])
        entry = {}
        for name, found in (
            ("leave-one-point-out", lopo),
            ("leave-one-shape-out", loso),
            ("every 20-SM point held out", at20),
        ):
            for op in ("dispatch", "combine"):
                errors = [e for x, e in found if x.op == op]
                entry[f"{name}, {op}"] = _summary(errors)
                print(
                    f"{path.name}: {name}, {op}: {len(errors)} points, median {statistics.median(errors):.1%}, "
                    f"max {max(errors):.1%}"
                )
        entry["20-SM points held out, by token count"] = {
            str(t): round(max(e for x, e in at20 if x.tokens == t), 4)
            for t in sorted({x.tokens for x, _ in at20})
        }
        print(
            f"  every 20-SM point held out, largest error by token count: {entry['20-SM points held out, by token count']}"
        )
        entry["per point (leave-one-point-out)"] = [
            {
                "op": x.op,
                "hidden": x.hidden,
                "dtype": x.dtype,
                "tokens": x.tokens,
                "num_sms": x.sms,
                "us": x.us,
                "error": round(e, 4),
            }
            for x, e in lopo
        ]
        report[path.name] = entry
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
