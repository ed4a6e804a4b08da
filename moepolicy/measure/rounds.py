"""Interleaved rounds and their paired comparison, without torch (CPU benches use them too).

Rounds rotate over the things compared; each round pairs a contender with the baseline of the same
round. The speed-up is the geometric mean of the per-round ratios, with a seeded bootstrap 95 %
interval over rounds; a gain is beyond noise only where the interval's lower bound is above 1.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass
from typing import Callable, Hashable, Sequence


def rotated_rounds(names: Sequence[Hashable], time_once: Callable[[Hashable], float],
                   rounds: int) -> dict[Hashable, list[float]]:
    """``rounds`` rounds, each timing every name once, in turn; each round starts one name further
    along, so none is timed first after a pause in more than one round in ``len(names)`` (with one
    fixed order the first in line pays any warm-up every round). Returns each name's timings."""
    if not names or rounds < 1:
        raise ValueError(f"need names and rounds >= 1 (got {len(names)} names, {rounds} rounds)")
    out: dict[Hashable, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for i in range(len(names)):
            name = names[(r + i) % len(names)]
            out[name].append(time_once(name))
    return out


MIN_ROUNDS = 7
BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Speedup:
    """``baseline`` time over ``contender`` time, paired per round: above 1 means the contender is faster."""

    contender: str
    baseline: str
    rounds: int
    speedup: float  # geometric mean of the per-round ratios
    low: float  # 95 % bootstrap interval
    high: float
    per_round_min: float
    per_round_max: float

    @property
    def beyond_noise(self) -> bool:
        return self.low > 1.0

    def to_doc(self) -> dict:
        return {"contender": self.contender, "baseline": self.baseline, "rounds": self.rounds,
                "speedup": round(self.speedup, 4), "ci95": [round(self.low, 4), round(self.high, 4)],
                "per_round": [round(self.per_round_min, 4), round(self.per_round_max, 4)],
                "beyond_noise": self.beyond_noise}

    def words(self) -> str:
        spread = (f"95% CI {self.low:.3f}-{self.high:.3f}, {self.rounds} rounds" if self.rounds > 1
                  else "one round of a noise-free bench")
        if self.beyond_noise:
            return f"x{self.speedup:.3f} faster than {self.baseline} ({spread})"
        return f"no gain beyond noise over {self.baseline} (x{self.speedup:.3f}, {spread})"


def paired_speedup(baseline: Sequence[float], contender: Sequence[float], seed: int = 0,
                   names: tuple[str, str] = ("contender", "baseline")) -> Speedup:
    """The speed-up of ``contender`` over ``baseline`` from per-round times of the same rounds."""
    if len(baseline) != len(contender) or not baseline:
        raise ValueError(f"paired rounds need equal, non-zero counts (got {len(baseline)} and {len(contender)})")
    logs = [math.log(b / c) for b, c in zip(baseline, contender)]
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(logs, k=len(logs))) for _ in range(BOOTSTRAP_RESAMPLES))
    tail = (1 - CONFIDENCE) / 2
    low = means[int(tail * (len(means) - 1))]
    high = means[int(math.ceil((1 - tail) * (len(means) - 1)))]
    return Speedup(names[0], names[1], len(logs), math.exp(statistics.fmean(logs)), math.exp(low), math.exp(high),
                   math.exp(min(logs)), math.exp(max(logs)))
