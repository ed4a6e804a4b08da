"""Interleaved rounds and the exact paired test that compares them, without torch (CPU benches use
them too).

Rounds rotate over the things compared (:func:`rotated_rounds`). Each round pairs a contender with
the baseline of the same round: the per-round log-ratio ``d = log(baseline / contender)`` (above 0:
the contender was faster in that round). The speed-up is ``exp(mean d)``, a geometric mean.

**The gate** is Fisher's sign-flip (randomization) test of ``mean d``. With no difference, and noise
that treats both alike within a round (any shape: heavy tails, outliers, a drift shared by both),
each ``d`` is as likely as ``-d``, so all ``2**n`` sign patterns are equally likely and the p-value
is exact. A contender is **faster** only where the one-sided p-value is at most :data:`ALPHA_SIDE`
(2.5 %), **slower** likewise on the other side: a two-sided test at :data:`ALPHA` = 5 %. Where one
decision rests on several comparisons, :func:`holm` (Holm's step-down correction) keeps the chance
of any false claim among them at or below the same level.

**The 95 % interval** inverts the same test. Flipping the signs of a subset ``A`` of the rounds
leaves the statistic at least as large exactly when ``mean(d over A) <= shift``, so the p-value at a
shift is a count of subset means and the interval's ends are order statistics of the ``2**n - 1``
subset means: it excludes 1 exactly when the unadjusted test claims. Below 6 rounds no 95 % interval
exists (``2**-5`` > 2.5 %). Up to :data:`EXACT_ROUNDS` rounds every pattern is counted; beyond, a
seeded sample of :data:`MC_FLIPS` patterns (a Monte Carlo p-value, still valid).

Speed-ups are printed one way everywhere (:func:`speedup_words`): ``x1.035 faster`` or
``x1.051 slower``, never a bare ratio whose direction the reader must guess.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import Callable, Hashable, Optional, Sequence


def rotated_rounds(
    names: Sequence[Hashable],
    time_once: Callable[[Hashable], float],
    rounds: int,
    warm_up: bool = False,
) -> dict[Hashable, list[float]]:
    """``rounds`` rounds, each timing every name once, in turn; each round starts one name further
    along, so none is timed first after a pause in more than one round in ``len(names)`` (with one
    fixed order the first in line pays any warm-up every round). With ``warm_up``, one pass first
    whose timings are dropped (the first calls after a start pay for it). Returns each name's timings."""
    if not names or rounds < 1:
        raise ValueError(f"need names and rounds >= 1 (got {len(names)} names, {rounds} rounds)")
    for name in names if warm_up else ():
        time_once(name)
    out: dict[Hashable, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for i in range(len(names)):
            name = names[(r + i) % len(names)]
            out[name].append(time_once(name))
    return out


ALPHA = (
    0.05  # two-sided: a claim of "faster" or of "slower" is false at most 2.5 % of the time each
)
ALPHA_SIDE = ALPHA / 2
CONFIDENCE = 1 - ALPHA
MIN_ROUNDS = 7  # the least a tune runs: Holm over 3 buckets at 2.5 % needs 2**-n <= 0.0083
DEFAULT_ROUNDS = 15  # power: see docs/BENCHMARKS.md ("The protocol's claims")
EXACT_ROUNDS = 16  # up to this many rounds every sign pattern is counted
MC_FLIPS = 2**16
FASTER, SLOWER, SAME = "faster", "slower", "within noise"
NO_LOSS, NO_GAIN = (
    "no loss beyond noise",
    "no gain beyond noise",
)  # one-sided families: what was not claimed
_TIE = 1e-12  # per-round log-ratios summing to this little are a tie (a contender equal to its baseline)


def least_rounds(comparisons: int = 1, alpha_side: float = ALPHA_SIDE) -> int:
    """The fewest rounds in which the sign-flip test can claim anything, with Holm over
    ``comparisons``: its smallest p-value, ``2**-n``, must reach ``alpha_side / comparisons``."""
    return max(1, math.ceil(math.log2(max(comparisons, 1) / alpha_side)))


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
    with the exact sign-flip test's p-values, its 95 % interval and the verdict."""

    contender: str
    baseline: str
    rounds: int
    speedup: float  # geometric mean of the per-round ratios
    low: Optional[float]  # 95 % interval (the sign-flip test inverted); None below 6 rounds
    high: Optional[float]
    p_faster: float  # one-sided p-value of "the contender is faster"
    p_slower: float
    per_round_min: float
    per_round_max: float
    verdict: str = SAME  # faster | slower | within noise (no gain / no loss beyond noise in a one-sided family)
    correction: str = ""  # "Holm over 3 buckets" where the verdict is one of a family
    test: str = "exact sign-flip"

    @property
    def faster(self) -> bool:
        return self.verdict == FASTER

    @property
    def slower(self) -> bool:
        return self.verdict == SLOWER

    @property
    def beyond_noise(self) -> bool:
        """A gain beyond noise (what older callers asked)."""
        return self.faster

    def to_doc(self) -> dict:
        out = {
            "contender": self.contender,
            "baseline": self.baseline,
            "rounds": self.rounds,
            "speedup": round(self.speedup, 4),
            "ci95": None if self.low is None else [round(self.low, 4), round(self.high, 4)],
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
        spread = f"{interval_words(self.low, self.high)}, {self.rounds} rounds"
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
    seed: int = 0,
    names: tuple[str, str] = ("contender", "baseline"),
) -> Speedup:
    """The speed-up of ``contender`` over ``baseline`` from per-round times of the same rounds,
    with its unadjusted verdict (one comparison at 2.5 % per side)."""
    if len(baseline) != len(contender) or not baseline:
        raise ValueError(
            f"paired rounds need equal, non-zero counts (got {len(baseline)} and {len(contender)})"
        )
    logs = [math.log(b / c) for b, c in zip(baseline, contender)]
    p_faster, p_slower, low, high, exact = sign_flip(logs, seed)
    verdict = FASTER if p_faster <= ALPHA_SIDE else SLOWER if p_slower <= ALPHA_SIDE else SAME
    mean = math.fsum(logs) / len(logs)
    return Speedup(
        names[0],
        names[1],
        len(logs),
        math.exp(mean),
        None if low is None else math.exp(low),
        None if high is None else math.exp(high),
        p_faster,
        p_slower,
        math.exp(min(logs)),
        math.exp(max(logs)),
        verdict,
        test="exact sign-flip" if exact else f"sign-flip, {MC_FLIPS} random patterns",
    )


def geomean_speedup(baseline: Sequence[float], contender: Sequence[float]) -> float:
    """The geometric mean of the per-round speed-ups, untested (a selection's point estimate)."""
    return math.exp(
        math.fsum(math.log(b / c) for b, c in zip(baseline, contender)) / len(baseline)
    )


def holm(
    tests: Sequence[Speedup], side: str = "both", family: str = "comparisons"
) -> list[Speedup]:
    """The verdicts of a family of comparisons under Holm's step-down correction, so that the chance
    of any false claim among them is at most 2.5 % per side. ``side``: ``faster`` (only gains can be
    claimed), ``slower`` (only losses) or ``both``. The order of ``tests`` is kept."""
    if side not in ("faster", "slower", "both"):
        raise ValueError(f"side must be faster, slower or both, got {side!r}")
    m = len(tests)

    def p_of(t: Speedup) -> float:
        return {"faster": t.p_faster, "slower": t.p_slower}.get(side, min(t.p_faster, t.p_slower))

    verdicts = [{"faster": NO_GAIN, "slower": NO_LOSS}.get(side, SAME)] * m
    for step, i in enumerate(sorted(range(m), key=lambda j: p_of(tests[j]))):
        if p_of(tests[i]) > ALPHA_SIDE / (m - step):
            break  # Holm stops at the first comparison it cannot reject
        t = tests[i]
        verdicts[i] = (
            FASTER
            if (side == "faster" or (side == "both" and t.p_faster <= t.p_slower))
            else SLOWER
        )
    label = f"Holm over {m} {family}" if m > 1 else ""
    return [replace(t, verdict=v, correction=label) for t, v in zip(tests, verdicts)]


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


def sign_flip(
    logs: Sequence[float], seed: int = 0
) -> tuple[float, float, Optional[float], Optional[float], bool]:
    """Fisher's sign-flip test of ``mean(logs)``: (p of a mean above 0, p of a mean below 0, the
    interval's low and high ends in log space or None, whether every pattern was counted)."""
    n = len(logs)
    exact = n <= EXACT_ROUNDS
    try:
        import numpy  # noqa: F401
    except ImportError:  # the light path: the same counts in plain Python
        return _sign_flip_python(list(logs), exact, seed)
    return _sign_flip_numpy(list(logs), exact, seed)


def _bounds(
    means_sorted_k: Callable[[int], float], count: int, patterns: int
) -> tuple[Optional[float], Optional[float]]:
    """The interval's ends: the k-th smallest and k-th largest of ``count`` subset means."""
    k = math.floor(ALPHA_SIDE * patterns + 1e-9)
    if k < 1 or k > count:
        return None, None
    return means_sorted_k(k - 1), means_sorted_k(count - k)


def _subsets_numpy(d, exact: bool, seed: int):
    """Every subset's sum and size (by doubling: subset ``i`` holds round ``j`` where bit ``j`` of
    ``i`` is set), or a seeded random sample of subsets."""
    import numpy as np

    if exact:
        sums, sizes = np.zeros(1), np.zeros(1)
        for x in d:
            sums, sizes = np.concatenate((sums, sums + x)), np.concatenate((sizes, sizes + 1.0))
        return sums, sizes
    masks = np.random.default_rng(seed).integers(0, 2, size=(MC_FLIPS, len(d))).astype(np.float64)
    return masks @ d, masks.sum(axis=1)


def _sign_flip_numpy(logs: list[float], exact: bool, seed: int, interval: bool = True):
    import numpy as np

    d = np.asarray(logs, dtype=np.float64)
    sums, sizes = _subsets_numpy(d, exact, seed)
    tie = _TIE * max(1.0, float(np.abs(d).sum()))
    below, above = int(np.count_nonzero(sums <= tie)), int(np.count_nonzero(sums >= -tie))
    patterns, extra = (len(sums), 0) if exact else (len(sums) + 1, 1)
    p_faster, p_slower = (below + extra) / patterns, (above + extra) / patterns
    if not interval:
        return p_faster, p_slower, None, None, exact
    nonempty = sizes > 0
    means = sums[nonempty] / sizes[nonempty]

    def kth(k: int) -> float:
        return float(np.partition(means, k)[k])

    low, high = _bounds(kth, len(means), patterns)
    return p_faster, p_slower, low, high, exact


def _sign_flip_python(logs: list[float], exact: bool, seed: int):
    if exact:
        subsets = [(0.0, 0)]
        for x in logs:
            subsets += [(s + x, k + 1) for s, k in subsets]
    else:
        rng = random.Random(seed)
        subsets = []
        for _ in range(MC_FLIPS):
            picked = [x for x in logs if rng.random() < 0.5]
            subsets.append((math.fsum(picked), len(picked)))
    tie = _TIE * max(1.0, math.fsum(abs(x) for x in logs))
    below = sum(1 for s, _ in subsets if s <= tie)
    above = sum(1 for s, _ in subsets if s >= -tie)
    patterns, extra = (len(subsets), 0) if exact else (len(subsets) + 1, 1)
    means = sorted(s / k for s, k in subsets if k)
    low, high = _bounds(means.__getitem__, len(means), patterns)
    return (below + extra) / patterns, (above + extra) / patterns, low, high, exact
