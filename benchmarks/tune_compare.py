#!/usr/bin/env python3
"""Issue-6 numbers on live GPUs: tuned config vs DeepEP's default table vs the best point of
DeepEP's own chunk sweep, at one SM budget; top configs re-measured in a fresh worker group with
95 % confidence intervals; plus a recorded grid for the sample-efficiency replay.

    python benchmarks/tune_compare.py --out tune_compare.json --sms 24 --tokens 4096 --trials 24
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import statistics
import sys
import time

from moepolicy.measure.shapes import BENCH_MODELS, bench_shape


def ci95(xs):
    m = statistics.mean(xs)
    if len(xs) < 2:
        return m, 0.0
    t = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78, 6: 2.57, 7: 2.45, 8: 2.36}.get(len(xs), 2.0)
    return m, t * statistics.stdev(xs) / math.sqrt(len(xs))


def main() -> int:
    import optuna

    from moepolicy.deepep.configs import default_configs
    from moepolicy.datasheets import deepep_sheet
    from moepolicy.tuning.bench import TrialFailed, TunePoint, Workload
    from moepolicy.tuning.live_bench import LiveBench
    from moepolicy.tuning.space import load_space
    from moepolicy.tuning.study import BucketResult, SubStudy, tune_bucket

    p = argparse.ArgumentParser()
    p.add_argument("--out", default="tune_compare.json")
    p.add_argument("--sms", type=int, default=24)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--trials", type=int, default=24)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--shapes", nargs="+", default=list(BENCH_MODELS), choices=list(BENCH_MODELS))
    p.add_argument(
        "--grid", action="store_true", help="also record the dispatch grid for the replay"
    )
    args = p.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    import torch

    world = torch.cuda.device_count()
    if world < 2:
        print("tune_compare: needs at least 2 GPUs", file=sys.stderr)
        return 2
    sheet = deepep_sheet("deepep-legacy-29d31c0")
    default = default_configs(sheet, world)
    space = load_space()
    out = {
        "provenance": {
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(["tune_compare.py", *sys.argv[1:]]),
            "deepep_commit": "29d31c0",
            "region": "full call + combine",
            "sms": args.sms,
            "tokens": args.tokens,
            "ep_size": world,
        },
        "shapes": {},
    }
    for shape in args.shapes:
        dims = bench_shape(shape)
        hidden, experts, top_k = dims.hidden, dims.experts, dims.top_k
        work = Workload(hidden, experts, top_k, world, "fp8")
        bench = LiveBench(world, 1024 * 1024 * 1024, trial_timeout_s=90, reps=20)
        t0 = time.monotonic()

        def total(point, bench=bench, work=work):
            return bench.measure(work, point).objective("full")

        # DeepEP's own sweep (tests/test_intranode.py): dispatch nvl chunk 4..32 step 2 at recv 256, then combine 1..16
        sweep_d = {}
        for send in range(4, 33, 2):
            d = (send, 256, default[0][2], default[0][3])
            sweep_d[send] = total(TunePoint(args.sms, args.tokens, d, default[1]))
        best_d = min(sweep_d, key=sweep_d.get)
        sweep_c = {}
        for send in range(1, 17):
            c = (send, 256, default[1][2], default[1][3])
            sweep_c[send] = total(
                TunePoint(args.sms, args.tokens, (best_d, 256, default[0][2], default[0][3]), c)
            )
        best_c = min(sweep_c, key=sweep_c.get)
        sweep_best = TunePoint(
            args.sms,
            args.tokens,
            (best_d, 256, default[0][2], default[0][3]),
            (best_c, 256, default[1][2], default[1][3]),
        )
        sweep_s = time.monotonic() - t0
        # the tuner
        storage = optuna.storages.RDBStorage(f"sqlite:///{shape}-compare.db")
        bucket = BucketResult(args.tokens, 1.0)
        t1 = time.monotonic()
        tune_bucket(
            storage,
            SubStudy(f"{shape}/sms{args.sms}/t{args.tokens}", args.sms, args.trials, default),
            bench,
            work,
            space,
            bucket,
        )
        tune_s = time.monotonic() - t1
        study = optuna.load_study(
            study_name=f"{shape}/sms{args.sms}/t{args.tokens}", storage=storage
        )
        done = sorted(
            [t for t in study.trials if t.value is not None and "effective" in t.user_attrs],
            key=lambda t: t.value,
        )
        top, seen = [], set()
        for t in done:
            if t.user_attrs["effective"] not in seen:
                seen.add(t.user_attrs["effective"])
                eff = json.loads(t.user_attrs["effective"])
                top.append(TunePoint(eff[0], eff[1], tuple(eff[2]), tuple(eff[3])))
            if len(top) == 3:
                break
        grid = {}
        if args.grid:
            for recv in (128, 256, 384, 512):
                for send in range(2, 33, 2):
                    if send < recv:
                        grid[f"{send},{recv}"] = total(
                            TunePoint(
                                args.sms,
                                args.tokens,
                                (send, recv, default[0][2], default[0][3]),
                                default[1],
                            )
                        )
        bench.close()
        # re-measure in a fresh worker group
        fresh = LiveBench(world, 1024 * 1024 * 1024, trial_timeout_s=90, reps=20)
        candidates = {
            "default": TunePoint(args.sms, args.tokens, *default),
            "deepep_sweep_best": sweep_best,
        }
        candidates.update({f"tuned_top{i + 1}": pt for i, pt in enumerate(top)})
        remeasured = {}
        for name, pt in candidates.items():
            xs = []
            for _ in range(args.repeats):
                try:
                    xs.append(fresh.measure(work, pt).objective("full"))
                except TrialFailed as exc:
                    print(f"{shape} {name}: {exc}")
            mean, half = ci95(xs) if xs else (float("nan"), float("nan"))
            remeasured[name] = {
                "point": [pt.num_sms, list(pt.dispatch), list(pt.combine)],
                "samples_us": xs,
                "mean_us": mean,
                "ci95_us": half,
            }
            print(
                f"{shape:14} {name:18} {mean:8.1f} +- {half:5.1f} us  d{pt.dispatch[:2]} c{pt.combine[:2]}",
                flush=True,
            )
        fresh.close()
        out["shapes"][shape] = {
            "sweep_dispatch_us": sweep_d,
            "sweep_combine_us": sweep_c,
            "sweep_seconds": sweep_s,
            "tune_seconds": tune_s,
            "trials": args.trials,
            "remeasured": remeasured,
            "grid_dispatch_us": grid,
            "restarts": bench.restarts,
        }
        with open(args.out, "w") as fh:
            json.dump(out, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
