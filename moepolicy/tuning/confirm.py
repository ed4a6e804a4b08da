"""The serial tune's strategy for the protocol (``tuning.protocol``): the SM count, then the chunks.

At the SM count the search chose, the protocol's stages (a fixed sequence, the ``deepep`` family's
level, 2.5 %) are:

1. **the SM count**, which acts on every bucket: DeepEP's default chunks at the chosen SM count
   (``default``) against the engine's default (``engine``: its SM count, DeepEP's built-in table),
   one test of the weighted objective (weight x time summed over the buckets, round by round), then
   no bucket slower beyond noise (Holm). Otherwise the engine's default is kept everywhere.
2. **the chunks**, per bucket, once the SM count stands: the search's top configs (the best of them
   in the selection rounds) against ``default``, Holm over the buckets.

The report sets what is kept beside ``engine`` and ``default`` in rounds that decided nothing: every
figure printed or written comes from there. Where the engine's default is kept, these are its own
times. Timings run in fresh benches (new processes, a new ``deep_ep.Buffer``) per phase, each group
of rounds after a dropped warm-up pass.

Also here: a modelled tune's rule (no noise: the model's held-out error instead of a test) and both
dispatch orders timed as their own two-sided family (``orders``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from moepolicy.errors import TuningError
from moepolicy.measure.rounds import MIN_ROUNDS, Speedup, balanced_rounds, speedup_words
from moepolicy.tuning import progress
from moepolicy.tuning.bench import Bench, TrialFailed, TunePoint, Workload
from moepolicy.tuning.protocol import (
    FAMILY_LEVELS,
    Figure,
    Gated,
    Option,
    Outcome,
    Stage,
    decision_doc,
    decision_words,
    run,
)
from moepolicy.names import UNMEASURED
from moepolicy.schema.measured import OrderTiming

SMS, CHUNKS = "the SM count", "the chunks"


@dataclass(frozen=True)
class Contender:
    """A config in a re-measurement: a name people read (``top1``, ``default``, ``engine``) and its point."""

    name: str
    point: TunePoint


@dataclass(frozen=True)
class BucketCandidates:
    """One bucket going into the protocol: the search's top configs at the chosen SM count, DeepEP's
    default chunks there, and the engine's default."""

    tokens: int
    weight: float
    top: tuple[TunePoint, ...]
    default: TunePoint
    engine: TunePoint


@dataclass(frozen=True)
class ConfirmSettings:
    """How the protocol runs: rounds per phase, the timed region, and whether the bench may choose
    chunks (not where its chunk effects are unfitted)."""

    rounds: int
    region: str = "full"
    seed: int = 0
    choose_chunks: bool = True


def protocol_rounds(bench: Bench, asked: int) -> int:
    """The rounds each phase runs: one on a noise-free (modelled) bench, where one says all; else
    ``asked``, at least :data:`MIN_ROUNDS` (Holm over three buckets needs seven)."""
    if bench.noise_free:
        return 1
    if asked < MIN_ROUNDS:
        raise TuningError(
            f"confirm_rounds must be at least {MIN_ROUNDS} for the paired test to claim anything "
            f"with Holm's correction over three buckets, got {asked}",
            field="confirm_rounds",
        )
    return asked


class BenchTimer:
    """The protocol's timer on a :class:`Bench`: arms are ``TunePoint``s; each phase restarts the bench
    (new processes, a new Buffer); each group of rounds opens with a dropped warm-up pass. A failed
    measurement fails the protocol."""

    def __init__(self, bench: Bench, workload: Workload, region: str):
        self.bench, self.workload, self.region, self.phase = bench, workload, region, ""

    def fresh(self, phase: str) -> None:
        self.phase = phase
        self.bench.restart()

    def rounds(self, arms: Mapping[int, Sequence[TunePoint]], rounds: int) -> dict:
        progress.phase(self.phase, sum(len(a) for a in arms.values()) * (rounds + 1))
        try:
            return {
                tokens: balanced_rounds(list(points), self._once, rounds, warm_up=True)
                for tokens, points in arms.items()
            }
        except TrialFailed as exc:
            raise TuningError(f"re-measurement failed: {exc}") from None

    def _once(self, point: TunePoint) -> float:
        value = self.bench.measure(self.workload, point).objective(self.region)
        progress.advance()
        return value


def serial_stages(buckets: Sequence[BucketCandidates], choose_chunks: bool) -> tuple[Stage, ...]:
    """The SM count (joint), then the chunks (per bucket), as the protocol's stages."""
    chosen, engine_sms = buckets[0].default.num_sms, buckets[0].engine.num_sms
    engine = Option(
        "engine",
        {b.tokens: b.engine for b in buckets},
        f"the engine's default ({engine_sms} SMs)",
    )
    default = {b.tokens: b.default for b in buckets}
    moved = Option("default", default, f"{chosen} SMs with DeepEP's default chunks")
    tops: list[Option] = []
    most = max((len(b.top) for b in buckets), default=0) if choose_chunks else 0
    for i in range(most):
        arms = {b.tokens: b.top[i] for b in buckets if i < len(b.top) and b.top[i] != b.default}
        if arms:
            tops.append(Option(f"top{i + 1}", arms))
    chunks = Stage(
        CHUNKS, Option("default", default, "DeepEP's default chunks"), tuple(tops), joint=False
    )
    return Stage(SMS, engine, (moved,)), chunks


@dataclass(frozen=True)
class Gate:
    """The gate's decisions and the tests behind them (the decisions' own statistics: never a gain)."""

    moved: bool  # the SM count moved off the engine's
    sms: Optional[Speedup] = None  # the weighted test of the SM count (None: not tested)
    losses: dict[int, Speedup] = field(default_factory=dict)  # per bucket, its loss test (Holm)
    chunks: dict[int, Speedup] = field(default_factory=dict)  # per bucket, the chunk test (Holm)
    why: str = ""

    def bucket_doc(self, tokens: int) -> dict:
        out = {}
        if tokens in self.losses:
            out["loss_vs_engine"] = decision_doc(self.losses[tokens])
        if tokens in self.chunks:
            out["chunks_vs_default"] = decision_doc(self.chunks[tokens])
        return out


@dataclass(frozen=True)
class Report:
    """One bucket in the report rounds: medians of the kept config and the baselines, and its
    figures (report rounds; intervals simultaneous over the buckets)."""

    tokens: int
    rounds: int
    times_us: dict[str, float]  # kept, engine, default (a point shared by two names measured once)
    vs_engine: Optional[Figure]  # None where the engine's default is what is kept
    vs_default: Optional[Figure]  # None where DeepEP's default chunks are what is kept

    def to_doc(self) -> dict:
        return {
            "rounds": self.rounds,
            "median_us": {k: round(v, 2) for k, v in self.times_us.items()},
            "vs_engine": None if self.vs_engine is None else self.vs_engine.to_doc(),
            "vs_default": None if self.vs_default is None else self.vs_default.to_doc(),
        }


@dataclass(frozen=True)
class Confirmed:
    """One bucket after the protocol: the config kept, how it was proposed and decided (words, no
    figure), the gate's statistics for it and the report rounds' figures."""

    tokens: int
    kept: Contender
    selection: str
    report: Report
    gate: dict = field(default_factory=dict)

    @property
    def times_us(self) -> dict[str, float]:
        return self.report.times_us

    @property
    def vs_engine(self) -> Optional[Figure]:
        return self.report.vs_engine

    @property
    def vs_default(self) -> Optional[Figure]:
        return self.report.vs_default

    def to_doc(self) -> dict:
        return {
            "kept": self.kept.name,
            "num_sms": self.kept.point.num_sms,
            "selection": self.selection,
            "gate": self.gate,
            "report": self.report.to_doc(),
        }


@dataclass(frozen=True)
class Protocol:
    """What the protocol keeps: the SM count, per bucket the config and its figures, and why."""

    num_sms: int
    buckets: dict[int, Confirmed]
    gate: Gate
    weighted: Optional[Figure]  # report rounds: the kept configs vs the engine's default, weighted
    why: str


def run_protocol(
    bench: Bench,
    workload: Workload,
    buckets: Sequence[BucketCandidates],
    settings: ConfirmSettings,
) -> Protocol:
    """Selection, gate and report (``tuning.protocol.run``) of the SM count and the chunks."""
    rounds = settings.rounds
    if rounds < MIN_ROUNDS:
        raise TuningError(
            f"confirm_rounds must be at least {MIN_ROUNDS}, got {rounds}", field="confirm_rounds"
        )
    stages = serial_stages(buckets, settings.choose_chunks)
    done = run(
        stages,
        BenchTimer(bench, workload, settings.region),
        {b.tokens: b.weight for b in buckets},
        rounds,
        FAMILY_LEVELS["deepep"],
    )
    return _protocol(buckets, done, settings.choose_chunks)


def _protocol(buckets: Sequence[BucketCandidates], done: Outcome, choose_chunks: bool) -> Protocol:
    sms, chunks = done.stage(SMS), done.stage(CHUNKS)
    moved = any(sms.claimed(b.tokens) for b in buckets)
    decided = Gate(moved, sms.overall, sms.tests, chunks.tests, _why(buckets, sms, done))
    confirmed = {}
    for b in buckets:
        kept = done.kept[b.tokens]
        figures = done.figures[b.tokens]
        report = Report(
            b.tokens,
            done.rounds,
            _times(done, b, kept),
            figures.get("engine") if kept.arms[b.tokens] != b.engine else None,
            figures.get("default") if kept.arms[b.tokens] != b.default else None,
        )
        confirmed[b.tokens] = Confirmed(
            b.tokens,
            Contender(kept.name, kept.arms[b.tokens]),
            _selection_words(b, chunks, sms, choose_chunks),
            report,
            decided.bucket_doc(b.tokens),
        )
    num_sms = buckets[0].default.num_sms if moved else buckets[0].engine.num_sms
    return Protocol(num_sms, confirmed, decided, done.weighted.get("engine"), decided.why)


def _times(done: Outcome, b: BucketCandidates, kept: Option) -> dict[str, float]:
    """The report's medians by the names people read: kept, engine, and DeepEP's default chunks at
    the kept SM count."""
    got, point = done.times_us[b.tokens], kept.arms[b.tokens]
    default = b.default if point.num_sms == b.default.num_sms else b.engine
    return {"kept": got[point], "engine": got[b.engine], "default": got[default]}


def _why(buckets: Sequence[BucketCandidates], sms: Gated, done: Outcome) -> str:
    """Why the SM count is what it is: the gate's decision in words (no figure), then what the
    report rounds measured."""
    chosen, engine = buckets[0].default.num_sms, buckets[0].engine.num_sms
    if not sms.tested:
        return f"the search chose the engine's SM count ({engine})"
    head = (
        f"{chosen} SMs with DeepEP's default chunks against the engine's default ({engine} SMs) "
        f"in the gate: {sms.words()}"
    )
    if not sms.claimed(buckets[0].tokens):
        return f"{head}: the engine's default kept"
    weighted = done.weighted.get("engine")
    said = "" if weighted is None else f"; {weighted.words()}"
    return f"{head}: kept{said}"


def _selection_words(b: BucketCandidates, chunks: Gated, sms: Gated, choose_chunks: bool) -> str:
    """How the bucket's config was proposed and decided, in words (no figure)."""
    if not choose_chunks:
        note = (
            "the bench's chunk effects are not fitted from measurements: DeepEP's default chunks"
        )
    elif not chunks.stage.candidates or all(
        b.tokens not in c.arms for c in chunks.stage.candidates
    ):
        note = "the search found nothing but DeepEP's default"
    elif chunks.pick[b.tokens] is chunks.stage.baseline:
        note = f"none of the search's top {len(b.top)} was faster than the default in the selection rounds"
    elif len(chunks.stage.candidates) == 1:
        note = f"{chunks.pick[b.tokens].name}, the search's one proposal (to the gate)"
    else:
        note = (
            f"{chunks.pick[b.tokens].name} of the search's top {len(b.top)}, the fastest in the "
            "selection rounds (proposed to the gate)"
        )
    if sms.tested and not sms.claimed(b.tokens):
        return f"{note}; the SM count did not pass the gate: the engine's default kept"
    test = chunks.tests.get(b.tokens)
    if test is None:
        return note
    if test.faster:
        return f"{note}; gate: {decision_words(test)}"
    return f"{note}; gate: {decision_words(test)}: DeepEP's default chunks kept"


def report_words(figure: Optional[Figure]) -> str:
    """A report figure in one cell: ``x1.035 faster [95% CI ...]``; ``(is the baseline)`` where the
    kept config is the baseline itself."""
    if figure is None:
        return "(is the baseline)"
    return f"{speedup_words(figure.speedup)} [{figure.interval()}]"


@dataclass(frozen=True)
class ModelledBucket:
    """One bucket of a modelled tune: the model's answers (no interval: a model has no noise) and,
    where the SM count differs from the engine's, whether the modelled speed-up exceeds the model's
    held-out error at that point."""

    tokens: int
    kept: Contender
    # the model's time for the kept config, the engine's default, the chosen SM count's
    us: dict[str, float]
    chosen_sms: Optional[int] = None  # the search's SM count, where it is not the engine's
    # the chosen SM count (default chunks) over the engine's default, modelled
    speedup: Optional[float] = None
    error: Optional[float] = None  # the model's held-out error at the chosen point
    claim: str = ""

    def to_doc(self) -> dict:
        out = {
            "kept": self.kept.name,
            "num_sms": self.kept.point.num_sms,
            "us": {k: round(v, 2) for k, v in self.us.items()},
        }
        if self.speedup is not None:
            out["chosen_vs_engine"] = {
                "num_sms": self.chosen_sms,
                "speedup": round(self.speedup, 4),
                "model_error": self.error,
                "claim": self.claim,
            }
        return out

    def words(self) -> str:
        if self.speedup is None:
            return "the engine's SM count (nothing to compare)"
        err = "unknown" if self.error is None else f"{self.error:.1%}"
        return f"{speedup_words(self.speedup)}, modelled; {self.claim} (held-out error {err})"


@dataclass(frozen=True)
class Modelled:
    """What a modelled tune keeps: the SM count, per bucket the model's answers, and why."""

    num_sms: int
    buckets: dict[int, ModelledBucket]
    why: str
    weighted: Optional[float] = None
    weighted_error: Optional[float] = None


def _modelled_claim(speedup: float, error: Optional[float]) -> str:
    if error is None:
        return "outside the calibration: no claim"
    if speedup - 1.0 > error:
        return "faster beyond the model's error"
    if 1.0 / speedup - 1.0 > error:
        return "slower beyond the model's error"
    return "within the model's error: no claim"


def modelled_protocol(
    bench: Bench, workload: Workload, buckets: Sequence[BucketCandidates], error_at, region: str
) -> Modelled:
    """The SM count on a noise-free model bench: moved off the engine's only where the modelled
    speed-up on the weighted objective exceeds the model's held-out error there (``error_at(tokens,
    num_sms)``, the time-weighted error over the buckets) and no bucket is modelled slower beyond its
    error. DeepEP's default chunks (the model's chunk effects are not fitted)."""
    chosen, engine = buckets[0].default.num_sms, buckets[0].engine.num_sms

    def us(point: TunePoint) -> float:
        return bench.measure(workload, point).objective(region)

    if chosen == engine:
        rows = {
            b.tokens: ModelledBucket(
                b.tokens, Contender("engine", b.engine), {"kept": us(b.engine)}
            )
            for b in buckets
        }
        return Modelled(
            engine,
            rows,
            f"the search's SM count is the engine's ({engine}): nothing to change or claim",
        )
    e = {b.tokens: us(b.engine) for b in buckets}
    d = {b.tokens: us(b.default) for b in buckets}
    err = {b.tokens: error_at(b.tokens, chosen) for b in buckets}
    speed = {t: e[t] / d[t] for t in e}
    weights = {b.tokens: b.weight for b in buckets}
    total_d = sum(weights[t] * d[t] for t in d)
    weighted = sum(weights[t] * e[t] for t in e) / total_d
    weighted_error = (
        None
        if any(x is None for x in err.values())
        else sum(weights[t] * err[t] * d[t] for t in d) / total_d
    )
    losses = [t for t in speed if _modelled_claim(speed[t], err[t]).startswith("slower")]
    moved = weighted_error is not None and weighted - 1.0 > weighted_error and not losses
    rows = {}
    for b in buckets:
        kept = Contender("default", b.default) if moved else Contender("engine", b.engine)
        rows[b.tokens] = ModelledBucket(
            b.tokens,
            kept,
            {
                "kept": d[b.tokens] if moved else e[b.tokens],
                "engine": e[b.tokens],
                "chosen": d[b.tokens],
            },
            chosen,
            speed[b.tokens],
            err[b.tokens],
            _modelled_claim(speed[b.tokens], err[b.tokens]),
        )
    what = (
        f"{chosen} SMs, modelled on the weighted buckets: {speedup_words(weighted)} than the engine's default "
        f"({engine} SMs), against the model's held-out error there of "
        + ("unknown" if weighted_error is None else f"{weighted_error:.1%}")
    )
    if moved:
        return Modelled(chosen, rows, f"{what}: beyond it", weighted, weighted_error)
    why = (
        f"{what}: "
        + (f"modelled slower beyond its error at T={losses[0]}" if losses else "within it")
        + "; the engine's default kept (modelled)"
    )
    return Modelled(engine, rows, why, weighted, weighted_error)


ORDERS = ("quant_then_dispatch", "dispatch_then_quant")


class OrdersTimer:
    """The protocol's timer for both orders: one measurement times both at a bucket's point, the
    order timed first alternating round by round (AB, BA: each follows the other as often as
    itself), after a dropped warm-up measurement; each phase in a fresh bench."""

    def __init__(self, bench: Bench, workload: Workload, points: Mapping[int, TunePoint]):
        self.bench, self.workload, self.points, self.phase = bench, workload, points, ""

    def fresh(self, phase: str) -> None:
        self.phase = phase
        self.bench.restart()

    def rounds(self, arms: Mapping[int, Sequence[str]], rounds: int) -> dict:
        import dataclasses

        progress.phase(f"orders ({self.phase})", len(arms) * (rounds + 1))
        times: dict[int, dict[str, list[float]]] = {t: {name: [] for name in ORDERS} for t in arms}
        for r in range(-1, rounds):  # round -1: the warm-up, dropped
            for tokens in arms:
                first = ORDERS[r % 2]
                both = dataclasses.replace(self.workload, both_orders=True, orders_first=first)
                got = self.bench.measure(both, self.points[tokens]).orders
                progress.advance()
                for name in ORDERS if r >= 0 else ():
                    times[tokens][name].append(got[name])
        return times


def order_stage(points: Mapping[int, TunePoint]) -> Stage:
    """Both orders at each bucket's point: quantizing first against dispatching bf16 first, a
    comparing stage (recorded whatever the gate says), a claim either way."""
    return Stage(
        "the order",
        Option("dispatch_then_quant", {t: ORDERS[1] for t in points}, "dispatching bf16 first"),
        (Option("quant_then_dispatch", {t: ORDERS[0] for t in points}, "quantizing first"),),
        joint=False,
        sides="both",
        compare=True,
    )


def order_outcome(
    bench: Bench, workload: Workload, points: Mapping[int, TunePoint], rounds: int
) -> Outcome:
    """The ``orders`` family's protocol: gate and report of :func:`order_stage`, each in a fresh bench."""
    weights = {t: 1.0 for t in points}
    timer = OrdersTimer(bench, workload, points)
    return run([order_stage(points)], timer, weights, rounds, FAMILY_LEVELS["orders"])


def time_both_orders(
    bench: Bench, workload: Workload, points: dict[int, TunePoint], rounds: int
) -> tuple:
    """Both orders (quantize then dispatch, dispatch bf16 then quantize) at each bucket's point, as
    the protocol's two-sided stage of the ``orders`` family: the gate's rounds decide, bucket by
    bucket with Holm over the buckets (half the family's level per side); the report's rounds, in
    another fresh bench, give the medians, speed-ups and intervals recorded. The verdict is the
    order faster beyond noise, else ``unmeasured``: the rules' order stands. A failed measurement
    raises (the caller leaves the decisions unmeasured)."""
    return order_timings(order_outcome(bench, workload, points, rounds))


def order_timings(done: Outcome) -> tuple:
    """The recorded facts: each bucket's verdict from the gate, medians and figure from the report."""
    gated, out = done.stages[0], []
    for tokens in done.kept:
        test, shown = gated.tests[tokens], done.figures[tokens]["dispatch_then_quant"]
        verdict = {"faster": ORDERS[0], "slower": ORDERS[1]}.get(test.verdict, UNMEASURED)
        out.append(
            OrderTiming(
                tokens,
                done.times_us[tokens][ORDERS[0]],
                done.times_us[tokens][ORDERS[1]],
                rounds=shown.rounds,
                speedup=shown.speedup,
                ci95=None
                if shown.low is None or shown.high is None  # both or neither
                else (shown.low, shown.high),
                verdict=verdict,
                correction=test.correction,
            )
        )
    return tuple(out)
