"""How often each claim a policy can make is false, how often a true gain is found, and how far a
printed figure is from the truth: the project's own strategies and protocol driven by benches whose
true times are known, under the noise a shared GPU shows. ``benchmarks/protocol_false_claims.py``
runs the full simulation (docs/BENCHMARKS.md, "The protocol's claims");
``tests/tuning/test_false_claims.py`` a reduced one.

Noise models (multiplicative, per measurement; ``sigma`` is the log-normal spread):

- ``iid``: log-normal;
- ``heavy``: Student-t with 3 degrees of freedom in log space, scaled to the same spread;
- ``outliers``: log-normal, and one measurement in 50 twice as slow (rare 2x outliers);
- ``drift``: log-normal, on a machine that slows down 0.1 % per measurement and wanders (a shared
  random walk): every config alike;
- ``carry-over``: log-normal, and a measurement right after one at another SM count (or, without
  SM counts, of another arm) is 3 % slower: what a switch leaves behind.

Beyond these, ``config-drift`` (each config wanders on its own random walk within a worker group)
breaks the test's assumption that rounds are exchangeable: the full script reports it apart, as a
limit of the protocol, not as a level it keeps.

The policies (each counts a false claim when its true times are all equal):

- ``sm``: the SM count moved off the engine's (the search proposed 48 SMs; the engine runs 20);
- ``chunks``: a chunk config other than DeepEP's default kept (the search's top 3 equal to it);
- ``orders``: any order verdict recorded (both orders equal; either way counts);
- ``v2``: DeepEP v2 settings other than its default kept (five equal candidates);
- ``overlap``: a split other than vLLM's kept (three equal splits and vLLM's);
- ``experts``: another expert kernel kept or an expert order verdict recorded (DeepGEMM in both
  orders and FlashInfer's kernel, all equal);
- ``policy``: a whole live tune's claims together (the SM count and chunks, both orders, the expert
  kernel and its orders): any of them;
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
from moepolicy.tuning.expert_bench import ExpertBench

NOISE_MODELS = ("iid", "heavy", "outliers", "drift", "carry-over")
BEYOND_ASSUMPTIONS = ("config-drift",)
POLICIES = ("sm", "chunks", "orders", "v2", "overlap", "experts", "policy", "bench")
BUCKETS = ((128, 1.0), (1024, 1.0), (4096, 1.0))
BASE_US = {128: 190.0, 1024: 270.0, 4096: 530.0}  # the modelled Qwen3-30B-A3B EP2 times at 20 SMs
ENGINE_SMS, CHOSEN_SMS = 20, 48
DEFAULT_CHUNKS = (ChunkConfig(24, 256, 6, 128), ChunkConfig(10, 256, 6, 128))
WORK = Workload(2048, 128, 8, 2, "fp8")
CARRY_OVER = 1.03
OUTLIER_RATE = 0.02


def _sms_of(key) -> object:
    """What a switch is between: the SM count where the key has one, else the key itself."""
    for part in key if isinstance(key, tuple) else (key,):
        if hasattr(part, "num_sms"):
            return part.num_sms
        if hasattr(part, "comm_sms"):
            return part.comm_sms
    return key


class Noise:
    """One noise model's multiplicative factor per measurement (see the module's doc)."""

    def __init__(self, kind: str, sigma: float, seed: int):
        if kind not in NOISE_MODELS + BEYOND_ASSUMPTIONS:
            raise ValueError(
                f"noise model must be one of {NOISE_MODELS + BEYOND_ASSUMPTIONS}, got {kind!r}"
            )
        self.kind, self.sigma, self.rng = kind, sigma, random.Random(seed)
        self.calls, self.walk = 0, 0.0
        self.last: object = None  # what the last measurement switched to (_sms_of)
        self.walks: dict = {}

    def restart(self) -> None:
        self.walks, self.last = {}, None

    def factor(self, key=None) -> float:
        rng, sigma = self.rng, self.sigma
        self.calls += 1
        if self.kind == "heavy":
            t3 = rng.gauss(0, 1) / math.sqrt(sum(rng.gauss(0, 1) ** 2 for _ in range(3)) / 3)
            f = math.exp(sigma * t3 / math.sqrt(3.0))
        else:
            f = math.exp(rng.gauss(0.0, sigma))
        if self.kind == "outliers" and rng.random() < OUTLIER_RATE:
            f *= 2.0
        if self.kind == "drift":
            self.walk = 0.95 * self.walk + rng.gauss(0.0, sigma)
            f *= (1 + 0.001 * self.calls) * math.exp(self.walk)
        if self.kind == "carry-over":
            switch = _sms_of(key)
            f *= CARRY_OVER if self.last is not None and switch != self.last else 1.0
            self.last = switch
        if self.kind == "config-drift":
            self.walks[key] = 0.9 * self.walks.get(key, 0.0) + self.rng.gauss(0.0, sigma)
            f *= math.exp(self.walks[key])
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
        orders = {}
        if workload.both_orders:  # timed one after the other, each with its own noise
            first, second = ("quant_then_dispatch", "dispatch_then_quant")[
                :: 1 if workload.orders_first == "quant_then_dispatch" else -1
            ]
            orders = {
                first: self.true_us((first, point)) * self.noise.factor(first),
                second: self.true_us((second, point)) * self.noise.factor(second),
            }
            us = self.true_us(point)
        else:
            us = self.true_us(point) * self.noise.factor(point)
        return Measurement(0.6 * us, 0.5 * us, 0.4 * us, "measured", orders)

    def measure_v2(self, workload: Workload, point, tokens: int) -> float:
        return self.true_us((point, tokens)) * self.noise.factor((point, tokens))

    def measure_overlap(self, workload: Workload, point: TunePoint, gemm_shape) -> dict:
        us = self.true_us(point) * self.noise.factor(point)
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
    against the engine's 20, the search's top 3 chunk configs per bucket."""
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


def orders_outcome(kind: str, seed: int, rounds: int, gain: float = 1.0, sigma: float = 0.03):
    """Both orders, quantizing first truly ``gain`` faster: the ``orders`` family's outcome."""
    from moepolicy.tuning.confirm import order_outcome

    def true(key):
        order, point = key if isinstance(key, tuple) else ("quant_then_dispatch", key)
        return BASE_US[point.tokens] / (gain if order == "quant_then_dispatch" else 1.0)

    bench = KnownBench(true, Noise(kind, sigma, seed))
    return order_outcome(bench, WORK, {t: _point(ENGINE_SMS, t) for t, _ in BUCKETS}, rounds)


def orders_claimed(kind: str, seed: int, rounds: int, sigma: float = 0.03) -> bool:
    """Both orders equal: is any bucket's verdict recorded (either way)?"""
    from moepolicy.tuning.confirm import order_timings

    timings = order_timings(orders_outcome(kind, seed, rounds, sigma=sigma))
    return any(t.verdict != "unmeasured" for t in timings)


def v2_choice(kind: str, seed: int, rounds: int, gain: float = 1.0, sigma: float = 0.03):
    """Five DeepEP v2 settings; 32 SMs truly ``gain`` faster than the others."""
    from moepolicy.tuning.v2_tune import V2Point, choose_v2, v2_candidates

    def true(key):
        point, tokens = key
        return BASE_US[tokens] / (gain if point == V2Point(32) else 1.0)

    bench = KnownBench(true, Noise(kind, sigma, seed))
    bench.noise_free = False
    return choose_v2(bench, WORK, BUCKETS, v2_candidates((16, 32, 64)), rounds, seed)


def overlap_search(kind: str, seed: int, rounds: int, gain: float = 1.0, sigma: float = 0.03):
    """Three splits and vLLM's (phases 3-5 of the search); 32 SMs truly ``gain`` faster."""
    from types import SimpleNamespace

    from moepolicy.tuning.overlap_search import SplitConfig, _Measurer, _select_gate_report

    plan = SimpleNamespace(
        model=SimpleNamespace(moe_layers=[SimpleNamespace(moe_intermediate_size=768)])
    )

    def true(point):
        return BASE_US[point.tokens] * 2 / (gain if point.num_sms == 32 else 1.0)

    bench = KnownBench(true, Noise(kind, sigma, seed))
    m = _Measurer(plan, bench, WORK, list(BUCKETS), "persistent", "grid")
    vllm = SplitConfig(ENGINE_SMS, DEFAULT_CHUNKS)
    candidates = [SplitConfig(c, DEFAULT_CHUNKS) for c in (24, 32, 40)] + [vllm]
    for cfg in candidates:  # the search's measurement of each (the bound reads them)
        m.once(cfg)
    measured = {}
    for cfg in candidates:
        rows = m.seen[cfg]
        assert rows is not None, "a known bench never fails"
        measured[cfg] = m.weighted(rows)
    return _select_gate_report(m, candidates, measured, vllm, rounds)


class NoisyExpertBench(ExpertBench):
    """The expert stage's arms with known true times under a noise model, in balanced rounds."""

    name = "known expert stage"
    source = "measured"
    noise_free = False

    def __init__(self, true_us: dict, noise: Noise, runs=("deepgemm", "flashinfer_cutlass")):
        self.true_us, self.noise, self.runs = true_us, noise, runs

    def kernels(self, names):
        from moepolicy.schema.measured import KernelStatus

        return tuple(KernelStatus(n, n in self.runs, "known times") for n in names)

    def problem(self, shape, tokens):
        return None

    def describe(self) -> str:
        return self.name

    def times(self, shape, tokens, arms, rounds):
        from moepolicy.measure.rounds import balanced_rounds
        from moepolicy.tuning.expert_bench import StageTimes

        def once(arm):
            return self.true_us[arm] * BASE_US[tokens] / 100 * self.noise.factor(arm)

        return StageTimes(balanced_rounds(list(arms), once, rounds, warm_up=True))


def experts_choice(kind: str, seed: int, rounds: int = 12, sigma: float = 0.03):
    """DeepGEMM in both orders and FlashInfer's kernel (the engine's pick), all equal, with
    communication figures that are equal too: the ``experts`` family's outcome."""
    from moepolicy.measure.routing import ExpertShape
    from moepolicy.tuning.expert_choice import ChoiceInputs, Communication, choose_experts

    arms = ("deepgemm/quant_then_dispatch", "deepgemm/dispatch_then_quant")
    true = {a: 100.0 for a in (*arms, "flashinfer_cutlass/no_quant")}
    inputs = ChoiceInputs(
        ExpertShape(2048, 768, 128, 8, 2),
        BUCKETS,
        "flashinfer_cutlass",
        ("flashinfer_cutlass", "deepgemm"),
        rounds=rounds,
        communication_words="known (equal wires)",
    )
    bench = NoisyExpertBench(true, Noise(kind, sigma, seed))
    return choose_experts(inputs, bench, lambda tokens, wire: Communication(50.0, 50.0, 0.0))


def experts_claimed(kind: str, seed: int, rounds: int = 12, sigma: float = 0.03) -> bool:
    choice = experts_choice(kind, seed, rounds, sigma)
    verdicts = [t.verdict for _, timings in choice.orders for t in timings]
    return choice.faster_kernel != "unmeasured" or any(v != "unmeasured" for v in verdicts)


def _noisy_time(noise: Noise, tokens: int) -> Callable[[str], float]:
    """An arm's time at ``tokens`` under ``noise`` (every arm truly equal)."""
    return lambda name: BASE_US[tokens] * noise.factor(name)


def bench_claims(kind: str, seed: int, rounds: int, sigma: float = 0.03) -> tuple[int, int]:
    """A ``moepolicy bench`` run over three equal arms, 2 routings x 3 buckets: (claims, comparisons)."""
    from moepolicy.cli.bench import comparison
    from moepolicy.measure.rounds import balanced_rounds

    noise = Noise(kind, sigma, seed)
    times = {
        routing: {
            str(t): balanced_rounds(
                ["policy", "vllm", "deepep-default"],
                _noisy_time(noise, t),
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


def sm_claimed(done) -> bool:
    """The SM count moved, or a loss beyond noise recorded for it."""
    return done.num_sms != ENGINE_SMS or any(t.slower for t in done.gate.losses.values())


def chunks_claimed(done) -> bool:
    return any(c.kept.name.startswith("top") for c in done.buckets.values())


def false_claim(policy: str, kind: str, seed: int, rounds: int, sigma: float = 0.03) -> bool:
    """One null run of ``policy`` under the noise model ``kind``: was a claim made (all false here)?"""
    if policy == "sm":
        return sm_claimed(serial_tune(kind, seed, rounds, sigma=sigma))
    if policy == "chunks":
        return chunks_claimed(serial_tune(kind, seed, rounds, chosen=ENGINE_SMS, sigma=sigma))
    if policy == "orders":
        return orders_claimed(kind, seed, rounds, sigma)
    if policy == "v2":
        from moepolicy.tuning.v2_tune import DEFAULT

        return v2_choice(kind, seed, rounds, sigma=sigma).kept != DEFAULT
    if policy == "overlap":
        return overlap_search(kind, seed, rounds, sigma=sigma).comm_sms != ENGINE_SMS
    if policy == "experts":
        return experts_claimed(kind, seed, sigma=sigma)
    if policy == "policy":
        done = serial_tune(kind, seed, rounds, sigma=sigma)
        return (
            sm_claimed(done)
            or chunks_claimed(done)
            or orders_claimed(kind, seed + 10**6, rounds, sigma)
            or experts_claimed(kind, seed + 2 * 10**6, sigma=sigma)
        )
    if policy == "bench":  # bench runs its own rounds (half decide, half report)
        from moepolicy.cli.bench import BENCH_ROUNDS

        return bench_claims(kind, seed, BENCH_ROUNDS, sigma)[0] > 0
    raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")


def rate(
    policy: str, kind: str, runs: int, rounds: int, seed0: int = 0, sigma: float = 0.03
) -> int:
    """How many of ``runs`` null runs made a false claim."""
    return sum(
        false_claim(policy, kind, seed, rounds, sigma) for seed in range(seed0, seed0 + runs)
    )


# --- power and printed figures under a true gain ------------------------------------------------

FIGURES = ("sm", "chunks", "orders", "v2", "overlap")


@dataclass(frozen=True)
class Printed:
    """One claimed run's figures: what is printed (the report rounds') and what the gate's own
    rounds read (what the protocol before printed), as log speed-ups."""

    printed: float
    gate: float


def printed_figure(policy: str, kind: str, seed: int, rounds: int, gain: float, sigma: float):
    """Under a true ``gain``, the run's printed figure and the gate's, or None where nothing was
    claimed (the power is how often it is not None)."""
    if policy == "sm":
        done = serial_tune(kind, seed, rounds, Gains((gain,) * 3), sigma=sigma)
        if done.num_sms == ENGINE_SMS or done.weighted is None:
            return None
        return Printed(math.log(done.weighted.speedup), math.log(done.gate.sms.speedup))
    if policy == "chunks":
        done = serial_tune(kind, seed, rounds, Gains(chunks=gain), chosen=ENGINE_SMS, sigma=sigma)
        kept = [(t, c) for t, c in done.buckets.items() if c.kept.name.startswith("top")]
        if not kept:
            return None
        t, c = kept[0]
        return Printed(math.log(c.vs_default.speedup), math.log(done.gate.chunks[t].speedup))
    if policy == "orders":
        done = orders_outcome(kind, seed, rounds, gain, sigma)
        gated, t = done.stages[0], BUCKETS[0][0]
        if gated.tests[t].verdict != "faster":
            return None
        shown = done.figures[t]["dispatch_then_quant"]
        return Printed(math.log(shown.speedup), math.log(gated.tests[t].speedup))
    if policy == "v2":
        from moepolicy.tuning.v2_tune import DEFAULT

        choice = v2_choice(kind, seed, rounds, gain, sigma)
        if choice.kept == DEFAULT or choice.report_weighted is None:
            return None
        return Printed(math.log(choice.report_weighted.speedup), math.log(choice.gate.speedup))
    if policy == "overlap":
        found = overlap_search(kind, seed, rounds, gain, sigma)
        if found.comm_sms != 32 or found.report_vs_vllm is None:
            return None
        return Printed(math.log(found.report_vs_vllm.speedup), math.log(found.gate.test.speedup))
    raise ValueError(f"policy must be one of {FIGURES}, got {policy!r}")


@dataclass(frozen=True)
class Inflation:
    """Among the runs that claimed under a true gain: how many, and the mean printed figure (the
    report rounds') and the gate rounds' figure, against the truth."""

    true: float
    runs: int
    moved: int
    report_mean: Optional[float]
    gate_mean: Optional[float]


def inflation(
    kind: str,
    gain: float,
    runs: int,
    rounds: int,
    sigma: float = 0.03,
    seed0: int = 0,
    policy: str = "sm",
) -> Inflation:
    """``policy``'s claim truly ``gain`` faster: how often it is claimed, and its mean figures."""
    found = [
        printed_figure(policy, kind, s, rounds, gain, sigma) for s in range(seed0, seed0 + runs)
    ]
    claimed = [f for f in found if f is not None]

    def mean(xs):
        return math.exp(statistics.fmean(xs)) if xs else None

    return Inflation(
        gain,
        runs,
        len(claimed),
        mean([f.printed for f in claimed]),
        mean([f.gate for f in claimed]),
    )


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p): the terms from ``k`` up, each from the one before, the first
    in logs (math.comb(6750, k) overflows a float); stops once they no longer add."""
    k = max(k, 0)
    if k > n:
        return 0.0
    log_first = (
        math.lgamma(n + 1)
        - math.lgamma(k + 1)
        - math.lgamma(n - k + 1)
        + k * math.log(p)
        + (n - k) * math.log1p(-p)
    )
    term = total = math.exp(log_first)
    for i in range(k, n):
        term *= (n - i) / (i + 1) * p / (1 - p)
        total += term
        if i > n * p and term < 1e-17 * total:
            break
    return min(1.0, total)
