"""The re-measurement protocol: a gain is claimed only beyond the measurement noise.

The configs a search found best are re-measured beside a baseline (DeepEP's default chunks, the
engine's default) in a fresh bench (new worker processes, a new ``deep_ep.Buffer``), interleaved over
rounds (``rotated_rounds``: each round times every contender once, each round starting one further
along), so slow drifts of a shared machine fall on all alike. Each round pairs the contender with
the baseline of the same round; the speed-up is the geometric mean of the per-round ratios, and its
95 % interval comes from a seeded bootstrap over rounds (``measure.rounds.paired_speedup``). A gain
is claimed only where the interval's lower bound is above 1.

Selection and report use different samples: :func:`select` picks among the search's top configs in
one fresh bench, :func:`compare` measures the pick against the baselines in another, and only the
second is reported. A winner is never reported from the samples that chose it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence

from moepolicy.errors import TuningError
from moepolicy.measure.rounds import MIN_ROUNDS, Speedup, paired_speedup, rotated_rounds
from moepolicy.tuning import progress
from moepolicy.tuning.bench import Bench, TrialFailed, TunePoint, Workload


@dataclass(frozen=True)
class Contender:
    """A config in a re-measurement: a name people read (``tuned``, ``default``, ``engine``) and its point."""

    name: str
    point: TunePoint


def protocol_rounds(bench: Bench, asked: int) -> int:
    """The rounds the protocol runs: one on a noise-free (modelled) bench, where one says all; else
    ``asked``, at least :data:`MIN_ROUNDS` (fewer pairs give no 95 % interval)."""
    if bench.noise_free:
        return 1
    if asked < MIN_ROUNDS:
        raise TuningError(f"confirm_rounds must be at least {MIN_ROUNDS} for a 95% interval, got {asked}",
                          field="confirm_rounds")
    return asked


def interleaved(bench: Bench, workload: Workload, contenders: Sequence[Contender], rounds: int,
                region: str) -> dict[str, list[float]]:
    """Per-round times of every contender, interleaved, in a fresh bench (closed and started again:
    new processes, a new Buffer). A failed measurement fails the protocol."""
    by_name = {c.name: c.point for c in contenders}
    bench.restart()

    def time_once(name: str) -> float:
        value = bench.measure(workload, by_name[name]).objective(region)
        progress.advance()
        return value

    try:
        return rotated_rounds(list(by_name), time_once, rounds)
    except TrialFailed as exc:
        raise TuningError(f"re-measurement failed: {exc}") from None


@dataclass(frozen=True)
class Confirmed:
    """One token bucket after the protocol: the config kept, and its speed-ups from the report rounds."""

    tokens: int
    kept: Contender
    vs_default: Speedup  # the kept config against DeepEP's default chunks at the chosen SM count
    vs_engine: Speedup  # the kept config at the chosen SM count against the engine's default
    times_us: dict[str, float]  # median per-round time of each contender in the report rounds
    selection: str  # how the kept config was picked

    def to_doc(self) -> dict:
        return {"kept": self.kept.name, "selection": self.selection, "vs_default": self.vs_default.to_doc(),
                "vs_engine": self.vs_engine.to_doc(),
                "median_us": {k: round(v, 2) for k, v in self.times_us.items()}}


def select(bench: Bench, workload: Workload, top: Sequence[TunePoint], default: TunePoint, rounds: int,
           region: str, seed: int) -> tuple[Contender, str]:
    """Among the search's top configs, the one whose paired speed-up over ``default`` has the highest
    lower bound, if it is above 1; else the default. Measured in its own fresh bench."""
    contenders = [Contender("default", default)] + [Contender(f"top{i + 1}", p) for i, p in enumerate(top)
                                                    if p != default]
    if len(contenders) == 1:
        return contenders[0], "the search found nothing but DeepEP's default"
    times = interleaved(bench, workload, contenders, rounds, region)
    ratios = [paired_speedup(times["default"], times[c.name], seed, (c.name, "default")) for c in contenders[1:]]
    best = max(ratios, key=lambda r: r.low)
    if not best.beyond_noise:
        return contenders[0], (f"none of the top {len(ratios)} beat the default beyond noise in the selection "
                               f"rounds (best {best.contender}: x{best.speedup:.3f}, CI low {best.low:.3f})")
    kept = next(c for c in contenders if c.name == best.contender)
    return kept, f"{best.contender} of the top {len(ratios)} (selection rounds: CI low {best.low:.3f})"


def compare(bench: Bench, workload: Workload, kept: Contender, default: TunePoint, engine: TunePoint,
            rounds: int, region: str) -> dict[str, list[float]]:
    """The report rounds, in a fresh bench: per-round times of the kept config, DeepEP's default
    chunks at the same SM count and the engine's default (its SM count, DeepEP's built-in table),
    by those three names (a point shared by two names is measured once)."""
    named = {"kept": kept.point, "default": default, "engine": engine}
    first: dict[TunePoint, str] = {}
    for name, point in named.items():
        first.setdefault(point, name)
    times = interleaved(bench, workload, [Contender(n, p) for p, n in first.items()], rounds, region)
    return {name: times[first[point]] for name, point in named.items()}


@dataclass(frozen=True)
class ConfirmSettings:
    """How a bucket is re-measured: interleaved rounds, the timed region, the bootstrap seed, and
    whether the bench may choose chunks (not where its chunk effects are unfitted)."""

    rounds: int
    region: str = "full"
    seed: int = 0
    choose_chunks: bool = True


def confirm_bucket(bench: Bench, workload: Workload, top: Sequence[TunePoint], default: TunePoint,
                   engine: TunePoint, settings: ConfirmSettings) -> Confirmed:
    """Select among ``top`` (one fresh bench), then measure the pick against both baselines (another
    fresh bench) and report only those rounds. A pick that does not beat DeepEP's default beyond
    noise there is dropped for the default. Below :data:`MIN_ROUNDS` rounds the protocol refuses,
    except on a noise-free (modelled) bench, where one round says all. Without ``choose_chunks`` (a
    bench whose chunk effects are not fitted) DeepEP's default chunks are kept."""
    region, seed = settings.region, settings.seed
    rounds = protocol_rounds(bench, settings.rounds)
    if settings.choose_chunks:
        kept, why = select(bench, workload, top, default, rounds, region, seed)
    else:
        kept, why = Contender("default", default), ("the bench's chunk effects are not fitted from measurements: "
                                                    "DeepEP's default chunks kept")
    times = compare(bench, workload, kept, default, engine, rounds, region)
    vs_default = paired_speedup(times["default"], times["kept"], seed + 1, (kept.name, "DeepEP's default chunks"))
    if kept.name != "default" and not vs_default.beyond_noise:
        why = f"{why}; in the report rounds {kept.name} showed {vs_default.words()}: DeepEP's default kept"
        kept, times = Contender("default", default), {**times, "kept": times["default"]}
        vs_default = paired_speedup(times["default"], times["kept"], seed + 1, ("default", "DeepEP's default chunks"))
    vs_engine = paired_speedup(times["engine"], times["kept"], seed + 2, (kept.name, "the engine's default"))
    return Confirmed(default.tokens, kept, vs_default, vs_engine,
                     {name: statistics.median(xs) for name, xs in times.items()}, why)
