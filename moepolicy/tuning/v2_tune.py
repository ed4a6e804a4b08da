"""DeepEP v2's own settings, measured: its SM count (0 asks for DeepEP's analytical count) and
``prefer_overlap_with_compute`` (off: DeepEP takes at least 64 SMs), for the serial MoE step.

v2 (``deep_ep.ElasticBuffer``) sizes its buffers and chunks itself; what an engine can set is the SM
count and these options (DeepEP#669 asks which to use). The candidates are few, so every one is
measured: in each token bucket, every candidate in turn over rotated rounds (the selection, which
claims nothing); the pick is then timed against DeepEP's default, (0, prefer overlap), in a fresh
worker group (the gate), and kept only where its paired per-round speed-up on the weighted buckets
(the objective) passes one exact sign-flip test at 2.5 % and no bucket is slower beyond noise (Holm
over the buckets). The figures recorded and printed come from a third, fresh worker group (the
report), whose rounds decided nothing; where DeepEP's default is kept, they are its own times.

Unverified here: no machine this project can use runs DeepEP v2 (it needs NCCL with GIN). The
search is tested against benches whose times are known; the live measurement is
:func:`moepolicy.tuning.v2_live.measure_v2_point`.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Optional, Protocol, Sequence

from moepolicy.deepep.kept import deepep_defaults
from moepolicy.deepep.settings import V2Settings
from moepolicy.errors import TuningError
from moepolicy.measure.rounds import (
    MIN_ROUNDS,
    Speedup,
    holm,
    paired_speedup,
    rotated_rounds,
    weighted_rounds,
)
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

    def settings(self) -> V2Settings:
        """What the policy keeps (``deepep.v2``)."""
        return V2Settings(self.num_sms, self.prefer_overlap)


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
    """What a v2 tune keeps and what backs it: the gate's weighted test (None where the selection
    picked DeepEP's default), each bucket's loss test, the report rounds' medians and speed-ups
    against DeepEP's default (None where the default is kept), the selection's weighted medians."""

    kept: V2Point
    vs_default: dict[int, Optional[Speedup]]  # report rounds, per bucket
    selection_us: dict[str, float]
    why: str
    gate: Optional[Speedup] = None
    losses: dict[int, Speedup] = field(default_factory=dict)
    report_us: dict[int, dict[str, float]] = field(default_factory=dict)
    report_weighted: Optional[Speedup] = None


def _rounds(
    bench: V2Bench,
    workload: Workload,
    buckets: Sequence[tuple[int, float]],
    points: Sequence[V2Point],
    rounds: int,
    fresh: bool,
) -> dict[int, dict[V2Point, list[float]]]:
    """Per bucket, every point over rotated rounds; in a fresh worker group (``fresh``) after a dropped
    warm-up pass."""
    if fresh:
        bench.restart()
    out = {}
    for tokens, _ in buckets:

        def time_once(p: V2Point, tokens: int = tokens) -> float:
            return bench.measure_v2(workload, p, tokens)

        if fresh:
            for p in points:
                time_once(p)
        out[tokens] = rotated_rounds(list(points), time_once, rounds)
    return out


def _gate(
    bench: V2Bench,
    workload: Workload,
    buckets: Sequence[tuple[int, float]],
    best: V2Point,
    rounds: int,
) -> tuple[V2Point, Optional[Speedup], dict[int, Speedup], str]:
    """The pick against DeepEP's default in a fresh group: one weighted test, no bucket slower."""
    times = _rounds(bench, workload, buckets, [DEFAULT, best], rounds, fresh=True)
    weights = [w for _, w in buckets]
    overall = paired_speedup(
        weighted_rounds([times[t][DEFAULT] for t, _ in buckets], weights),
        weighted_rounds([times[t][best] for t, _ in buckets], weights),
        0,
        (best.name, "DeepEP's default"),
    )
    losses = holm(
        [
            paired_speedup(times[t][DEFAULT], times[t][best], 0, (best.name, "DeepEP's default"))
            for t, _ in buckets
        ],
        "slower",
        "buckets",
    )
    losses_by = {t: s for (t, _), s in zip(buckets, losses)}
    lost = [t for t, s in losses_by.items() if s.slower]
    what = f"{best.name}, the fastest in the selection rounds, on the weighted buckets of the gate rounds: {overall.words()}"
    if overall.faster and not lost:
        return best, overall, losses_by, what
    tail = f"slower beyond noise at T={lost[0]}" if lost else "no gain beyond noise"
    return DEFAULT, overall, losses_by, f"{what}; {tail}: DeepEP's default kept"


def choose_v2(
    bench: V2Bench,
    workload: Workload,
    buckets: Sequence[tuple[int, float]],
    candidates: Sequence[V2Point],
    rounds: int,
    seed: int = 0,
) -> V2Choice:
    """Select among ``candidates`` (one worker group), gate the pick against DeepEP's default (a
    fresh one), report the kept setting (another fresh one); only the report's figures are recorded."""
    if not bench.noise_free and rounds < MIN_ROUNDS:
        raise TuningError(
            f"confirm_rounds must be at least {MIN_ROUNDS} for the paired test to claim anything, "
            f"got {rounds}",
            field="confirm_rounds",
        )
    rounds = 1 if bench.noise_free else rounds
    weighted = {point: 0.0 for point in candidates}
    for tokens, times in _rounds(
        bench, workload, buckets, candidates, rounds, fresh=False
    ).items():
        for point, xs in times.items():
            weighted[point] += dict(buckets)[tokens] * statistics.median(xs)
    best = min(candidates, key=weighted.__getitem__)
    selection = {point.name: round(us, 2) for point, us in weighted.items()}
    if best == DEFAULT:
        kept, overall, losses, why = (
            DEFAULT,
            None,
            {},
            "DeepEP's default was the fastest in the selection rounds",
        )
    else:
        kept, overall, losses, why = _gate(bench, workload, buckets, best, rounds)
    shown = [kept] + ([DEFAULT] if kept != DEFAULT else [])
    report = _rounds(bench, workload, buckets, shown, rounds, fresh=True)
    vs = {
        t: (
            paired_speedup(report[t][DEFAULT], report[t][kept], 0, (kept.name, "DeepEP's default"))
            if kept != DEFAULT
            else None
        )
        for t, _ in buckets
    }
    weights = [w for _, w in buckets]
    report_weighted = (
        None
        if kept == DEFAULT
        else paired_speedup(
            weighted_rounds([report[t][DEFAULT] for t, _ in buckets], weights),
            weighted_rounds([report[t][kept] for t, _ in buckets], weights),
            0,
            (kept.name, "DeepEP's default"),
        )
    )
    report_us = {
        t: {p.name: round(statistics.median(xs), 2) for p, xs in report[t].items()}
        for t, _ in buckets
    }
    return V2Choice(kept, vs, selection, why, overall, losses, report_us, report_weighted)


def v2_provenance(choice: V2Choice, rounds: int) -> dict:
    """What backs the kept ``deepep.v2`` settings (``deepep.provenance.v2`` in the policy): the
    selection's medians (what chose), the gate's tests (what decided), the report (what is claimed)."""
    return {
        "why": choice.why,
        "rounds": rounds,
        "selection_us": choice.selection_us,
        "selection_note": "selection rounds' weighted medians: what chose the pick, not a claim",
        "gate": None if choice.gate is None else choice.gate.to_doc(),
        "gate_losses": {str(t): s.to_doc() for t, s in choice.losses.items()},
        "report": {
            str(t): {
                "median_us": choice.report_us.get(t, {}),
                "vs_default": None if s is None else s.to_doc(),
            }
            for t, s in choice.vs_default.items()
        },
        "report_weighted_vs_default": None
        if choice.report_weighted is None
        else choice.report_weighted.to_doc(),
    }


# DeepEP v2's SM counts tried besides its analytical count (explicit even counts)
V2_SMS = (8, 16, 24, 32, 48, 64)


def tune_v2_plan(plan, bench: V2Bench, options, routing: str = "uniform"):
    """Measure DeepEP v2's settings for ``plan`` on ``bench`` (``options``: a ``TuneOptions``: its
    buckets, ``sms``, ``confirm_rounds``, seed, regime and command). Returns a
    ``runner.TuneResult`` like every tune: what is kept (``deepep``, with ``deepep.v2`` set) and the
    choice that backs it (``v2``); ``moepolicy.api.policy_document`` composes the policy."""
    from moepolicy.tuning.runner import TuneResult, workload_for

    workload = workload_for(plan, routing, options.regime)
    rounds = 1 if bench.noise_free else options.confirm_rounds
    try:
        choice = choose_v2(
            bench,
            workload,
            options.buckets,
            v2_candidates(options.sms or V2_SMS),
            rounds,
            options.seed,
        )
    finally:
        bench.close()
    provenance = {
        "source": "measured",
        "bench": "live-v2",
        "command": options.command,
        "v2": v2_provenance(choice, rounds),
        "note": "DeepEP v2 sizes its own buffers and chunks; deepep.v2 holds the measured settings; the legacy "
        "fields are unused",
    }
    kept = deepep_defaults(plan.target.deepep, plan.target.ep_size, "").with_provenance(
        provenance, v2=choice.kept.settings(), regime=options.regime
    )
    return TuneResult(
        deepep=kept,
        label="measured",
        region="full",
        num_sms=choice.kept.num_sms,
        why=choice.why,
        plan=plan,
        command=options.command,
        v2=choice,
    )
