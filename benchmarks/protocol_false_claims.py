#!/usr/bin/env python3
"""How often each claim a policy can make is false, under null benches of five noise models, and how
much printed gains are inflated under small true gains: the project's protocol functions driven by
benches whose true times are known (``moepolicy.testing.claims_sim``). CPU only.

    python benchmarks/protocol_false_claims.py [--runs 1000] [--out raw.json] > raw.log
    python benchmarks/protocol_false_claims.py --only sm:heavy --runs 2000 --seed0 1000   # one cell again

Reports per policy (SM count, chunks, order, DeepEP v2 settings, overlap split, a ``bench`` run's 12
comparisons) and noise model the false claims in ``--runs`` null runs with a 95 % Wilson interval;
the power for small true gains; the net-loss case of issue 32; the printed gain against the truth
(report rounds, and the gate rounds the 2.1 protocol printed from); and, apart, a noise model beyond
the test's assumptions. ``tests/tuning/test_false_claims.py`` asserts a reduced run of the same.
"""

from __future__ import annotations

import argparse
import json
import math
import time


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    p = k / n
    centre, spread = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, (centre - spread) / (1 + z * z / n)), (centre + spread) / (1 + z * z / n)


def _row(k: int, n: int) -> dict:
    low, high = wilson(k, n)
    return {
        "claims": k,
        "runs": n,
        "rate": round(k / n, 4),
        "ci95": [round(low, 4), round(high, 4)],
    }


def null_rates(S, runs: int, rounds: int, seed0: int = 0, only: tuple = ()) -> dict:
    out = {}
    for policy in S.POLICIES:
        out[policy] = {}
        for kind in S.NOISE_MODELS:
            if only and (policy, kind) not in only:
                continue
            started = time.monotonic()
            out[policy][kind] = _row(S.rate(policy, kind, runs, rounds, seed0=seed0), runs)
            r = out[policy][kind]
            print(
                f"null  {policy:8} {kind:9} {r['claims']:4}/{runs} = {r['rate']:.2%} "
                f"[{r['ci95'][0]:.2%}, {r['ci95'][1]:.2%}]  ({time.monotonic() - started:.0f} s)",
                flush=True,
            )
        if not out[policy]:
            del out[policy]
            continue
        total = sum(v["claims"] for v in out[policy].values())
        out[policy]["pooled"] = _row(total, runs * len(out[policy]))
        print(
            f"null  {policy:8} pooled    {total}/{runs * (len(out[policy]) - 1)} = "
            f"{out[policy]['pooled']['rate']:.2%}",
            flush=True,
        )
    return out


def bench_per_comparison(S, runs: int, rounds: int) -> dict:
    claims = comparisons = 0
    for seed in range(runs):
        k, m = S.bench_claims("iid", seed, rounds)
        claims, comparisons = claims + k, comparisons + m
    print(
        f"bench per comparison (iid): {claims}/{comparisons} = {claims / comparisons:.3%}",
        flush=True,
    )
    return _row(claims, comparisons)


def power(S, runs: int) -> dict:
    from moepolicy.measure.rounds import DEFAULT_ROUNDS, MIN_ROUNDS

    out = {}
    for rounds in (MIN_ROUNDS, 11, DEFAULT_ROUNDS):
        for gain in (1.03, 1.05):
            moved = sum(
                S.serial_tune("iid", seed, rounds, S.Gains((gain,) * 3)).num_sms != S.ENGINE_SMS
                for seed in range(runs)
            )
            out[f"{rounds} rounds, x{gain}"] = _row(moved, runs)
            print(
                f"power: SM count truly x{gain} faster in every bucket, 3% noise, {rounds} rounds: moved "
                f"{moved}/{runs} = {moved / runs:.1%}",
                flush=True,
            )
    return out


def net_loss(S, runs: int, rounds: int) -> dict:
    moved = sum(
        S.serial_tune("iid", seed, rounds, S.Gains((0.95, 0.95, 1.03))).num_sms != S.ENGINE_SMS
        for seed in range(runs)
    )
    print(
        f"net loss x0.95 / x0.95 / x1.03 (3% noise): the SM count moved {moved}/{runs}", flush=True
    )
    return _row(moved, runs)


def inflation(S, runs: int, rounds: int) -> dict:
    out = {}
    for sigma, gain in ((0.03, 1.01), (0.03, 1.02), (0.05, 1.02)):
        f = S.inflation("iid", gain, runs, rounds, sigma=sigma)
        key = f"x{gain} under {sigma:.0%} noise"
        out[key] = {
            "true": gain,
            "runs": runs,
            "moved": f.moved,
            "printed_report_mean": f.report_mean,
            "gate_rounds_mean": f.gate_mean,
        }
        print(
            f"inflation: {key}: moved {f.moved}/{runs}; printed (report rounds) x{f.report_mean:.4f}, "
            f"the gate rounds' figure x{f.gate_mean:.4f} (the truth x{gain})",
            flush=True,
        )
    return out


def beyond(S, runs: int, rounds: int) -> dict:
    out = {}
    for kind in S.BEYOND_ASSUMPTIONS:
        moved = sum(
            S.serial_tune(kind, seed, rounds).num_sms != S.ENGINE_SMS for seed in range(runs)
        )
        out[kind] = _row(moved, runs)
        print(
            f"beyond the test's assumptions: {kind}: false SM moves {moved}/{runs} = {moved / runs:.1%}",
            flush=True,
        )
    return out


def main() -> int:
    from moepolicy.measure.rounds import DEFAULT_ROUNDS
    from moepolicy.testing import claims_sim as S

    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=1000, help="null runs per policy and noise model")
    p.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    p.add_argument("--out", help="write the numbers as JSON")
    p.add_argument("--seed0", type=int, default=0, help="the first seed of the null runs")
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="POLICY:NOISE",
        help="only these null cells (repeatable), nothing else",
    )
    args = p.parse_args()
    started = time.monotonic()
    if args.only:
        cells = tuple(tuple(cell.split(":", 1)) for cell in args.only)
        print(
            f"null cells {', '.join(args.only)}: {args.runs} runs from seed {args.seed0}, {args.rounds} rounds",
            flush=True,
        )
        report = {
            "runs": args.runs,
            "seed0": args.seed0,
            "null": null_rates(S, args.runs, args.rounds, args.seed0, cells),
        }
        if args.out:
            with open(args.out, "w") as f:
                json.dump(report, f, indent=1)
        return 0
    print(
        f"protocol false claims: {args.runs} runs per policy and noise model, {args.rounds} rounds, 3% noise, "
        f"buckets {[t for t, _ in S.BUCKETS]}",
        flush=True,
    )
    report = {
        "runs": args.runs,
        "rounds": args.rounds,
        "sigma": 0.03,
        "null": null_rates(S, args.runs, args.rounds),
        "bench_per_comparison": bench_per_comparison(S, args.runs // 2, args.rounds),
        "power": power(S, args.runs // 4),
        "net_loss": net_loss(S, args.runs // 2, args.rounds),
        "inflation": inflation(S, args.runs, args.rounds),
        "beyond_assumptions": beyond(S, args.runs // 2, args.rounds),
    }
    print(f"done in {time.monotonic() - started:.0f} s", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
