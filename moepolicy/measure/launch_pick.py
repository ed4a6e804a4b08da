"""Choosing the fastest of several launch configs, as DeepGEMM does for the SM count it is given.

One timing per candidate is not enough: right after compiling, the GPU's clocks and the candidates'
first launches vary by more than the candidates differ (on H200 the 2-CTA-cluster GEMM's picks for
126 SMs differed between runs, 1312 vs 1364 us alone: runs 33-35). Every candidate is timed in
``rounds`` interleaved rounds, each round starting one candidate further along, so that none is timed
first after a pause in more than one round in ``len(candidates)``; the lowest median wins. Pure
Python: the timing itself is passed in (``ExpertGemm.pick`` times each launch as the overlap
measurement times the GEMM alone: after an L2 flush, queued).
"""

from __future__ import annotations

import statistics
from typing import Callable, Hashable, Sequence, TypeVar

Candidate = TypeVar("Candidate", bound=Hashable)


def fastest(candidates: Sequence[Candidate], time_once: Callable[[Candidate], float],
            rounds: int) -> tuple[Candidate, dict[Candidate, float]]:
    """The candidate with the lowest median of ``rounds`` timings, and every candidate's median."""
    if not candidates or rounds < 1:
        raise ValueError(f"need candidates and rounds >= 1 (got {len(candidates)} candidates, {rounds} rounds)")
    samples: dict[Candidate, list[float]] = {c: [] for c in candidates}
    n = len(candidates)
    for r in range(rounds):
        for i in range(n):
            c = candidates[(r + i) % n]
            samples[c].append(time_once(c))
    medians = {c: statistics.median(v) for c, v in samples.items()}
    return min(candidates, key=medians.__getitem__), medians
