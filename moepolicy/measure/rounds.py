"""Balanced rounds and the exact paired test that compares them, without torch (CPU benches use
them too).

**Rounds** time every contender once each (:func:`balanced_rounds`), in orders taken from a
carry-over-balanced design (:func:`round_orders`): over one cycle of the design every contender is
timed in every position equally often, is preceded by every other contender equally often, and is
preceded by itself equally often (each round starts with the contender the round before ended
with). So neither a slow first call after a pause nor what the previous call left behind (a cache,
an SM count's launch state) favours one contender.

Each round pairs a contender with the baseline of the same round: the per-round log-ratio ``d =
log(baseline / contender)`` (above 0: the contender was faster in that round).

**The test** is the signed-rank sign-flip test (Wilcoxon's): the statistic is the sum of the ranks of
``|d|`` over the rounds where the contender was faster. With no difference, and noise that treats
both sides of a round alike (any shape: heavy tails, outliers, a drift shared by both), each ``d`` is
as likely as ``-d``, so all ``2**n`` sign patterns are equally likely and the p-value, counted over
them, is exact. Ranks instead of the values make one wild round count as one round: a 2x outlier
moves the statistic by at most its rank. A contender is **faster** only where the one-sided p-value
is at most the side's level (:data:`ALPHA_SIDE`, 2.5 %, unless a caller spends less), **slower**
likewise on the other side. Where one decision rests on several comparisons, :func:`holm` (Holm's
step-down correction) keeps the chance of any false claim among them at or below the same level.

**The estimate and its interval** invert the same test: the speed-up is ``exp`` of the
Hodges-Lehmann estimate (the median of the ``n (n + 1) / 2`` Walsh averages ``(d_i + d_j) / 2``),
and the interval's ends are order statistics of the Walsh averages, so the 95 % interval excludes 1
exactly when the unadjusted test claims. Below 6 rounds no 95 % interval exists (``2**-5`` > 2.5 %).

Speed-ups are printed one way everywhere (:func:`speedup_words`): ``x1.035 faster`` or
``x1.051 slower``, never a bare ratio whose direction the reader must guess.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Callable, Hashable, Optional, Sequence, TypeVar

# Carry-over-balanced cycles of round orders for 2 to 5 contenders (found by a depth-first search:
# each a cycle of 2k rounds, each contender once per round and in each position twice, each
# ordered pair of distinct contenders adjacent twice, each round starting with the contender the
# previous one ended with). More contenders rotate (only a selection, which claims nothing, has more).
_DESIGNS = {
    1: ((0,),),
    2: ((0, 1), (1, 0)),
    3: ((0, 1, 2), (2, 0, 1), (1, 0, 2), (2, 1, 0), (0, 2, 1), (1, 2, 0)),
    4: (
        (0, 1, 2, 3),
        (3, 0, 1, 2),
        (2, 0, 3, 1),
        (1, 3, 0, 2),
        (2, 1, 0, 3),
        (3, 2, 1, 0),
        (0, 2, 3, 1),
        (1, 3, 2, 0),
    ),
    5: (
        (0, 1, 2, 3, 4),
        (4, 0, 2, 1, 3),
        (3, 0, 1, 4, 2),
        (2, 3, 1, 0, 4),
        (4, 1, 3, 0, 2),
        (2, 4, 0, 3, 1),
        (1, 2, 0, 4, 3),
        (3, 2, 4, 1, 0),
        (0, 3, 4, 2, 1),
        (1, 4, 3, 2, 0),
    ),
}


def round_orders(k: int) -> tuple[tuple[int, ...], ...]:
    """One cycle of round orders for ``k`` contenders: carry-over-balanced for up to 5 (see the
    module's doc), else rotated (each round starting one further along: positions balanced only)."""
    if k in _DESIGNS:
        return _DESIGNS[k]
    return tuple(tuple((r + i) % k for i in range(k)) for r in range(k))


def split_by_cycle(rounds: int, k: int) -> tuple[list[int], list[int]]:
    """The rounds of a :func:`balanced_rounds` run of ``k`` names split into two sets of whole
    cycles of :func:`round_orders`, alternating (cycles 0, 2, ... and 1, 3, ...): each set keeps the
    design's balance of positions and predecessors, where even and odd rounds would not (for three
    names, one name would follow the same one in every even round)."""
    length = len(round_orders(k))
    first = [r for r in range(rounds) if (r // length) % 2 == 0]
    return first, [r for r in range(rounds) if (r // length) % 2 == 1]


Name = TypeVar("Name", bound=Hashable)  # what a caller times under: an arm, a config, a key


def balanced_rounds(
    names: Sequence[Name],
    time_once: Callable[[Name], float],
    rounds: int,
    warm_up: bool = False,
) -> dict[Name, list[float]]:
    """``rounds`` rounds, each timing every name once, in the orders of :func:`round_orders`. With
    ``warm_up``, one pass first whose timings are dropped (the first calls after a start pay for it),
    in the cycle's last order, so the first round's first name follows itself as every round's first
    name does. Returns each name's timings."""
    if not names or rounds < 1:
        raise ValueError(f"need names and rounds >= 1 (got {len(names)} names, {rounds} rounds)")
    cycle = round_orders(len(names))
    for i in cycle[-1] if warm_up else ():
        time_once(names[i])
    out: dict[Name, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for i in cycle[r % len(cycle)]:
            out[names[i]].append(time_once(names[i]))
    return out


# two-sided: a claim of "faster" or of "slower" is false at most 2.5 % of the time each
ALPHA = 0.05
ALPHA_SIDE = ALPHA / 2
CONFIDENCE = 1 - ALPHA
# the least a tune runs: every family can claim with Holm over 3 buckets; the strictest, both
# orders at 0.625 % per side (tuning.protocol.FAMILY_LEVELS), needs 2**-n <= 0.0021
MIN_ROUNDS = 9
DEFAULT_ROUNDS = 15  # power: see docs/BENCHMARKS.md ("The protocol's claims")
FASTER, SLOWER, SAME = "faster", "slower", "within noise"
# one-sided families: what was not claimed
NO_LOSS, NO_GAIN = "no loss beyond noise", "no gain beyond noise"
TEST = "exact signed-rank sign-flip"
_TIE = 1e-12  # per-round log-ratios this small are a tie (a contender equal to its baseline)


def least_rounds(comparisons: int = 1, alpha_side: float = ALPHA_SIDE) -> int:
    """The fewest rounds in which the test can claim anything, with Holm over ``comparisons``: its
    smallest p-value, ``2**-n``, must reach ``alpha_side / comparisons``."""
    return max(1, math.ceil(math.log2(max(comparisons, 1) / alpha_side) - 1e-9))


def speedup_words(x: float) -> str:
    """A speed-up (baseline time over contender time) as people read it: ``x1.035 faster`` or
    ``x1.051 slower``; never a ratio below 1."""
    return f"x{x:.3f} faster" if x >= 1.0 else f"x{1.0 / x:.3f} slower"


def interval_words(
    low: Optional[float], high: Optional[float], confidence: float = CONFIDENCE
) -> str:
    """An interval of speed-ups in the same words: ``95% CI x1.01-x1.06 faster``, ``... slower``, or
    ``95% CI x1.02 slower to x1.03 faster`` where it spans no difference."""
    level = f"{confidence:.0%} CI"
    if low is None or high is None:
        return f"too few rounds for a {level}"
    if low >= 1.0:
        return f"{level} x{low:.3f}-x{high:.3f} faster"
    if high <= 1.0:
        return f"{level} x{1 / high:.3f}-x{1 / low:.3f} slower"
    return f"{level} x{1 / low:.3f} slower to x{high:.3f} faster"


@dataclass(frozen=True)
class Speedup:
    """``baseline`` time over ``contender`` time, paired per round (above 1: the contender is faster),
    with the exact test's p-values, its interval (at ``confidence``) and the verdict."""

    contender: str
    baseline: str
    rounds: int
    speedup: float  # exp of the Hodges-Lehmann estimate of the per-round log-ratios
    low: Optional[float]  # the interval (the test inverted); None where too few rounds
    high: Optional[float]
    p_faster: float  # one-sided p-value of "the contender is faster"
    p_slower: float
    per_round_min: float
    per_round_max: float
    verdict: str = SAME  # faster | slower | within noise (no gain / no loss beyond noise in a one-sided family)
    correction: str = ""  # "Holm over 3 buckets" where the verdict is one of a family
    test: str = TEST
    statistic: float = 0.0  # the signed-rank statistic: the sum of the ranks of the rounds where the contender was faster
    level: float = ALPHA_SIDE  # the level each side of the verdict was tested at (before Holm)
    confidence: float = CONFIDENCE  # of the interval

    @property
    def faster(self) -> bool:
        return self.verdict == FASTER

    @property
    def slower(self) -> bool:
        return self.verdict == SLOWER

    def to_doc(self) -> dict:
        out = {
            "contender": self.contender,
            "baseline": self.baseline,
            "rounds": self.rounds,
            "speedup": round(self.speedup, 4),
            "ci95": None
            if self.low is None or self.high is None  # both or neither
            else [round(self.low, 4), round(self.high, 4)],
            "per_round": [round(self.per_round_min, 4), round(self.per_round_max, 4)],
            "p_faster": round(self.p_faster, 5),
            "p_slower": round(self.p_slower, 5),
            "verdict": self.verdict,
            "test": self.test,
        }
        if self.correction:
            out["correction"] = self.correction
        return out

    def words(self) -> str:
        spread = f"{interval_words(self.low, self.high, self.confidence)}, {self.rounds} rounds"
        family = f", {self.correction}" if self.correction else ""
        what = f"{speedup_words(self.speedup)} than {self.baseline}"
        if self.faster:
            return f"{what} ({spread}{family})"
        if self.slower:
            return f"{what}: a loss beyond noise ({spread}{family})"
        return f"{what}, {self.verdict} ({spread}{family})"


def paired_speedup(
    baseline: Sequence[float],
    contender: Sequence[float],
    names: tuple[str, str] = ("contender", "baseline"),
    alpha_side: float = ALPHA_SIDE,
    confidence: float = CONFIDENCE,
) -> Speedup:
    """The speed-up of ``contender`` over ``baseline`` from per-round times of the same rounds, with
    its unadjusted verdict (one comparison at ``alpha_side`` per side) and its interval at
    ``confidence``."""
    if len(baseline) != len(contender) or not baseline:
        raise ValueError(
            f"paired rounds need equal, non-zero counts (got {len(baseline)} and {len(contender)})"
        )
    logs = [math.log(b / c) for b, c in zip(baseline, contender)]
    found = signed_rank(logs, (1 - confidence) / 2)
    verdict = (
        FASTER
        if found.p_faster <= alpha_side
        else SLOWER
        if found.p_slower <= alpha_side
        else SAME
    )
    return Speedup(
        names[0],
        names[1],
        len(logs),
        math.exp(found.estimate),
        None if found.low is None else math.exp(found.low),
        None if found.high is None else math.exp(found.high),
        found.p_faster,
        found.p_slower,
        math.exp(min(logs)),
        math.exp(max(logs)),
        verdict,
        statistic=found.statistic,
        level=alpha_side,
        confidence=confidence,
    )


def estimate(baseline: Sequence[float], contender: Sequence[float]) -> float:
    """The paired speed-up alone, untested (a selection's point estimate)."""
    return math.exp(hodges_lehmann([math.log(b / c) for b, c in zip(baseline, contender)]))


def holm(
    tests: Sequence[Speedup],
    side: str = "both",
    family: str = "comparisons",
    alpha_side: float = ALPHA_SIDE,
) -> list[Speedup]:
    """The verdicts of a family of comparisons under Holm's step-down correction, so that the chance
    of any false claim among them is at most ``alpha_side`` per side. ``side``: ``faster`` (only
    gains can be claimed), ``slower`` (only losses) or ``both``. The order of ``tests`` is kept."""
    if side not in ("faster", "slower", "both"):
        raise ValueError(f"side must be faster, slower or both, got {side!r}")
    m = len(tests)

    def p_of(t: Speedup) -> float:
        return {"faster": t.p_faster, "slower": t.p_slower}.get(side, min(t.p_faster, t.p_slower))

    verdicts = [{"faster": NO_GAIN, "slower": NO_LOSS}.get(side, SAME)] * m
    for step, i in enumerate(sorted(range(m), key=lambda j: p_of(tests[j]))):
        if p_of(tests[i]) > alpha_side / (m - step):
            break  # Holm stops at the first comparison it cannot reject
        t = tests[i]
        verdicts[i] = (
            FASTER
            if (side == "faster" or (side == "both" and t.p_faster <= t.p_slower))
            else SLOWER
        )
    label = f"Holm over {m} {family}" if m > 1 else ""
    return [
        replace(t, verdict=v, correction=label, level=alpha_side) for t, v in zip(tests, verdicts)
    ]


def weighted_rounds(
    per_bucket: Sequence[Sequence[float]], weights: Sequence[float]
) -> list[float]:
    """The weighted objective round by round: ``sum(weight * time)`` over the buckets of each round."""
    rounds = {len(xs) for xs in per_bucket}
    if len(rounds) != 1:
        raise ValueError(f"every bucket needs the same rounds, got {sorted(rounds)}")
    return [
        math.fsum(w * xs[r] for w, xs in zip(weights, per_bucket)) for r in range(rounds.pop())
    ]


@dataclass(frozen=True)
class SignedRank:
    """The signed-rank test of per-round log-ratios: one-sided p-values, the statistic, the
    Hodges-Lehmann estimate and the interval's ends (log space; None where too few rounds)."""

    p_faster: float
    p_slower: float
    statistic: float
    estimate: float
    low: Optional[float]
    high: Optional[float]


def signed_rank(logs: Sequence[float], alpha_side: float = ALPHA_SIDE) -> SignedRank:
    """The exact signed-rank sign-flip test of ``logs`` (above 0: the contender faster), with the
    interval whose ends are at ``alpha_side`` each. Ties (rounds equal within :data:`_TIE`) carry no
    sign and are left out of the test (Wilcoxon's rule); tied magnitudes share their mean rank."""
    tie = _TIE * max(1.0, math.fsum(abs(x) for x in logs))
    signed = [x for x in logs if abs(x) > tie]
    ranks = _midranks([abs(x) for x in signed])
    doubled = tuple(int(round(2 * r)) for r in ranks)
    above = sum(d for d, x in zip(doubled, signed) if x > 0)
    counts = _null_counts(tuple(sorted(doubled)))
    total = 2 ** len(signed)
    p_faster = sum(counts[above:]) / total
    p_slower = sum(counts[: above + 1]) / total
    low, high = _walsh_interval(logs, alpha_side)
    return SignedRank(p_faster, p_slower, above / 2, hodges_lehmann(logs), low, high)


def hodges_lehmann(logs: Sequence[float]) -> float:
    """The median of the Walsh averages ``(d_i + d_j) / 2``, ``i <= j``: the estimate the signed-rank
    test inverts to (robust: a few wild rounds move it little)."""
    walsh = _walsh(logs)
    m = len(walsh)
    return walsh[m // 2] if m % 2 else (walsh[m // 2 - 1] + walsh[m // 2]) / 2


def _walsh(logs: Sequence[float]) -> list[float]:
    xs = list(logs)
    return sorted((xs[i] + xs[j]) / 2 for i in range(len(xs)) for j in range(i, len(xs)))


def _walsh_interval(
    logs: Sequence[float], alpha_side: float
) -> tuple[Optional[float], Optional[float]]:
    """The interval's ends: with ``t`` the least count of Walsh averages above a shift that the test
    rejects at ``alpha_side``, the (M - t + 1)-th and the t-th smallest of the M Walsh averages."""
    n = len(logs)
    counts = _null_counts(tuple(range(2, 2 * n + 1, 2)))
    total, m = 2**n, n * (n + 1) // 2
    tail, t = 0, None
    for s in range(m, -1, -1):  # the upper tail of the statistic, from its largest value
        tail += counts[2 * s]
        if tail / total > alpha_side + 1e-12:
            break
        t = s
    if t is None or t < 1:
        return None, None
    walsh = _walsh(logs)
    return walsh[m - t], walsh[t - 1]


def _midranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


@functools.lru_cache(maxsize=256)
def _null_counts(doubled: tuple[int, ...]) -> tuple[int, ...]:
    """How many of the ``2**n`` sign patterns give each value of the doubled statistic (the sum of
    the doubled ranks that carry a plus sign): index ``s`` counts the patterns summing to ``s``."""
    counts = [1]
    for d in doubled:
        grown = counts + [0] * d
        for s, c in enumerate(counts):
            grown[s + d] += c
        counts = grown
    return tuple(counts)
