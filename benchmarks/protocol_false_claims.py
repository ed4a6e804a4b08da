#!/usr/bin/env python3
"""The protocol's claims against benches whose true times are known (``moepolicy.testing.claims_sim``):
the project's strategies and ``tuning.protocol`` driven as a tune drives them. CPU only.

    python benchmarks/protocol_false_claims.py [--runs 2000] [--out raw.json] > raw.log
    python benchmarks/protocol_false_claims.py --only sm:drift --runs 4000 --seed0 10000   # one cell again

Reports, each with a 95 % Wilson interval:

1. **false claims** per policy kind and noise model in ``--runs`` null runs (every arm truly equal),
   pooled over the noise models, beside the level each is stated at; ``policy`` is a whole live
   tune's claims together (the policy-level rate);
2. **power** per noise model: how often the SM count moves when it is truly x1.03 / x1.05 faster in
   every bucket (3 % noise), and the gate's test alone on the same paired rounds, the signed-rank
   statistic beside the mean of the log-ratios it replaced;
3. **printed figures** under small true gains (x1.01, x1.02; 3 % noise): among the runs that claimed,
   the mean figure printed (the report rounds') and the gate rounds' own figure (what was printed
   before), for every kind of claim with a figure;
4. the net loss of issue 32, and ``config-drift``, a noise model beyond the test's assumptions.

``tests/tuning/test_false_claims.py`` asserts a reduced run of the same.
"""

from __future__ import annotations

import argparse
import json
import math
import time

LEVELS = {"orders": 0.0125, "experts": 0.0125, "policy": 0.05, "bench": 0.05}  # else 0.025


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


def _say(label: str, r: dict, extra: str = "") -> None:
    print(
        f"{label}: {r['claims']}/{r['runs']} = {r['rate']:.2%} "
        f"[{r['ci95'][0]:.2%}, {r['ci95'][1]:.2%}]{extra}",
        flush=True,
    )


def null_rates(S, runs: int, rounds: int, seed0: int = 0, only: tuple = ()) -> dict:
    out = {}
    for policy in S.POLICIES:
        out[policy] = {}
        for kind in S.NOISE_MODELS:
            if only and (policy, kind) not in only:
                continue
            started = time.monotonic()
            out[policy][kind] = _row(S.rate(policy, kind, runs, rounds, seed0=seed0), runs)
            _say(
                f"null  {policy:8} {kind:10}",
                out[policy][kind],
                f"  ({time.monotonic() - started:.0f} s)",
            )
        if not out[policy]:
            del out[policy]
            continue
        total = sum(v["claims"] for v in out[policy].values())
        out[policy]["pooled"] = _row(total, runs * len(out[policy]))
        level = LEVELS.get(policy, 0.025)
        out[policy]["stated"] = level
        _say(f"null  {policy:8} pooled    ", out[policy]["pooled"], f"  (stated {level:.2%})")
    return out


def bench_per_comparison(S, runs: int, rounds: int) -> dict:
    claims = comparisons = 0
    for seed in range(runs):
        k, m = S.bench_claims("iid", seed, rounds)
        claims, comparisons = claims + k, comparisons + m
    out = _row(claims, comparisons)
    _say("bench per comparison (iid)", out)
    return out


def mean_test_p(logs: list[float]) -> float:
    """The test the gate used before: the exact sign-flip test of the mean of the log-ratios
    (one-sided p of a mean above 0), every pattern counted."""
    import numpy as np

    sums = np.zeros(1)
    for x in logs:
        sums = np.concatenate((sums, sums + x))
    return float(np.count_nonzero(sums <= 1e-12 * max(1.0, sum(map(abs, logs))))) / len(sums)


def gate_alone(S, kind: str, gain: float, seed: int, rounds: int, sigma: float = 0.03):
    """The engine (A) and the moved SM count (B, truly ``gain`` faster) timed AB, BA, ... as the
    gate times them: the one-sided p of B faster, by the signed-rank test and by the mean test."""
    from moepolicy.measure.rounds import signed_rank
    from moepolicy.testing.claims_sim import ENGINE_SMS, Noise

    class Sms:
        def __init__(self, n):
            self.num_sms = n

    noise, a, b = Noise(kind, sigma, seed), Sms(ENGINE_SMS), Sms(48)
    noise.factor(b)  # the warm-up pass ends on B: the first round's A follows A's own order
    logs = []
    for r in range(rounds):
        order = (a, b) if r % 2 == 0 else (b, a)
        got = {id(x): (100.0 / (gain if x is b else 1.0)) * noise.factor(x) for x in order}
        logs.append(math.log(got[id(a)] / got[id(b)]))
    return signed_rank(logs).p_faster, mean_test_p(logs)


def power(S, runs: int, rounds: int) -> dict:
    out = {}
    for gain in (1.03, 1.05):
        for kind in S.NOISE_MODELS:
            moved = sum(
                S.serial_tune(kind, seed, rounds, S.Gains((gain,) * 3)).num_sms != S.ENGINE_SMS
                for seed in range(runs)
            )
            tests = [gate_alone(S, kind, gain, seed, rounds) for seed in range(runs)]
            ranks = sum(p <= 0.025 for p, _ in tests)
            means = sum(q <= 0.025 for _, q in tests)
            key = f"x{gain} {kind}"
            out[key] = {
                "protocol_moved": _row(moved, runs),
                "gate_signed_rank": _row(ranks, runs),
                "gate_mean": _row(means, runs),
            }
            print(
                f"power x{gain} {kind:10}: the SM count moved {moved / runs:.1%}; the gate's test "
                f"alone: signed-rank {ranks / runs:.1%}, mean of log-ratios {means / runs:.1%}",
                flush=True,
            )
    return out


def figures(S, runs: int, rounds: int) -> dict:
    out = {}
    for policy in S.FIGURES:
        for gain in (1.01, 1.02):
            f = S.inflation("iid", gain, runs, rounds, sigma=0.03, policy=policy)
            key = f"{policy} x{gain}"
            out[key] = {
                "true": gain,
                "runs": runs,
                "claimed": f.moved,
                "printed_mean": f.report_mean,
                "gate_rounds_mean": f.gate_mean,
            }
            if f.moved:
                over = (f.report_mean - 1) / (gain - 1) - 1
                gate = (f.gate_mean - 1) / (gain - 1) - 1
                print(
                    f"figures {policy:8} true x{gain}: claimed {f.moved}/{runs}; printed "
                    f"x{f.report_mean:.4f} ({over:+.0%} of the gain), the gate rounds' x{f.gate_mean:.4f} "
                    f"({gate:+.0%})",
                    flush=True,
                )
    return out


def net_loss(S, runs: int, rounds: int) -> dict:
    moved = sum(
        S.serial_tune("iid", seed, rounds, S.Gains((0.95, 0.95, 1.03))).num_sms != S.ENGINE_SMS
        for seed in range(runs)
    )
    out = _row(moved, runs)
    _say("net loss x0.95 / x0.95 / x1.03 (3% noise): the SM count moved", out)
    return out


def beyond(S, runs: int, rounds: int) -> dict:
    out = {}
    for kind in S.BEYOND_ASSUMPTIONS:
        moved = sum(
            S.serial_tune(kind, seed, rounds).num_sms != S.ENGINE_SMS for seed in range(runs)
        )
        out[kind] = _row(moved, runs)
        _say(f"beyond the test's assumptions: {kind}: false SM moves", out[kind])
    return out


def main() -> int:
    from moepolicy.measure.rounds import DEFAULT_ROUNDS
    from moepolicy.testing import claims_sim as S

    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=2000, help="null runs per policy and noise model")
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
    else:
        print(
            f"protocol claims: {args.runs} null runs per policy and noise model, {args.rounds} rounds, "
            f"3% noise, buckets {[t for t, _ in S.BUCKETS]}",
            flush=True,
        )
        report = {
            "runs": args.runs,
            "rounds": args.rounds,
            "sigma": 0.03,
            "null": null_rates(S, args.runs, args.rounds),
            "bench_per_comparison": bench_per_comparison(S, args.runs // 4, args.rounds),
            "power": power(S, args.runs // 4, args.rounds),
            "figures": figures(S, args.runs, args.rounds),
            "net_loss": net_loss(S, args.runs // 4, args.rounds),
            "beyond_assumptions": beyond(S, args.runs // 4, args.rounds),
        }
    print(f"done in {time.monotonic() - started:.0f} s", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
