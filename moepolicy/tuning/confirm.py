"""The protocol behind every claim of a tune: select, gate and report in three fresh benches, one
exact paired test per decision.

Each phase runs in a fresh bench (new worker processes, a new ``deep_ep.Buffer``), opens with a
warm-up pass whose timings are dropped (the first call after a start pays for it), and times its
contenders over rotated rounds (``measure.rounds.rotated_rounds``). Comparisons are paired per round
and tested with the exact sign-flip test on the per-round log-ratios, 2.5 % per side
(``measure.rounds``).

1. **Selection** (per bucket): the search's top configs beside DeepEP's default chunks at the chosen
   SM count; the pick is the highest geometric-mean speed-up over the default. It proposes; it claims
   nothing.
2. **Gate** (every bucket, one fresh bench): the pick, DeepEP's default chunks at the chosen SM count
   (``default``) and the engine's default (``engine``: its SM count, DeepEP's built-in table). Two
   decisions in a fixed sequence, so that the chance of any false claim stays at 2.5 %:

   - the SM count, which acts on every bucket: ``default`` against ``engine`` on the weighted
     objective (the sum over the buckets of weight x time, round by round), one test; and no bucket
     slower beyond noise (Holm over the buckets). Otherwise the engine's default is kept everywhere.
   - the chunks, per bucket, once the SM count stands: the pick against ``default``, Holm over the
     buckets.
3. **Report** (every bucket, another fresh bench): the kept config beside ``engine`` and ``default``
   in rounds that decided nothing. Every figure printed or written comes from here, so none is the
   figure that chose it. Where the engine's default is kept, these are its own times.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Optional, Sequence

from moepolicy.errors import TuningError
from moepolicy.measure.rounds import (
    MIN_ROUNDS,
    Speedup,
    geomean_speedup,
    holm,
    interval_words,
    paired_speedup,
    rotated_rounds,
    speedup_words,
    weighted_rounds,
)
from moepolicy.tuning import progress
from moepolicy.tuning.bench import Bench, TrialFailed, TunePoint, Workload


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


def interleaved(
    bench: Bench, workload: Workload, contenders: Sequence[Contender], rounds: int, region: str
) -> dict[str, list[float]]:
    """Per-round times of every contender in one fresh bench (:func:`fresh_rounds` for one bucket)."""
    return fresh_rounds(bench, {0: (workload, contenders)}, rounds, region)[0]


def fresh_rounds(bench: Bench, groups: dict, rounds: int, region: str) -> dict:
    """A fresh bench (closed and started again: new processes, a new Buffer); then for each group
    (key -> (workload, contenders)) a dropped warm-up pass and ``rounds`` rotated rounds. A failed
    measurement fails the protocol."""
    bench.restart()

    def timer(workload: Workload, by_name: dict[str, TunePoint]):
        def time_once(name: str) -> float:
            value = bench.measure(workload, by_name[name]).objective(region)
            progress.advance()
            return value

        return time_once

    out = {}
    try:
        for key, (workload, contenders) in groups.items():
            by_name = {c.name: c.point for c in contenders}
            time_once = timer(workload, by_name)
            for name in by_name:  # warm-up: the first timings after a start are dropped
                time_once(name)
            out[key] = rotated_rounds(list(by_name), time_once, rounds)
    except TrialFailed as exc:
        raise TuningError(f"re-measurement failed: {exc}") from None
    return out


def named_rounds(
    bench: Bench,
    workload: Workload,
    named: dict[int, dict[str, TunePoint]],
    rounds: int,
    region: str,
    phase: str,
) -> dict[int, dict[str, list[float]]]:
    """Per bucket (tokens -> {name: point}), every name's per-round times from one fresh bench; a
    point shared by two names is measured once and both read its times."""
    groups = {}
    for tokens, by_name in named.items():
        first: dict[TunePoint, str] = {}
        for name, point in by_name.items():
            first.setdefault(point, name)
        groups[tokens] = (workload, [Contender(n, p) for p, n in first.items()])
    progress.phase(phase, sum(len(c) for _, c in groups.values()) * (rounds + 1))
    measured = fresh_rounds(bench, groups, rounds, region)
    return {
        tokens: {
            name: measured[tokens][next(n for n, p in by_name.items() if p == point)]
            for name, point in by_name.items()
        }
        for tokens, by_name in named.items()
    }


def select(
    bench: Bench,
    workload: Workload,
    top: Sequence[TunePoint],
    default: TunePoint,
    rounds: int,
    region: str,
) -> tuple[Contender, str]:
    """Among the search's top configs, the one with the highest geometric-mean speed-up over
    ``default`` in rounds of its own fresh bench, if above 1; else the default. A proposal for the
    gate: nothing here is claimed or printed as a gain."""
    contenders = [Contender("default", default)] + [
        Contender(f"top{i + 1}", p) for i, p in enumerate(top) if p != default
    ]
    if len(contenders) == 1:
        return contenders[0], "the search found nothing but DeepEP's default"
    progress.phase(f"select T={default.tokens}", len(contenders) * (rounds + 1))
    times = interleaved(bench, workload, contenders, rounds, region)
    speedups = {c.name: geomean_speedup(times["default"], times[c.name]) for c in contenders[1:]}
    best = max(speedups, key=speedups.__getitem__)
    if speedups[best] <= 1.0:
        return (
            contenders[0],
            f"none of the search's top {len(top)} was faster than the default in the selection rounds",
        )
    kept = next(c for c in contenders if c.name == best)
    return (
        kept,
        f"{best} of the search's top {len(top)}, the fastest in the selection rounds (proposed to the gate)",
    )


@dataclass(frozen=True)
class Gate:
    """The gate's decisions and the tests behind them."""

    moved: bool  # the SM count moved off the engine's
    sms: Optional[Speedup] = (
        None  # default chunks at the chosen SM count vs the engine's default, weighted
    )
    losses: dict[int, Speedup] = field(
        default_factory=dict
    )  # per bucket, the same (Holm, "slower")
    chunks: dict[int, Speedup] = field(
        default_factory=dict
    )  # per bucket, the pick vs the default (Holm, "faster")
    why: str = ""

    def bucket_doc(self, tokens: int) -> dict:
        out = {}
        if tokens in self.losses:
            out["loss_vs_engine"] = self.losses[tokens].to_doc()
        if tokens in self.chunks:
            out["chunks_vs_default"] = self.chunks[tokens].to_doc()
        return out


@dataclass(frozen=True)
class Report:
    """One bucket in the report rounds: medians of the kept config and the baselines, and the paired
    speed-ups (per bucket, 95 % intervals not adjusted for the other buckets)."""

    tokens: int
    rounds: int
    times_us: dict[str, float]  # kept, engine, default (a point shared by two names measured once)
    vs_engine: Optional[Speedup]  # None where the engine's default is what is kept
    vs_default: Optional[Speedup]  # None where DeepEP's default chunks are what is kept

    def to_doc(self) -> dict:
        return {
            "rounds": self.rounds,
            "median_us": {k: round(v, 2) for k, v in self.times_us.items()},
            "vs_engine": None if self.vs_engine is None else self.vs_engine.to_doc(),
            "vs_default": None if self.vs_default is None else self.vs_default.to_doc(),
        }


@dataclass(frozen=True)
class Confirmed:
    """One bucket after the protocol: the config kept, how it was proposed, the gate's tests for it
    and the report rounds' figures."""

    tokens: int
    kept: Contender
    selection: str
    report: Report
    gate: dict = field(default_factory=dict)

    @property
    def times_us(self) -> dict[str, float]:
        return self.report.times_us

    @property
    def vs_engine(self) -> Optional[Speedup]:
        return self.report.vs_engine

    @property
    def vs_default(self) -> Optional[Speedup]:
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
    weighted: Optional[
        Speedup
    ]  # report rounds: the kept configs vs the engine's default, weighted
    why: str


def gate(
    bench: Bench,
    workload: Workload,
    buckets: Sequence[BucketCandidates],
    picks: dict[int, Contender],
    rounds: int,
    region: str,
) -> Gate:
    """The SM count, then the chunks, each decided by one test at 2.5 % on rounds of one fresh bench."""
    named = {
        b.tokens: {"engine": b.engine, "default": b.default, "pick": picks[b.tokens].point}
        for b in buckets
    }
    times = named_rounds(bench, workload, named, rounds, region, "gate")
    chosen, engine = buckets[0].default.num_sms, buckets[0].engine.num_sms
    sms, losses, why = None, {}, ""
    if chosen != engine:
        sms, losses, why = _sms_decision(buckets, times, chosen, engine)
        if not sms.faster or any(t.slower for t in losses.values()):
            return Gate(False, sms, losses, {}, why)
    contested = [b for b in buckets if picks[b.tokens].point != b.default]
    tests = holm(
        [
            paired_speedup(
                times[b.tokens]["default"],
                times[b.tokens]["pick"],
                0,
                (picks[b.tokens].name, "DeepEP's default chunks"),
            )
            for b in contested
        ],
        "faster",
        "buckets",
    )
    chunks = {b.tokens: t for b, t in zip(contested, tests)}
    return Gate(
        True, sms, losses, chunks, why or f"the search chose the engine's SM count ({engine})"
    )


def _sms_decision(
    buckets: Sequence[BucketCandidates], times: dict, chosen: int, engine: int
) -> tuple[Speedup, dict[int, Speedup], str]:
    """DeepEP's default chunks at the chosen SM count against the engine's default: one test on the
    weighted objective, and each bucket tested for a loss (Holm)."""
    weights = [b.weight for b in buckets]
    base = weighted_rounds([times[b.tokens]["engine"] for b in buckets], weights)
    mine = weighted_rounds([times[b.tokens]["default"] for b in buckets], weights)
    names = (f"{chosen} SMs", f"the engine's default ({engine} SMs)")
    sms = paired_speedup(base, mine, 0, names)
    losses = holm(
        [
            paired_speedup(times[b.tokens]["engine"], times[b.tokens]["default"], 0, names)
            for b in buckets
        ],
        "slower",
        "buckets",
    )
    lost = [f"T={b.tokens}: {t.words()}" for b, t in zip(buckets, losses) if t.slower]
    if lost:
        why = f"{chosen} SMs are slower beyond noise in a bucket ({'; '.join(lost)}): the engine's default kept"
    elif not sms.faster:
        why = (
            f"{chosen} SMs, weighted over the buckets in the gate rounds: {sms.words()}: no gain beyond noise, "
            "the engine's default kept"
        )
    else:
        why = (
            f"{chosen} SMs with DeepEP's default chunks, weighted over the buckets in the gate rounds: "
            f"{sms.words()}; no bucket slower beyond noise"
        )
    return sms, {b.tokens: t for b, t in zip(buckets, losses)}, why


def report(
    bench: Bench,
    workload: Workload,
    buckets: Sequence[BucketCandidates],
    kept: dict[int, Contender],
    rounds: int,
    region: str,
) -> tuple[dict[int, Report], Optional[Speedup]]:
    """The kept configs beside the engine's default and DeepEP's default chunks at the kept SM
    count, in rounds of a fresh bench that decide nothing."""
    named = {
        b.tokens: {
            "kept": kept[b.tokens].point,
            "engine": b.engine,
            "default": TunePoint(
                kept[b.tokens].point.num_sms, b.tokens, b.default.dispatch, b.default.combine
            ),
        }
        for b in buckets
    }
    runs = named_rounds(bench, workload, named, rounds, region, "report")
    out = {}
    for b in buckets:
        k, mine = kept[b.tokens], runs[b.tokens]
        vs_engine = (
            None
            if k.point == b.engine
            else paired_speedup(mine["engine"], mine["kept"], 0, (k.name, "the engine's default"))
        )
        vs_default = (
            None
            if k.point == named[b.tokens]["default"]
            else paired_speedup(
                mine["default"], mine["kept"], 0, (k.name, "DeepEP's default chunks")
            )
        )
        out[b.tokens] = Report(
            b.tokens,
            rounds,
            {n: statistics.median(xs) for n, xs in mine.items()},
            vs_engine,
            vs_default,
        )
    weighted = None
    if any(r.vs_engine is not None for r in out.values()):
        weights = [b.weight for b in buckets]
        weighted = paired_speedup(
            weighted_rounds([runs[b.tokens]["engine"] for b in buckets], weights),
            weighted_rounds([runs[b.tokens]["kept"] for b in buckets], weights),
            0,
            ("the kept configs", "the engine's default"),
        )
    return out, weighted


def run_protocol(
    bench: Bench,
    workload: Workload,
    buckets: Sequence[BucketCandidates],
    settings: ConfirmSettings,
) -> Protocol:
    """Selection (per bucket), gate and report (all buckets), each in a fresh bench."""
    rounds, region = settings.rounds, settings.region
    if rounds < MIN_ROUNDS:
        raise TuningError(
            f"confirm_rounds must be at least {MIN_ROUNDS}, got {rounds}", field="confirm_rounds"
        )
    picks, notes = {}, {}
    for b in buckets:
        if settings.choose_chunks:
            picks[b.tokens], notes[b.tokens] = select(
                bench, workload, b.top, b.default, rounds, region
            )
        else:
            picks[b.tokens], notes[b.tokens] = (
                Contender("default", b.default),
                (
                    "the bench's chunk effects are not fitted from measurements: DeepEP's default chunks"
                ),
            )
    decided = gate(bench, workload, buckets, picks, rounds, region)
    kept = {}
    for b in buckets:
        test = decided.chunks.get(b.tokens)
        if not decided.moved:
            kept[b.tokens] = Contender("engine", b.engine)
        elif test is not None and test.faster:
            kept[b.tokens] = picks[b.tokens]
        else:
            kept[b.tokens] = Contender("engine" if b.default == b.engine else "default", b.default)
    reports, weighted = report(bench, workload, buckets, kept, rounds, region)
    confirmed = {
        b.tokens: Confirmed(
            b.tokens,
            kept[b.tokens],
            _selection_words(notes[b.tokens], decided, b.tokens),
            reports[b.tokens],
            decided.bucket_doc(b.tokens),
        )
        for b in buckets
    }
    num_sms = buckets[0].default.num_sms if decided.moved else buckets[0].engine.num_sms
    return Protocol(num_sms, confirmed, decided, weighted, decided.why)


def _selection_words(note: str, decided: Gate, tokens: int) -> str:
    test = decided.chunks.get(tokens)
    if not decided.moved:
        return f"{note}; the SM count did not pass the gate: the engine's default kept"
    if test is None:
        return note
    if test.faster:
        return f"{note}; gate: {test.words()}"
    return f"{note}; gate: {test.words()}: DeepEP's default chunks kept"


def report_words(speedup: Optional[Speedup]) -> str:
    """A report-round speed-up in one cell: ``x1.035 faster [95% CI ...]``, ``(kept)`` where it is the
    baseline itself."""
    if speedup is None:
        return "(is the baseline)"
    tail = "" if speedup.verdict in ("faster", "slower") else f", {speedup.verdict}"
    return f"{speedup_words(speedup.speedup)}{tail} [{interval_words(speedup.low, speedup.high)}]"


@dataclass(frozen=True)
class ModelledBucket:
    """One bucket of a modelled tune: the model's answers (no interval: a model has no noise) and,
    where the SM count differs from the engine's, whether the modelled speed-up exceeds the model's
    held-out error at that point."""

    tokens: int
    kept: Contender
    us: dict[
        str, float
    ]  # the model's time for the kept config, the engine's default, the chosen SM count's
    chosen_sms: Optional[int] = None  # the search's SM count, where it is not the engine's
    speedup: Optional[float] = (
        None  # the chosen SM count (default chunks) over the engine's default, modelled
    )
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


def time_both_orders(
    bench: Bench, workload: Workload, points: dict[int, TunePoint], rounds: int
) -> tuple:
    """Both orders (quantize then dispatch, dispatch bf16 then quantize) at each bucket's point over
    rotated rounds in a fresh bench after a dropped warm-up pass, the order timed first alternating
    round by round; each bucket's paired speed-up of quantizing first tested two-sided with Holm over
    the buckets. The verdict is the order faster beyond noise, else ``unmeasured``: the rules' order
    stands. A failed measurement raises (the caller leaves the decisions unmeasured)."""
    import dataclasses

    from moepolicy.names import UNMEASURED
    from moepolicy.schema.measured import OrderTiming

    orders = ("quant_then_dispatch", "dispatch_then_quant")
    progress.phase("orders", len(points) * (rounds + 1))
    bench.restart()
    times = {t: {name: [] for name in orders} for t in points}
    for r in range(-1, rounds):  # round -1: the warm-up, dropped
        for tokens, point in points.items():
            both = dataclasses.replace(workload, both_orders=True, orders_first=orders[r % 2])
            got = bench.measure(both, point).orders
            progress.advance()
            for name in orders if r >= 0 else ():
                times[tokens][name].append(got[name])
    tests = holm(
        [
            paired_speedup(
                times[t]["dispatch_then_quant"],
                times[t]["quant_then_dispatch"],
                0,
                ("quantizing first", "dispatching bf16 first"),
            )
            for t in points
        ],
        "both",
        "buckets",
    )
    out = []
    for (tokens, by_order), test in zip(times.items(), tests):
        verdict = {"faster": orders[0], "slower": orders[1]}.get(test.verdict, UNMEASURED)
        out.append(
            OrderTiming(
                tokens,
                statistics.median(by_order[orders[0]]),
                statistics.median(by_order[orders[1]]),
                rounds=test.rounds,
                speedup=test.speedup,
                ci95=None if test.low is None else (test.low, test.high),
                verdict=verdict,
                correction=test.correction,
            )
        )
    return tuple(out)
