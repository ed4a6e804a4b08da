"""The one protocol behind every claim a tune makes: **select → gate → report**, written once.

Each tuner is a strategy that feeds it (as optuna's one optimisation loop serves every sampler):

- the SM count and chunks of the serial MoE step (``tuning.confirm``), DeepEP v2's settings
  (``tuning.v2_tune``), the overlap split (``tuning.overlap_search``), both dispatch orders
  (``confirm.time_both_orders``) and the expert kernels with their orders (``tuning.expert_choice``)
  each describe what may change as :class:`Stage` values (a baseline that stands unless a claim
  passes, and candidates), and how their contenders are timed as a :class:`Timer`;
- :func:`run` does the rest, the same way for all of them.

The three phases, each starting with :meth:`Timer.fresh` (new worker processes where the bench has
them) and timing in the carry-over-balanced rounds of ``measure.rounds``:

1. **select**: where a stage has several candidates, all of them beside its baseline; the pick is
   the highest paired speed-up over the baseline (on the weighted buckets for a joint stage). It
   proposes; nothing of it is claimed or printed as a gain.
2. **gate**: each stage in turn, its pick and its baseline alone in their own rounds (two arms,
   timed AB, BA, ...: each follows the other as often as itself). A joint stage (one choice for
   every bucket) passes on one test of the weighted objective, then no bucket may be slower beyond
   noise (Holm); a per-bucket stage is tested bucket by bucket (Holm over the buckets). Stages form
   a fixed sequence: a later one is tested only where every earlier one kept its candidate (or had
   none), so the chance of any false claim in the sequence stays at its level.
3. **report**: what is kept beside each baseline it replaced, in rounds that decided nothing. Every
   figure printed or written is a :class:`Figure` from here, with its interval (simultaneous over the
   buckets printed together). The gate's own statistics are kept as decisions (p-values, verdicts),
   never as a gain.

**Levels.** A policy with no true difference anywhere records any claim at most
:data:`POLICY_LEVEL` (5 %) of the time: the level is split ahead of any measurement among the
families a policy can claim in (:data:`FAMILY_LEVELS`), Bonferroni's way. A one-sided family spends
its level on gains; a two-sided one half per side.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from typing import Callable, Generic, Hashable, Mapping, Optional, Protocol, Sequence, TypeVar

from moepolicy.measure.rounds import (
    CONFIDENCE,
    FASTER,
    NO_GAIN,
    SLOWER,
    Speedup,
    estimate,
    holm,
    interval_words,
    paired_speedup,
    speedup_words,
    weighted_rounds,
)

Bucket = int
Arm = Hashable
Times = dict[Bucket, dict[Arm, list[float]]]
# a strategy's own arm type (a TunePoint, a V2Point, a kernel's name): what its timer takes and
# what its outcome's options hold; the protocol itself reads arms only as keys
ArmT = TypeVar("ArmT", bound=Hashable)

POLICY_LEVEL = 0.05  # any claim in a policy whose arms are all truly equal
FAMILY_LEVELS = {
    "deepep": 0.025,  # the SM count then the chunks, or DeepEP v2's settings, or the overlap split
    "orders": 0.0125,  # both dispatch orders through live DeepEP (two-sided)
    "experts": 0.0125,  # the expert kernel and its orders (split among the stages it runs)
}
assert math.isclose(sum(FAMILY_LEVELS.values()), POLICY_LEVEL)


class Timer(Protocol[ArmT]):
    """How a strategy's contenders are timed."""

    def fresh(self, phase: str) -> None:
        """A fresh bench for ``phase`` (select, gate or report): new worker processes where the
        bench has them; the next timings of each contender start with a dropped warm-up."""

    def rounds(
        self, arms: Mapping[Bucket, Sequence[ArmT]], rounds: int
    ) -> dict[Bucket, dict[ArmT, list[float]]]:
        """Per bucket, every arm's per-round times over ``rounds`` balanced rounds (fewer where a
        round failed and was dropped; the same number for every arm of a bucket)."""


@dataclass(frozen=True, eq=False)  # one option is itself only (compared by identity)
class Option(Generic[ArmT]):
    """One thing a stage can keep: its name (``top2``, ``engine``), how a sentence names it (``the
    engine's default``) and its arm in each bucket (an option may lack a bucket: not proposed there)."""

    name: str
    arms: Mapping[Bucket, ArmT]
    label: str = ""

    @property
    def said(self) -> str:
        return self.label or self.name


# (bucket, arm, the arm it is set against, sign, its per-round times) -> the times a test sees: sign
# +1 for the side whose claim is tested (its modelled parts raised by their error), -1 for the
# other (lowered), 0 for selection and figures
Bound = Callable[[Bucket, Arm, Arm, int, list[float]], list[float]]


@dataclass(frozen=True)
class Stage(Generic[ArmT]):
    """One decision. ``joint``: one candidate for every bucket, decided on the weighted buckets with
    no bucket slower beyond noise; else each bucket on its own (Holm over the buckets). ``sides``:
    ``faster`` (only the candidate can be claimed faster) or ``both`` (either: the orders).
    ``compare``: the report sets the pick beside the baseline whatever the gate said (a comparison
    recorded as such, the orders, the kernels); else only what is kept beside what it replaced.
    ``bound``: how a test sees the arms where a part of their time is modelled."""

    name: str
    baseline: Option[ArmT]
    candidates: tuple[Option[ArmT], ...]
    joint: bool = True
    sides: str = FASTER
    compare: bool = False
    bound: Optional[Bound] = None


@dataclass(frozen=True)
class Figure:
    """A speed-up from report rounds, which decided nothing: the estimate (above 1: the contender is
    faster) and its 95 % interval, simultaneous over ``family`` figures printed together."""

    contender: str
    baseline: str
    rounds: int
    speedup: float
    low: Optional[float]
    high: Optional[float]
    per_round: tuple[float, float]
    family: int = 1

    def interval(self) -> str:
        together = f", simultaneous over {self.family} buckets" if self.family > 1 else ""
        return f"{interval_words(self.low, self.high)}{together}"

    def words(self) -> str:
        return (
            f"report rounds: {speedup_words(self.speedup)} than {self.baseline} "
            f"({self.interval()}; {self.rounds} rounds)"
        )

    def to_doc(self) -> dict:
        return {
            "contender": self.contender,
            "baseline": self.baseline,
            "rounds": self.rounds,
            "speedup": round(self.speedup, 4),
            "ci95": None
            if self.low is None or self.high is None  # both or neither (paired_speedup)
            else [round(self.low, 4), round(self.high, 4)],
            "per_round": [round(x, 4) for x in self.per_round],
            "interval": "95%"
            + (f", simultaneous over {self.family} buckets" if self.family > 1 else ""),
            "rounds_from": "report",
        }


def figure(
    baseline: Sequence[float], contender: Sequence[float], names: tuple[str, str], family: int = 1
) -> Figure:
    """The report figure of ``contender`` against ``baseline`` (Bonferroni over ``family``)."""
    s = paired_speedup(baseline, contender, names, confidence=1 - (1 - CONFIDENCE) / family)
    return Figure(
        s.contender,
        s.baseline,
        s.rounds,
        s.speedup,
        s.low,
        s.high,
        (s.per_round_min, s.per_round_max),
        family,
    )


def decision_doc(test: Speedup) -> dict:
    """A gate test as the policy stores it: the decision's statistics, no gain (that is the report's)."""
    out = {
        "contender": test.contender,
        "baseline": test.baseline,
        "rounds": test.rounds,
        "test": test.test,
        "statistic": test.statistic,
        "p_faster": round(test.p_faster, 6),
        "p_slower": round(test.p_slower, 6),
        "level": round(test.level, 6),
        "verdict": test.verdict,
        "rounds_from": "gate",
    }
    if test.correction:
        out["correction"] = test.correction
    return out


def decision_words(test: Speedup) -> str:
    """A gate test in words, without its figure: ``faster beyond noise (p 0.0003 at 2.5%, ...)``."""
    p = test.p_slower if test.verdict == SLOWER else test.p_faster
    verdict = {FASTER: "faster beyond noise", SLOWER: "slower beyond noise"}.get(
        test.verdict, test.verdict
    )
    family = f", {test.correction}" if test.correction else ""
    return f"{verdict} (p {p:.2g} at {test.level:.2%}{family}, {test.rounds} gate rounds)"


@dataclass(frozen=True)
class Gated(Generic[ArmT]):
    """One stage after the gate: what selection proposed per bucket, where the stage was reached and
    contested, the tests (``overall``: a joint stage's weighted test; ``tests``: its loss tests, or
    each bucket's own) and what is kept per bucket."""

    stage: Stage[ArmT]
    pick: dict[Bucket, Option[ArmT]]
    kept: dict[Bucket, Option[ArmT]]
    reached: tuple[Bucket, ...] = ()
    contested: tuple[Bucket, ...] = ()
    overall: Optional[Speedup] = None
    tests: dict[Bucket, Speedup] = field(default_factory=dict)

    @property
    def tested(self) -> bool:
        return bool(self.contested)

    def claimed(self, bucket: Bucket) -> bool:
        return self.kept[bucket] is not self.stage.baseline

    def goes_on(self, bucket: Bucket) -> bool:
        """Whether a later stage is tested at ``bucket``: this one was reached there and kept its
        candidate, or had none to test."""
        return bucket in self.reached and (self.claimed(bucket) or bucket not in self.contested)

    def words(self) -> str:
        """What the gate decided, in words, without any figure (the report's are printed)."""
        if not self.tested:
            return "nothing to test"
        if not self.stage.joint:
            return "; ".join(f"T={b}: {decision_words(t)}" for b, t in self.tests.items())
        overall = self.overall
        assert overall is not None, "a tested joint stage has its weighted test"
        lost = [f"T={b}: {decision_words(t)}" for b, t in self.tests.items() if t.slower]
        head = f"weighted over the buckets, {decision_words(overall)}"
        if lost:
            return f"{head}; slower in a bucket ({'; '.join(lost)})"
        if overall.faster:
            return f"{head}; no bucket slower beyond noise"
        return head


@dataclass(frozen=True)
class Outcome(Generic[ArmT]):
    """What the protocol keeps (per bucket, the option), each stage's gate, and the report: per
    bucket and baseline name a figure, the weighted figure per baseline timed at every bucket, and
    the report's medians per arm."""

    kept: dict[Bucket, Option[ArmT]]
    stages: tuple[Gated[ArmT], ...]
    figures: dict[Bucket, dict[str, Figure]]
    weighted: dict[str, Figure]
    times_us: dict[Bucket, dict[ArmT, float]]  # the report's medians per arm
    rounds: int
    # what chose: no claim
    selection_us: dict[Bucket, dict[ArmT, float]] = field(default_factory=dict)

    def stage(self, name: str) -> Gated[ArmT]:
        return next(g for g in self.stages if g.stage.name == name)


def run(
    stages: Sequence[Stage[ArmT]],
    timer: Timer[ArmT],
    weights: Mapping[Bucket, float],
    rounds: int,
    level: float,
) -> Outcome[ArmT]:
    """Select, gate and report ``stages`` (a fixed sequence) at ``level`` (the family's chance of any
    false claim), each phase in a fresh bench."""
    picks, chose = select(stages, timer, weights, rounds)
    gated = gate(stages, picks, timer, weights, rounds, level)
    kept = {b: _final(gated, b) for b in weights}
    figures, weighted, times = report(gated, kept, timer, weights, rounds)
    selection = {
        b: {a: statistics.median(xs) for a, xs in got.items()} for b, got in chose.items()
    }
    return Outcome(kept, gated, figures, weighted, times, rounds, selection)


# --- select -------------------------------------------------------------------------------------


def select(
    stages: Sequence[Stage], timer: Timer, weights: Mapping[Bucket, float], rounds: int
) -> tuple[list[dict[Bucket, Option]], Times]:
    """Each stage's proposal per bucket: its one candidate, or the best of several in one fresh
    bench's rounds (the baseline where none beats it there: nothing is then contested); and the
    selection's times (what chose, never a claim)."""
    choosing = [s for s in stages if len(s.candidates) > 1]
    times: Times = {}
    if choosing:
        arms = {b: _dedup(a for s in choosing for a in _arms_at(s, b)) for b in weights}
        timer.fresh("select")
        times = timer.rounds({b: a for b, a in arms.items() if a}, rounds)
    return [_proposal(s, times, weights) for s in stages], times


def _arms_at(stage: Stage, bucket: Bucket) -> list[Arm]:
    options = (stage.baseline, *stage.candidates)
    return [o.arms[bucket] for o in options if bucket in o.arms]


def _dedup(arms) -> list[Arm]:
    return list(dict.fromkeys(arms))


def _proposal(stage: Stage, times: Times, weights: Mapping[Bucket, float]) -> dict:
    base = stage.baseline
    if not stage.candidates:
        return {b: base for b in weights}
    if len(stage.candidates) == 1:
        only = stage.candidates[0]
        return {b: only if b in only.arms else base for b in weights}
    if stage.joint:
        scores = {
            c: _weighted_estimate(times, base, c, weights, stage.bound) for c in stage.candidates
        }
        best = max(scores, key=scores.__getitem__)
        return {b: best if scores[best] > 1.0 else base for b in weights}
    out = {}
    for b in weights:
        here = [c for c in stage.candidates if b in c.arms]
        scores = {c: _estimate_at(times, b, base, c, stage.bound) for c in here}
        top = max(scores, key=scores.__getitem__) if scores else None
        out[b] = top if top is not None and scores[top] > 1.0 else base
    return out


def _estimate_at(times: Times, b: Bucket, base: Option, option: Option, bound) -> float:
    mine, theirs = option.arms[b], base.arms[b]
    return estimate(
        _seen(times, b, theirs, mine, 0, bound), _seen(times, b, mine, theirs, 0, bound)
    )


def _weighted_estimate(
    times: Times, base: Option, option: Option, weights: Mapping[Bucket, float], bound
) -> float:
    return estimate(
        _weighted(times, base, option, weights, 0, bound),
        _weighted(times, option, base, weights, 0, bound),
    )


def _weighted(
    times: Times,
    option: Option,
    other: Option,
    weights: Mapping[Bucket, float],
    sign: int,
    bound: Optional[Bound],
) -> list[float]:
    per_bucket = [_seen(times, b, option.arms[b], other.arms[b], sign, bound) for b in weights]
    return weighted_rounds(per_bucket, list(weights.values()))


def _seen(
    times: Times, bucket: Bucket, arm: Arm, other: Arm, sign: int, bound: Optional[Bound]
) -> list[float]:
    xs = times[bucket][arm]
    return xs if bound is None else bound(bucket, arm, other, sign, xs)


# --- gate ---------------------------------------------------------------------------------------


def gate(
    stages: Sequence[Stage],
    picks: Sequence[dict[Bucket, Option]],
    timer: Timer,
    weights: Mapping[Bucket, float],
    rounds: int,
    level: float,
) -> tuple[Gated, ...]:
    """Each stage in turn in one fresh bench, its pick and baseline in their own rounds, where every
    earlier stage kept its candidate (or had none)."""
    started, out = False, list[Gated]()
    for stage, pick in zip(stages, picks):
        reached = tuple(b for b in weights if all(g.goes_on(b) for g in out))
        if stage.joint and len(reached) < len(weights):
            reached = ()  # one choice for every bucket: not where a bucket is closed
        contested = tuple(b for b in reached if pick[b].arms[b] != stage.baseline.arms[b])
        if not contested:
            out.append(Gated(stage, pick, {b: stage.baseline for b in weights}, reached))
            continue
        if not started:
            timer.fresh("gate")
            started = True
        times = timer.rounds(
            {b: [stage.baseline.arms[b], pick[b].arms[b]] for b in contested}, rounds
        )
        decide = _joint if stage.joint else _per_bucket
        kept, overall, tests = decide(stage, pick, times, contested, weights, level)
        out.append(Gated(stage, pick, kept, reached, contested, overall, tests))
    return tuple(out)


def _pair_test(
    stage: Stage, times: Times, b: Bucket, pick: Option, level: float, side: str
) -> Speedup:
    """One bucket's test of ``pick`` against the baseline; with a bound, each side's claim is tested
    with the modelled parts against it (``faster``: the pick's raised, the baseline's lowered)."""
    names = (pick.name, stage.baseline.said)
    mine, base, bound = pick.arms[b], stage.baseline.arms[b], stage.bound
    if bound is None:
        signs = [(1, -1)]
    else:
        signs = {FASTER: [(1, -1)], SLOWER: [(-1, 1)]}.get(side, [(1, -1), (-1, 1)])
    found = [
        paired_speedup(
            _seen(times, b, base, mine, sb, bound),
            _seen(times, b, mine, base, sp, bound),
            names,
            level,
        )
        for sp, sb in signs
    ]
    if len(found) == 1:
        return found[0]
    up, down = found  # each side's p-value from its own bound
    verdict = FASTER if up.faster else SLOWER if down.slower else up.verdict
    return replace(up, p_slower=down.p_slower, verdict=verdict)


def _joint(stage, pick, times, contested, weights, level):
    """One weighted test of the pick's gain at ``level``; only if it passes, each bucket's loss
    (Holm, at the same level: a fixed sequence)."""
    option, bound = pick[contested[0]], stage.bound
    overall = paired_speedup(
        _weighted(times, stage.baseline, option, weights, -1, bound),
        _weighted(times, option, stage.baseline, weights, 1, bound),
        (option.name, stage.baseline.said),
        alpha_side=level,
    )
    if not overall.faster:  # a one-sided family claims no loss: it says what it did not find
        return {b: stage.baseline for b in weights}, replace(overall, verdict=NO_GAIN), {}
    losses = holm(
        [_pair_test(stage, times, b, option, level, SLOWER) for b in contested],
        SLOWER,
        "buckets",
        level,
    )
    won = not any(t.slower for t in losses)
    kept = {b: option if won else stage.baseline for b in weights}
    return kept, overall, dict(zip(contested, losses))


def _per_bucket(stage, pick, times, contested, weights, level):
    """Each contested bucket's own test, Holm over them: one-sided for gains, or two-sided (half
    the level per side)."""
    side = stage.sides
    alpha = level / 2 if side == "both" else level
    tests = holm(
        [_pair_test(stage, times, b, pick[b], alpha, side) for b in contested],
        side,
        "buckets",
        alpha,
    )
    by_bucket = dict(zip(contested, tests))
    kept = {
        b: pick[b] if b in by_bucket and by_bucket[b].faster else stage.baseline for b in weights
    }
    return kept, None, by_bucket


def _final(gated: Sequence[Gated], bucket: Bucket) -> Option:
    """The option kept at ``bucket``: walking the sequence, each stage that kept its candidate
    replaces it, up to the first that was tested and kept its baseline. An option with the first
    baseline's arm carries its name (an SM count that did not move is the engine's default)."""
    first = gated[0].stage.baseline
    kept = first
    for g in gated:
        if bucket not in g.reached:
            break
        if g.claimed(bucket):
            kept = g.kept[bucket]
        elif bucket in g.contested:
            break
    return first if kept.arms[bucket] == first.arms[bucket] else kept


# --- report -------------------------------------------------------------------------------------


def report(
    gated: Sequence[Gated],
    kept: Mapping[Bucket, Option],
    timer: Timer,
    weights: Mapping[Bucket, float],
    rounds: int,
):
    """In one fresh bench, what is kept beside each baseline it replaced, pair by pair in their own
    rounds (a comparing stage: its pick beside its baseline, whatever the gate said). Returns the
    figures per bucket and baseline name, the weighted figures, and the medians per arm."""
    timer.fresh("report")
    figures: dict[Bucket, dict[str, Figure]] = {b: {} for b in weights}
    weighted: dict[str, Figure] = {}
    seen: dict[Bucket, dict[Arm, list[float]]] = {b: {} for b in weights}
    for pair in _report_pairs(gated, kept, weights):
        times = timer.rounds(
            {b: _dedup([pair.mine[b].arms[b], pair.other[b].arms[b]]) for b in pair.buckets},
            rounds,
        )
        for b in pair.buckets:
            for arm, xs in times[b].items():
                seen[b].setdefault(arm, []).extend(xs)
        if not pair.alone:
            _figures(figures, weighted, pair, times, weights)
    _same_arm_figures(gated, kept, figures)
    medians = {b: {arm: statistics.median(xs) for arm, xs in seen[b].items()} for b in weights}
    return figures, weighted, medians


@dataclass(frozen=True)
class _Pair:
    """What the report times together: per bucket the kept (or picked) option (``mine``) and the one
    it is set beside (``other``); ``alone``: the kept option with nothing to compare."""

    buckets: tuple[Bucket, ...]
    mine: dict[Bucket, Option]
    other: dict[Bucket, Option]
    alone: bool = False
    bound: Optional[Bound] = None


def _report_pairs(gated: Sequence[Gated], kept: Mapping[Bucket, Option], weights) -> list:
    """The kept option beside the baseline of each stage the gate reached (each distinct arm once),
    a comparing stage's pick beside its baseline, and the kept option alone where it is every such
    baseline."""
    found: dict[str, dict[Bucket, tuple[Option, Option]]] = {}
    bounds: dict[str, Optional[Bound]] = {"": None}
    for b in weights:
        beside: set[Arm] = set()
        for g in gated:
            s, arm = g.stage, g.stage.baseline.arms[b]
            if s.compare and g.pick[b].arms[b] != arm:
                found.setdefault(s.name, {})[b] = (g.pick[b], s.baseline)
                bounds[s.name] = s.bound
            elif not s.compare and b in g.reached and arm not in beside and arm != kept[b].arms[b]:
                found.setdefault(s.baseline.name, {})[b] = (kept[b], s.baseline)
                bounds[s.baseline.name] = s.bound
                beside.add(arm)
        if not any(b in by for by in found.values()):
            found.setdefault("", {})[b] = (kept[b], kept[b])
    return [
        _Pair(
            tuple(by),
            {b: mine for b, (mine, _) in by.items()},
            {b: other for b, (_, other) in by.items()},
            key == "",
            bounds[key],
        )
        for key, by in found.items()
    ]


def _figures(figures, weighted, pair: _Pair, times: Times, weights) -> None:
    """The pair's figure per bucket (simultaneous over them) and, where it was timed at every
    bucket, weighted over the buckets (a bound's modelled parts at their point values)."""
    mine, other = pair.mine, pair.other

    def seen(b: Bucket, a: Option, c: Option) -> list[float]:
        return _seen(times, b, a.arms[b], c.arms[b], 0, pair.bound)

    for b in pair.buckets:
        xs, ys = seen(b, other[b], mine[b]), seen(b, mine[b], other[b])
        figures[b][other[b].name] = figure(
            xs, ys, (mine[b].name, other[b].said), len(pair.buckets)
        )
    if len(pair.buckets) == len(weights) > 1:
        w = list(weights.values())
        base = weighted_rounds([seen(b, other[b], mine[b]) for b in weights], w)
        ours = weighted_rounds([seen(b, mine[b], other[b]) for b in weights], w)
        first = next(iter(weights))
        weighted[other[first].name] = figure(base, ours, (mine[first].name, other[first].said))


def _same_arm_figures(gated: Sequence[Gated], kept, figures) -> None:
    """A reached baseline with the arm of one already set beside the kept option reads its figure."""
    for b, got in figures.items():
        reached = [g.stage for g in gated if b in g.reached and not g.stage.compare]
        for s in reached:
            name, arm = s.baseline.name, s.baseline.arms[b]
            if name in got or arm == kept[b].arms[b]:
                continue
            twin = next(
                (t for t in reached if t.baseline.name in got and t.baseline.arms[b] == arm), None
            )
            if twin is not None:
                got[name] = replace(got[twin.baseline.name], baseline=s.baseline.said)
