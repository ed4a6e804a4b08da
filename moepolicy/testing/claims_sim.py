"""How often each claim a policy can make is false, and how much a printed gain is inflated: the
project's own protocol functions driven by benches whose true times are known, under the noise a
shared GPU shows. ``benchmarks/protocol_false_claims.py`` runs the full simulation (docs/BENCHMARKS.md,
"The protocol's claims"); ``tests/tuning/test_false_claims.py`` a reduced one.

Noise models (multiplicative, per measurement; ``sigma`` is the log-normal spread):

- ``iid``: log-normal;
- ``heavy``: Student-t with 3 degrees of freedom in log space, scaled to the same spread;
- ``outliers``: log-normal, and one measurement in 20 twice as slow;
- ``drift``: log-normal, on a machine that slows down 0.1 % per measurement and wanders (a shared
  random walk): every config alike;
- ``restart``: log-normal, and the first measurement after each start of the workers 1.5x slow.

Beyond these, ``config-drift`` (each config wanders on its own random walk within a worker group)
breaks the test's assumption that rounds are exchangeable: the full script reports it apart, as a
limit of the protocol, not as a level it keeps.

The policies (each counts a false claim when its true times are all equal):

- ``sm``: the SM count moved off the engine's (the search proposed 48 SMs; the engine runs 20);
- ``chunks``: a chunk config other than DeepEP's default kept (the search's top 3 equal to it);
- ``orders``: a layer switched to ``dispatch_then_quant`` (both orders equal);
- ``v2``: DeepEP v2 settings other than its default kept (five equal candidates);
- ``overlap``: a split other than vLLM's kept (three equal splits and vLLM's);
- ``bench``: any "faster" or "slower" among a ``moepolicy bench`` run's 12 comparisons of equal arms.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass
from typing import Callable, Optional

from moepolicy.deepep.configs import ChunkConfig
from moepolicy.tuning.bench import Bench, Measurement, TunePoint, Workload

NOISE_MODELS = ("iid", "heavy", "outliers", "drift", "restart")
BEYOND_ASSUMPTIONS = ("config-drift",)
POLICIES = ("sm", "chunks", "orders", "v2", "overlap", "bench")
BUCKETS = ((128, 1.0), (1024, 1.0), (4096, 1.0))
BASE_US = {128: 190.0, 1024: 270.0, 4096: 530.0}  # the modelled Qwen3-30B-A3B EP2 times at 20 SMs
ENGINE_SMS, CHOSEN_SMS = 20, 48
DEFAULT_CHUNKS = (ChunkConfig(24, 256, 6, 128), ChunkConfig(10, 256, 6, 128))
WORK = Workload(2048, 128, 8, 2, "fp8")


class Noise:
    """One noise model's multiplicative factor per measurement (see the module's doc)."""

    def __init__(self, kind: str, sigma: float, seed: int):
        if kind not in NOISE_MODELS + BEYOND_ASSUMPTIONS:
            raise ValueError(
                f"noise model must be one of {NOISE_MODELS + BEYOND_ASSUMPTIONS}, got {kind!r}"
            )
        self.kind, self.sigma, self.rng = kind, sigma, random.Random(seed)
        self.calls, self.walk, self.fresh = 0, 0.0, True
        self.walks: dict = {}

    def restart(self) -> None:
        self.fresh = True
        self.walks = {}

    def factor(self, key=None) -> float:
        rng, sigma = self.rng, self.sigma
        self.calls += 1
        if self.kind == "heavy":
            t3 = rng.gauss(0, 1) / math.sqrt(sum(rng.gauss(0, 1) ** 2 for _ in range(3)) / 3)
            f = math.exp(sigma * t3 / math.sqrt(3.0))
        else:
            f = math.exp(rng.gauss(0.0, sigma))
        if self.kind == "outliers" and rng.random() < 0.05:
            f *= 2.0
        if self.kind == "drift":
            self.walk = 0.95 * self.walk + rng.gauss(0.0, sigma)
            f *= (1 + 0.001 * self.calls) * math.exp(self.walk)
        if self.kind == "restart" and self.fresh:
            f *= 1.5
        if self.kind == "config-drift":
            self.walks[key] = 0.9 * self.walks.get(key, 0.0) + self.rng.gauss(0.0, sigma)
            f *= math.exp(self.walks[key])
        self.fresh = False
        return f


class KnownBench(Bench):
    """A bench whose true time per point is known (``true_us``), times a noise model's factor.
    Both orders, DeepEP v2 settings and overlapped splits are answered the same way."""

    name = "known"

    def __init__(self, true_us: Callable[[object], float], noise: Noise):
        self.true_us, self.noise = true_us, noise

    def restart(self) -> None:
        self.noise.restart()

    def close(self) -> None:
        pass

    def measure(self, workload: Workload, point: TunePoint) -> Measurement:
        us = self.true_us(point) * self.noise.factor(point)
        orders = {}
        if workload.both_orders:  # timed one after the other, each with its own noise
            first, second = ("quant_then_dispatch", "dispatch_then_quant")[
                :: 1 if workload.orders_first == "quant_then_dispatch" else -1
            ]
            orders = {
                first: self.true_us((first, point)) * self.noise.factor(),
                second: self.true_us((second, point)) * self.noise.factor(),
            }
        return Measurement(0.6 * us, 0.5 * us, 0.4 * us, "measured", orders)

    def measure_v2(self, workload: Workload, point, tokens: int) -> float:
        return self.true_us((point, tokens)) * self.noise.factor()

    def measure_overlap(self, workload: Workload, point: TunePoint, gemm_shape) -> dict:
        us = self.true_us(point) * self.noise.factor()
        comm, gemm = 0.7 * self.true_us(point), 0.9 * self.true_us(point)

        def part(v):
            return {"median_us": v, "min_us": v, "max_us": v, "reps": 5}

        return {
            "comm": part(comm),
            "gemm": part(gemm),
            "serial": part(comm + gemm),
            "overlapped": part(us),
            "overlapped_comm_end": part(comm),
            "overlapped_gemm_end": part(us),
            "comm_sms": point.num_sms,
            "gemm_sms": 132 - point.num_sms,
            "gemm_kind": "known",
        }


def _point(sms: int, tokens: int, send: int = 24) -> TunePoint:
    return TunePoint(sms, tokens, DEFAULT_CHUNKS[0].with_nvl_send(send), DEFAULT_CHUNKS[1])


@dataclass(frozen=True)
class Gains:
    """True speed-ups: the chosen SM count over the engine's per bucket, the top chunk config over
    DeepEP's default (1.0: no difference)."""

    sms: tuple[float, ...] = (1.0, 1.0, 1.0)
    chunks: float = 1.0


def serial_tune(
    kind: str,
    seed: int,
    rounds: int,
    gains: Gains = Gains(),
    chosen: int = CHOSEN_SMS,
    sigma: float = 0.03,
):
    """The serial tune's protocol (``confirm.run_protocol``) at the search's proposal: ``chosen`` SMs
    against the engine's 20, the search's top 3 chunk configs per bucket. Returns the protocol's
    result and the gate rounds' weighted speed-up of the chosen SM count (what the 2.1 protocol printed)."""
    from moepolicy.tuning.confirm import BucketCandidates, ConfirmSettings, run_protocol

    gain_by = {t: g for (t, _), g in zip(BUCKETS, gains.sms)}

    def true_us(point) -> float:
        us = BASE_US[point.tokens]
        if point.num_sms != ENGINE_SMS:
            us /= gain_by[point.tokens]
        return us / gains.chunks if point.dispatch[0] == 28 else us

    buckets = [
        BucketCandidates(
            t,
            w,
            (_point(chosen, t, 28), _point(chosen, t, 30), _point(chosen, t, 32)),
            _point(chosen, t),
            _point(ENGINE_SMS, t),
        )
        for t, w in BUCKETS
    ]
    bench = KnownBench(true_us, Noise(kind, sigma, seed))
    return run_protocol(bench, WORK, buckets, ConfirmSettings(rounds, "full", seed, True))


def orders_switched(kind: str, seed: int, rounds: int, sigma: float = 0.03) -> bool:
    """Both orders equal: does any bucket's verdict switch to dispatch_then_quant?"""
    from moepolicy.tuning.confirm import time_both_orders

    bench = KnownBench(
        lambda key: BASE_US[key[1].tokens] if isinstance(key, tuple) else BASE_US[key.tokens],
        Noise(kind, sigma, seed),
    )
    timings = time_both_orders(bench, WORK, {t: _point(ENGINE_SMS, t) for t, _ in BUCKETS}, rounds)
    return any(t.verdict == "dispatch_then_quant" for t in timings)


def v2_kept_other(kind: str, seed: int, rounds: int, sigma: float = 0.03) -> bool:
    """Five equal DeepEP v2 settings: is one other than DeepEP's default kept?"""
    from moepolicy.tuning.v2_tune import DEFAULT, choose_v2, v2_candidates

    bench = KnownBench(lambda key: BASE_US[key[1]], Noise(kind, sigma, seed))
    bench.noise_free = False
    return (
        choose_v2(bench, WORK, BUCKETS, v2_candidates((16, 32, 64)), rounds, seed).kept != DEFAULT
    )


def overlap_kept_other(kind: str, seed: int, rounds: int, sigma: float = 0.03) -> bool:
    """Three splits equal to vLLM's: is one other than vLLM's kept (phases 3-5 of the search)?"""
    from types import SimpleNamespace

    from moepolicy.tuning.overlap_search import SplitConfig, _Measurer, _select_gate_report

    plan = SimpleNamespace(
        model=SimpleNamespace(moe_layers=[SimpleNamespace(moe_intermediate_size=768)])
    )
    bench = KnownBench(lambda point: BASE_US[point.tokens] * 2, Noise(kind, sigma, seed))
    m = _Measurer(plan, bench, WORK, list(BUCKETS), "persistent", "grid")
    vllm = SplitConfig(ENGINE_SMS, DEFAULT_CHUNKS)
    candidates = [SplitConfig(c, DEFAULT_CHUNKS) for c in (24, 32, 40)] + [vllm]
    for cfg in candidates:  # the search's measurement of each (the bound reads them)
        m.once(cfg)
    measured = {cfg: m.weighted(m.seen[cfg]) for cfg in candidates}
    return _select_gate_report(m, candidates, measured, vllm, rounds).comm_sms != ENGINE_SMS


def bench_claims(kind: str, seed: int, rounds: int, sigma: float = 0.03) -> tuple[int, int]:
    """A ``moepolicy bench`` run over three equal arms, 2 routings x 3 buckets: (claims, comparisons)."""
    from moepolicy.cli.bench import comparison
    from moepolicy.measure.rounds import rotated_rounds

    noise = Noise(kind, sigma, seed)
    noise.restart()
    times = {
        routing: {
            str(t): rotated_rounds(
                ["policy", "vllm", "deepep-default"],
                lambda name, t=t: BASE_US[t] * noise.factor(),
                rounds,
                warm_up=True,
            )
            for t, _ in BUCKETS
        }
        for routing in ("uniform", "zipf")
    }
    rows = comparison(times)
    verdicts = [r[f"vs_{b}"]["verdict"] for r in rows for b in ("vllm", "deepep-default")]
    return sum(v in ("faster", "slower") for v in verdicts), len(verdicts)


def false_claim(policy: str, kind: str, seed: int, rounds: int, sigma: float = 0.03) -> bool:
    """One null run of ``policy`` under the noise model ``kind``: was a claim made (all false here)?"""
    if policy == "sm":
        return serial_tune(kind, seed, rounds, sigma=sigma).num_sms != ENGINE_SMS
    if policy == "chunks":
        done = serial_tune(kind, seed, rounds, chosen=ENGINE_SMS, sigma=sigma)
        return any(c.kept.name.startswith("top") for c in done.buckets.values())
    if policy == "orders":
        return orders_switched(kind, seed, rounds, sigma)
    if policy == "v2":
        return v2_kept_other(kind, seed, rounds, sigma)
    if policy == "overlap":
        return overlap_kept_other(kind, seed, rounds, sigma)
    if policy == "bench":
        return bench_claims(kind, seed, rounds, sigma)[0] > 0
    raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")


@dataclass(frozen=True)
class Inflation:
    """Printed gains under a small true gain: among the tunes that moved the SM count, the mean
    printed weighted speed-up from the report rounds (what is printed now) and from the gate rounds
    (what the 2.1 protocol printed: the rounds that decided), against the truth."""

    true: float
    runs: int
    moved: int
    report_mean: Optional[float]
    gate_mean: Optional[float]


def inflation(
    kind: str, gain: float, runs: int, rounds: int, sigma: float = 0.03, seed0: int = 0
) -> Inflation:
    """The SM count truly ``gain`` faster in every bucket (same chunks): mean printed figures."""
    report, gate = [], []
    for seed in range(seed0, seed0 + runs):
        done = serial_tune(kind, seed, rounds, Gains((gain, gain, gain)), sigma=sigma)
        if done.num_sms != ENGINE_SMS and done.weighted is not None:
            report.append(math.log(done.weighted.speedup))
            gate.append(math.log(done.gate.sms.speedup))
    true_weighted = gain  # equal gains: the weighted objective gains the same

    def mean(xs):
        return math.exp(statistics.fmean(xs)) if xs else None

    return Inflation(true_weighted, runs, len(report), mean(report), mean(gate))


def rate(
    policy: str, kind: str, runs: int, rounds: int, seed0: int = 0, sigma: float = 0.03
) -> int:
    """How many of ``runs`` null runs made a false claim."""
    return sum(
        false_claim(policy, kind, seed, rounds, sigma) for seed in range(seed0, seed0 + runs)
    )


def binomial_upper(k: int, n: int, z: float = 3.0) -> float:
    """A generous upper bound of a rate seen as k of n (Wilson score, ``z`` standard errors)."""
    if n == 0:
        return 1.0
    p = k / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre + spread) / (1 + z * z / n)
