"""DeepEP v2's own settings, measured: its SM count (0 asks for DeepEP's analytical count) and
``prefer_overlap_with_compute`` (off: DeepEP takes at least 64 SMs), for the serial MoE step.

v2 (``deep_ep.ElasticBuffer``) sizes its buffers and chunks itself; what an engine can set is the SM
count and these options (DeepEP#669 asks which to use). The candidates are few, so every one is
measured: in each token bucket, every candidate in turn over rotated rounds (the selection); the pick
is then re-measured against DeepEP's default, (0, prefer overlap), in a fresh worker group, and kept
only where the 95 % lower bound of its paired per-round speed-up on the weighted buckets (the
objective, one test) is above 1; each bucket's speed-up is reported beside it.

Unverified here: no machine this project can use runs DeepEP v2 (it needs NCCL with GIN). The
search is tested against benches whose times are known; the live measurement is
:func:`moepolicy.tuning.v2_live.measure_v2_point`.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Optional, Protocol, Sequence

from moepolicy.errors import TuningError
from moepolicy.measure.rounds import MIN_ROUNDS, Speedup, paired_speedup, rotated_rounds
from moepolicy.tuning.bench import Workload


@dataclass(frozen=True)
class V2Point:
    """One v2 setting: ``num_sms`` 0 is DeepEP's analytical count."""

    num_sms: int = 0
    prefer_overlap: bool = True

    @property
    def name(self) -> str:
        sms = "analytical SMs" if self.num_sms == 0 else f"{self.num_sms} SMs"
        return f"{sms}, prefer overlap {'on' if self.prefer_overlap else 'off'}"

    def to_doc(self) -> dict:
        """The policy's ``deepep.v2`` section."""
        return {"num_sms": self.num_sms, "prefer_overlap_with_compute": self.prefer_overlap,
                "allow_multiple_reduction": True}


DEFAULT = V2Point()  # ElasticBuffer's defaults at dd758ca


class V2Bench(Protocol):
    noise_free: bool

    def measure_v2(self, workload: Workload, point: V2Point, tokens: int) -> float:
        """Dispatch + combine of ``tokens`` per rank at ``point``, in µs (the slowest rank's median)."""

    def restart(self) -> None:
        """The next measurement runs in fresh processes (a new ElasticBuffer)."""

    def close(self) -> None: ...


def v2_candidates(sms: Sequence[int]) -> list[V2Point]:
    """DeepEP's default, its analytical count without the overlap preference, and each explicit even
    count (with an explicit count the preference changes nothing of the SMs)."""
    explicit = sorted({s for s in sms if s > 0 and s % 2 == 0})
    return [DEFAULT, V2Point(0, False), *(V2Point(s, True) for s in explicit)]


@dataclass(frozen=True)
class V2Choice:
    """What a v2 tune keeps, the report rounds' speed-up per bucket against DeepEP's default (None
    where the default itself was picked), the selection's weighted medians, and why."""

    kept: V2Point
    vs_default: dict[int, Optional[Speedup]]
    selection_us: dict[str, float]
    why: str


def choose_v2(bench: V2Bench, workload: Workload, buckets: Sequence[tuple[int, float]],
              candidates: Sequence[V2Point], rounds: int, seed: int = 0) -> V2Choice:
    """Select among ``candidates`` (one worker group), then report the pick against DeepEP's default
    in a fresh one; only those rounds back a claim."""
    if not bench.noise_free and rounds < MIN_ROUNDS:
        raise TuningError(f"confirm_rounds must be at least {MIN_ROUNDS} for a 95% interval, got {rounds}",
                          field="confirm_rounds")
    rounds = 1 if bench.noise_free else rounds
    weighted = {point: 0.0 for point in candidates}
    for tokens, weight in buckets:
        times = rotated_rounds(list(candidates), lambda p: bench.measure_v2(workload, p, tokens), rounds)
        for point, xs in times.items():
            weighted[point] += weight * statistics.median(xs)
    best = min(candidates, key=weighted.__getitem__)
    selection = {point.name: round(us, 2) for point, us in weighted.items()}
    if best == DEFAULT:
        return V2Choice(DEFAULT, {t: None for t, _ in buckets}, selection,
                        "DeepEP's default was the fastest in the selection rounds")
    bench.restart()
    vs: dict[int, Optional[Speedup]] = {}
    totals = {DEFAULT: [0.0] * rounds, best: [0.0] * rounds}  # the weighted objective, round by round
    for i, (tokens, weight) in enumerate(buckets):
        times = rotated_rounds([DEFAULT, best], lambda p: bench.measure_v2(workload, p, tokens), rounds)
        vs[tokens] = paired_speedup(times[DEFAULT], times[best], seed + i, (best.name, "DeepEP's default"))
        for point in totals:
            totals[point] = [t + weight * x for t, x in zip(totals[point], times[point])]
    overall = paired_speedup(totals[DEFAULT], totals[best], seed + len(buckets), (best.name, "DeepEP's default"))
    if not overall.beyond_noise:
        return V2Choice(DEFAULT, vs, selection, f"{best.name}, the fastest in the selection rounds, on the weighted "
                                                f"buckets of the report rounds: {overall.words()}; DeepEP's default kept")
    return V2Choice(best, vs, selection, f"{best.name}, the fastest in the selection rounds, on the weighted buckets "
                                         f"of the report rounds: {overall.words()}")


def v2_provenance(choice: V2Choice, rounds: int) -> dict:
    """What backs the kept ``deepep.v2`` settings (``deepep.provenance.v2`` in the policy)."""
    return {"why": choice.why, "rounds": rounds, "selection_us": choice.selection_us,
            "vs_default": {str(t): (s.to_doc() if s is not None else None) for t, s in choice.vs_default.items()}}


# DeepEP v2's SM counts tried besides its analytical count (explicit even counts)
V2_SMS = (8, 16, 24, 32, 48, 64)


def tune_v2_plan(plan, bench: V2Bench, options, routing: str = "uniform") -> tuple[dict, V2Choice]:
    """Measure DeepEP v2's settings for ``plan`` on ``bench`` (``options``: a ``TuneOptions``: its
    buckets, ``sms``, ``confirm_rounds``, seed, regime and command); the policy document and the choice."""
    from moepolicy.planner import build_document, default_deepep_section
    from moepolicy.tuning.runner import workload_for

    workload = workload_for(plan, routing, options.regime)
    rounds = 1 if bench.noise_free else options.confirm_rounds
    try:
        choice = choose_v2(bench, workload, options.buckets, v2_candidates(options.sms or V2_SMS), rounds,
                           options.seed)
    finally:
        bench.close()
    section = default_deepep_section(plan)
    section["v2"] = choice.kept.to_doc()
    section["provenance"] = {
        "source": "measured", "bench": "live-v2", "command": options.command, "v2": v2_provenance(choice, rounds),
        "note": "DeepEP v2 sizes its own buffers and chunks; deepep.v2 holds the measured settings; the legacy "
                "fields are unused",
    }
    section["regime"] = options.regime
    return build_document(plan, deepep=section, command=options.command), choice
