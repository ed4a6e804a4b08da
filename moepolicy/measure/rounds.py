"""Interleaved rounds without torch: the tuner's re-measurement uses them on CPU benches too."""

from __future__ import annotations

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
