#!/usr/bin/env python3
"""Sample efficiency on recorded live measurements: optuna TPE vs random search.

Replays samplers over the dispatch grid that benchmarks/tune_compare.py --grid measured on 2 x H200
(nvl send chunk x receive capacity, full call + combine, one value per point), counting how many
measurements each needs to get within 2 % of the grid's best. The default config is NOT enqueued; "tpe" is the tuner's own sampler
(moepolicy.tuning.study.make_sampler).

    python benchmarks/sample_efficiency.py benchmarks/raw/2026-11-30-run4-tune_compare.json
"""

from __future__ import annotations

import json
import statistics
import sys


def trials_to_target(
    values: dict[tuple[int, int], float], sampler, target: float, budget: int
) -> int:
    import optuna

    sends = sorted({s for s, _ in values})
    recvs = sorted({r for _, r in values})
    study = optuna.create_study(sampler=sampler)
    for n in range(1, budget + 1):
        trial = study.ask()
        recv = trial.suggest_categorical("nvl_recv", recvs)
        send = trial.suggest_categorical("nvl_send", sends)
        value = values.get(
            (send, recv), max(values.values()) * 2
        )  # infeasible (send >= recv): worst
        study.tell(trial, value)
        if value <= target:
            return n
    return budget + 1


def main(path: str, seeds: int = 10, budget: int = 64) -> int:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    data = json.load(open(path))
    print(f"source: {path} ({data['provenance']['date']}, {data['provenance']['command']})")
    for shape, rec in data["shapes"].items():
        grid = {
            tuple(int(v) for v in k.split(",")): us for k, us in rec["grid_dispatch_us"].items()
        }
        if not grid:
            continue
        best = min(grid.values())
        target = best * 1.02
        within = sum(1 for v in grid.values() if v <= target)
        res = {}
        from moepolicy.tuning.study import make_sampler

        for name, make in (
            ("tpe", make_sampler),
            ("random", lambda s: optuna.samplers.RandomSampler(seed=s)),
        ):
            res[name] = [trials_to_target(grid, make(s), target, budget) for s in range(seeds)]
        print(
            f"{shape}: {len(grid)} points, best {best:.1f} us, {within} within 2 %; measurements to reach it "
            f"over {seeds} seeds: TPE mean {statistics.mean(res['tpe']):.1f} (median {statistics.median(res['tpe'])}), "
            f"random mean {statistics.mean(res['random']):.1f} (median {statistics.median(res['random'])})"
        )
        print(f"  tpe {res['tpe']}\n  random {res['random']}")
    return 0


if __name__ == "__main__":
    import argparse

    cli = argparse.ArgumentParser()
    cli.add_argument("grid", nargs="?", default="benchmarks/raw/2026-11-30-run4-tune_compare.json")
    cli.add_argument("--seeds", type=int, default=10)
    a = cli.parse_args()
    sys.exit(main(a.grid, seeds=a.seeds))
