"""DeepEP v2's own settings, measured: its SM count (0 asks for DeepEP's analytical count) and
``prefer_overlap_with_compute`` (off: DeepEP takes at least 64 SMs), for the serial MoE step.

v2 (``deep_ep.ElasticBuffer``) sizes its buffers and chunks itself; what an engine can set is the SM
count and these options (DeepEP#669 asks which to use). The candidates are few, so every one is
measured, as one joint stage of the protocol (``tuning.protocol``): in each token bucket, every
candidate beside DeepEP's default over balanced rounds (the selection, which claims nothing); the
pick is then timed against DeepEP's default, (0, prefer overlap), in a fresh worker group (the
gate), and kept only where its paired per-round speed-up on the weighted buckets (the objective)
passes one exact test at the ``deepep`` family's level (2.5 %) and no bucket is slower beyond noise
(Holm over the buckets). The figures recorded and printed come from a third, fresh worker group (the
report), whose rounds decided nothing; where DeepEP's default is kept, they are its own times.

Unverified here: no machine this project can use runs DeepEP v2 (it needs NCCL with GIN). The
search is tested against benches whose times are known; the live measurement is
:func:`moepolicy.tuning.v2_live.measure_v2_point`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Protocol, Sequence

from moepolicy.deepep.kept import deepep_defaults
from moepolicy.deepep.settings import V2Settings
from moepolicy.errors import TuningError
from moepolicy.measure.rounds import MIN_ROUNDS, Speedup, balanced_rounds
from moepolicy.tuning.bench import Workload
from moepolicy.tuning.protocol import FAMILY_LEVELS, Figure, Option, Stage, decision_doc, run


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
    """What a v2 tune keeps and what backs it: the gate's weighted test and each bucket's loss test
    (the decision's statistics: None where nothing was contested), the report rounds' medians and
    figures against DeepEP's default (None where the default is kept)."""

    kept: V2Point
    vs_default: dict[int, Optional[Figure]]  # report rounds, per bucket
    selection: str  # what the selection proposed, in words
    why: str
    gate: Optional[Speedup] = None
    losses: dict[int, Speedup] = field(default_factory=dict)
    report_us: dict[int, dict[str, float]] = field(default_factory=dict)
    report_weighted: Optional[Figure] = None
    selection_us: dict[str, float] = field(default_factory=dict)  # weighted medians: what chose


class V2Timer:
    """The protocol's timer on a :class:`V2Bench`: each phase in a fresh worker group, each bucket's
    rounds after a dropped warm-up pass."""

    def __init__(self, bench: V2Bench, workload: Workload):
        self.bench, self.workload = bench, workload

    def fresh(self, phase: str) -> None:
        self.bench.restart()

    def rounds(self, arms: Mapping[int, Sequence[V2Point]], rounds: int) -> dict:
        out = {}
        for tokens, points in arms.items():

            def time_once(p: V2Point, tokens: int = tokens) -> float:
                return self.bench.measure_v2(self.workload, p, tokens)

            out[tokens] = balanced_rounds(list(points), time_once, rounds, warm_up=True)
        return out


def _option(point: V2Point, buckets: Sequence[tuple[int, float]], label: str = "") -> Option:
    return Option(point.name, {t: point for t, _ in buckets}, label)


def choose_v2(
    bench: V2Bench,
    workload: Workload,
    buckets: Sequence[tuple[int, float]],
    candidates: Sequence[V2Point],
    rounds: int,
    seed: int = 0,
) -> V2Choice:
    """The protocol (``tuning.protocol``) with one joint stage: select among ``candidates``, gate the
    pick against DeepEP's default, report the kept setting, each in a fresh worker group; only the
    report's figures are recorded or printed."""
    if not bench.noise_free and rounds < MIN_ROUNDS:
        raise TuningError(
            f"confirm_rounds must be at least {MIN_ROUNDS} for the paired test to claim anything, "
            f"got {rounds}",
            field="confirm_rounds",
        )
    rounds = 1 if bench.noise_free else rounds
    default = _option(DEFAULT, buckets, "DeepEP's default")
    stage = Stage(
        "DeepEP v2's settings",
        default,
        tuple(_option(p, buckets) for p in candidates if p != DEFAULT),
    )
    done = run([stage], V2Timer(bench, workload), dict(buckets), rounds, FAMILY_LEVELS["deepep"])
    gated, first = done.stages[0], buckets[0][0]
    kept = done.kept[first].arms[first]
    pick = gated.pick[first].arms[first]
    selection = (
        "DeepEP's default was the fastest in the selection rounds"
        if pick == DEFAULT
        else f"{pick.name}, the fastest in the selection rounds"
    )
    chose = done.selection_us
    return V2Choice(
        kept,
        {t: done.figures[t].get(default.name) for t, _ in buckets},
        selection,
        _why(selection, gated, kept, done.weighted.get(default.name)),
        gated.overall,
        gated.tests,
        {t: {p.name: round(us, 2) for p, us in done.times_us[t].items()} for t, _ in buckets},
        done.weighted.get(default.name),
        {p.name: round(sum(w * chose[t][p] for t, w in buckets), 2) for p in chose.get(first, {})},
    )


def _why(selection: str, gated, kept: V2Point, weighted: Optional[Figure]) -> str:
    if not gated.tested:
        return selection
    head = f"{selection}; against DeepEP's default in the gate: {gated.words()}"
    if kept == DEFAULT:
        return f"{head}: DeepEP's default kept"
    return f"{head}: kept" + ("" if weighted is None else f"; {weighted.words()}")


def v2_provenance(choice: V2Choice, rounds: int) -> dict:
    """What backs the kept ``deepep.v2`` settings (``deepep.provenance.v2`` in the policy): what the
    selection proposed, the gate's statistics (what decided), the report (what is claimed)."""
    return {
        "why": choice.why,
        "rounds": rounds,
        "selection": choice.selection,
        "selection_us": choice.selection_us,
        "selection_note": "selection rounds' weighted medians: what chose the pick, not a claim",
        "gate": None if choice.gate is None else decision_doc(choice.gate),
        "gate_losses": {str(t): decision_doc(s) for t, s in choice.losses.items()},
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
