"""``tune_plan``: a plan and a bench in, a :class:`TuneResult` out.

Workload from the plan → studies per (SM count, token bucket) → choice of ``num_sms`` → the policy
document. Nothing here prints or writes files: progress goes to the ``moepolicy.tuning`` logger
(as ``optuna.logging`` does), and the CLI renders the result and writes the document.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Union

from moepolicy.deepep.configs import ChunkConfig, default_configs, default_num_sms
from moepolicy.deepep.kept import KeptDeepEP, deepep_defaults
from moepolicy.deepep.settings import Bucket
from moepolicy.errors import TuningError
from moepolicy.schema.measured import OrderTiming
from moepolicy.tuning.bench import Bench, TunePoint, Workload
from moepolicy.tuning.confirm import (
    BucketCandidates,
    ConfirmSettings,
    modelled_protocol,
    protocol_rounds,
    run_protocol,
    time_both_orders,
)
from moepolicy.measure.rounds import TEST
from moepolicy.tuning import progress
from moepolicy.tuning.options import TuneOptions
from moepolicy.tuning.protocol import FAMILY_LEVELS, POLICY_LEVEL, decision_doc
from moepolicy.tuning.space import Space
from moepolicy.redact import redact_url
from moepolicy.tuning.storage import StorageFailed, make_storage, storage_failure
from moepolicy.tuning.study import (
    BucketResult,
    SmsResult,
    SubStudy,
    choose_sms,
    fingerprint,
    open_parent_study,
    pareto_front,
    tune_bucket,
)

if TYPE_CHECKING:  # the tuner reads a plan; it imports nothing of the planner or the document
    from moepolicy.planner import Plan

# what ends a search early: Ctrl-C or SIGTERM, or the study database failing
Interruption = Union[KeyboardInterrupt, StorageFailed]


log = logging.getLogger("moepolicy.tuning")


@dataclass(frozen=True)
class BucketOutcome:
    """One token bucket: the config kept and what the protocol found for it (``confirm.Confirmed``:
    the report rounds' speed-ups; ``confirm.ModelledBucket`` on the model bench)."""

    tokens: int
    point: TunePoint  # the config written to the policy
    confirmed: Any = None  # None: interrupted before the re-measurement


@dataclass(frozen=True)
class TuneResult:
    """What a tune found: the DeepEP settings it kept and what backs them (``deepep``) and the order
    timings measured at them, with the plan and command they were tuned for; the composer
    (``moepolicy.api.policy_document``) turns it into the policy document."""

    deepep: KeptDeepEP
    label: str  # measured | modelled | extrapolated
    region: str  # the timed region: full | cached
    num_sms: int
    why: str
    buckets: tuple[BucketOutcome, ...] = ()
    overlap: Any = None  # tuning.overlap.OverlapSearch with ``tune --overlap``
    overlap_gemm_note: str = ""
    # what ended the search early (Ctrl-C, SIGTERM, the study database failing)
    interruption: Optional[Interruption] = None
    # confirm.Protocol (live) or confirm.Modelled (model bench); None: not re-measured
    protocol: Any = None
    # both orders at the kept configs: measured facts for the rules
    timings: tuple[OrderTiming, ...] = ()
    plan: Optional[Plan] = None  # what was tuned (set by tune_plan)
    command: str = ""  # the command line, recorded in the document's provenance
    v2: Any = None  # v2_tune.V2Choice: what a DeepEP v2 tune measured and kept (its own settings)
    experts: Any = None  # schema.measured.ExpertChoice: the expert kernels' MoE steps compared

    @property
    def interrupted(self) -> bool:
        return self.interruption is not None


def workload_for(plan: Plan, routing: str, regime: str = "host") -> Workload:
    moe = plan.model.moe_layers
    if not moe:
        raise TuningError(
            f"{plan.model.name} has no MoE layers: nothing to dispatch, nothing to tune"
        )
    first = moe[0]
    fp8 = sum(
        1
        for lp in plan.layers
        if lp.decision.wire.dtype == "fp8_e4m3" and lp.decision.order == "quant_then_dispatch"
    )
    payload = "fp8" if fp8 * 2 >= len(moe) else "bf16"
    nvfp4 = sum(1 for lp in plan.layers if lp.decision.wire.dtype == "nvfp4")
    if nvfp4 * 2 >= len(moe):
        log.info(
            "the policy sends NVFP4 on %d of %d MoE layers; the benches time bf16 rows (they have no NVFP4 "
            "payload), so DeepEP's configs are chosen for about 4x the bytes NVFP4 sends",
            nvfp4,
            len(moe),
        )
    return Workload(
        first.hidden_size,
        first.num_experts,
        first.top_k,
        plan.target.ep_size,
        payload,
        routing,
        regime=regime,
        internode=plan.target.layout == "internode",
    )


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()


@dataclass(frozen=True)
class _Run:
    """One tune's fixed inputs, shared by its phases: search, re-measurement, the document's section."""

    plan: Plan
    bench: Bench
    workload: Workload
    options: TuneOptions
    region: str  # the timed region the objective scores
    label: str  # measured | modelled
    default: tuple[ChunkConfig, ChunkConfig]  # DeepEP's default chunks for this EP size
    study: str


SEARCH_NOTE = (
    "selected minima: the best of the search's single samples at each point (biased low by the "
    "selection); what proposed the configs, never a measurement of what is kept"
)


def _search_doc(b: BucketResult, num_sms: int, region: str) -> dict[str, Any]:
    m, d = b.best_measurement, b.default_measurement
    assert m is not None, "a searched bucket has its best measurement"
    out = {
        "note": SEARCH_NOTE,
        "num_sms": num_sms,
        "best_us": round(m.objective(region), 2),
        "dispatch_us": round(m.dispatch_us, 2),
        "dispatch_cached_us": round(m.dispatch_cached_us, 2),
        "combine_us": round(m.combine_us, 2),
        "trials": b.trials,
        "failed": b.failed,
    }
    if d is not None:
        out["default_us"] = round(d.objective(region), 2)
    return out


def _kept_deepep(
    run: _Run, chosen: SmsResult, results: list[SmsResult], kept: "KeptConfigs", interrupted: bool
) -> KeptDeepEP:
    """What the policy keeps: the kept SM count and chunks per bucket, per bucket what the protocol
    measured of the kept config (``measured``; ``modelled`` on the model bench) and, apart, the
    search's selected minima (``search``)."""
    buckets, evidences = [], []
    searched = [b for b in chosen.buckets if b.best is not None]
    for i, b in enumerate(searched):
        # open-ended, also when an interrupt left later buckets unsearched
        last = i == len(searched) - 1
        best = b.best
        assert best is not None  # searched
        point = kept.points.get(b.tokens, best)
        evidence = {}
        outcome = kept.outcomes.get(b.tokens)
        if outcome is not None:
            evidence["measured" if run.label == "measured" else "modelled"] = outcome.to_doc()
        evidence["search"] = _search_doc(b, chosen.num_sms, run.region)
        buckets.append(Bucket(None if last else b.tokens, point.dispatch, point.combine))
        evidences.append(evidence)
    if not buckets:
        raise TuningError("no bucket has a usable measurement")
    partial = None
    if interrupted:
        done = [r.num_sms for r in results if r.complete]
        partial = (
            f"interrupted: {len(done)} of {len(results)} SM counts started were "
            f"searched in every bucket ({', '.join(map(str, done)) or 'none'})"
        )
    return KeptDeepEP(
        kept.num_sms,
        tuple(buckets),
        _provenance(run, chosen, results, kept),
        tuple(evidences),
        regime=run.options.regime,
        partial=partial,
    )


def _provenance(
    run: _Run, chosen: SmsResult, results: list[SmsResult], kept: "KeptConfigs"
) -> dict[str, Any]:
    target, options, label, region = run.plan.target, run.options, run.label, run.region
    return {
        "source": label,
        "bench": "live" if label == "measured" else "model",
        "timed_region": region,
        "study": run.study,
        "storage": redact_url(options.storage),
        "searched_num_sms": chosen.num_sms,
        "kept_num_sms": kept.num_sms,
        "why": kept.why,
        "search": {
            "note": SEARCH_NOTE,
            "pareto": pareto_front(results, region),
            "scan": _scan(results, region),
        },
        "gpu": target.gpu,
        "ep_size": target.ep_size,
        "deepep": target.deepep.name,
        "command": options.command,
        "date": _now(),
        "protocol": kept.protocol,
    }


def _scan(results: list[SmsResult], region: str) -> list[dict[str, Any]]:
    """Every (SM count, bucket) the search measured: its best and DeepEP's default (search samples)."""
    rows = []
    for r in results:
        for b in r.buckets:
            if b.best_measurement is None:
                continue
            row = {
                "num_sms": r.num_sms,
                "tokens": b.tokens,
                "best_us": round(b.best_measurement.objective(region), 2),
            }
            if b.default_measurement is not None:
                row["default_us"] = round(b.default_measurement.objective(region), 2)
            rows.append(row)
    return rows


@dataclass(frozen=True)
class KeptConfigs:
    """What the policy keeps after the protocol: the SM count, a config per bucket, the protocol's
    outcome per bucket (``Confirmed`` live, ``ModelledBucket`` on the model bench), and why."""

    num_sms: int
    points: dict[int, TunePoint]  # tokens -> kept point
    outcomes: dict[int, Any]
    why: str
    protocol: dict[str, Any]
    result: Any = None  # confirm.Protocol or confirm.Modelled


def _candidates(run: _Run, chosen: SmsResult, engine_sms: int) -> list[BucketCandidates]:
    default = run.default
    return [
        BucketCandidates(
            b.tokens,
            b.weight,
            tuple(b.top),
            TunePoint(chosen.num_sms, b.tokens, *default),
            TunePoint(engine_sms, b.tokens, *default),
        )
        for b in chosen.buckets
        if b.best is not None
    ]


def _keep(
    run: _Run, chosen: SmsResult, why: str, engine_sms: int, chunks_fitted: bool, envelope=None
) -> KeptConfigs:
    """The protocol at the chosen SM count (``tuning.confirm``): on a live bench, selection, gate and
    report in three fresh benches; on the model bench, the model's answers against its held-out error."""
    bench, workload, options, region = run.bench, run.workload, run.options, run.region
    buckets = _candidates(run, chosen, engine_sms)
    engine = {"num_sms": engine_sms, "configs": "DeepEP's built-in table"}
    if bench.noise_free:
        hidden = workload.hidden
        modelled = modelled_protocol(
            bench,
            workload,
            buckets,
            lambda t, s: envelope.error_at(hidden, t, s) if envelope is not None else None,
            region,
        )
        protocol = {
            "engine_default": engine,
            "model": "the model bench's answers: no rounds, no interval; an SM "
            "change is claimed only where the modelled speed-up exceeds the model's held-out error there",
            "weighted_speedup": None if modelled.weighted is None else round(modelled.weighted, 4),
            "weighted_model_error": modelled.weighted_error,
        }
        return KeptConfigs(
            modelled.num_sms,
            {t: b.kept.point for t, b in modelled.buckets.items()},
            modelled.buckets,
            modelled.why,
            protocol,
            modelled,
        )
    rounds = protocol_rounds(bench, options.confirm_rounds)
    log.info(
        "re-measuring at %d SMs against the engine's default (%d SMs): selection, gate and report in fresh "
        "workers, %d balanced rounds each",
        chosen.num_sms,
        engine_sms,
        rounds,
    )
    done = run_protocol(
        bench, workload, buckets, ConfirmSettings(rounds, region, options.seed, chunks_fitted)
    )
    for t, c in done.buckets.items():
        if bench.functional:  # ranks sharing a GPU: what was kept, no figure
            log.info("  T=%d: kept %s (a functional run: no figure)", t, c.kept.name)
            continue
        log.info(
            "  T=%d: kept %s (%s); report: %s",
            t,
            c.kept.name,
            c.selection,
            c.vs_engine.words() if c.vs_engine is not None else "the engine's default",
        )
    protocol = {
        "rounds": rounds,
        "phases": "selection, gate, report: each in fresh workers after a dropped warm-up pass",
        "top_k": max((len(b.top) for b in buckets), default=0),
        "engine_default": engine,
        "fresh_bench": bench.restarts_fresh,
        "test": (
            f"{TEST} test on the per-round log-ratios; the SM count then the chunks, a fixed "
            f"sequence at {FAMILY_LEVELS['deepep']:.1%} (one side: gains)"
        ),
        "policy_level": (
            f"a policy with no true difference records any claim at most {POLICY_LEVEL:.0%} of the "
            f"time: {', '.join(f'{k} {v:.2%}' for k, v in FAMILY_LEVELS.items())}"
        ),
        "gate": {  # the decision's own statistics: what decided, never printed as a gain
            "sms": None if done.gate.sms is None else decision_doc(done.gate.sms),
            "moved": done.gate.moved,
        },
        "report_weighted_vs_engine": None if done.weighted is None else done.weighted.to_doc(),
    }
    return KeptConfigs(
        done.num_sms,
        {t: c.kept.point for t, c in done.buckets.items()},
        done.buckets,
        done.why,
        protocol,
        done,
    )


def sms_grid(space: Space, target, options: TuneOptions) -> list[int]:
    """The SM counts to try: ``options.sms`` when given (checked), else the space's grid under ``max_sms``."""
    if not options.sms:
        return space.sms_candidates(target.profile.sm_count, options.max_sms)
    bad = [s for s in options.sms if s <= 0 or s % 2 or s > target.profile.sm_count]
    if bad:
        raise TuningError(
            f"sms {bad[0]}: SM counts must be even, positive and at most "
            f"{target.profile.sm_count} on {target.gpu}"
        )
    return sorted(set(options.sms))


def overlap_gemm_kind(asked: str, plan: Plan) -> tuple[str, str]:
    """The stand-in expert GEMM for ``auto``: clustered where the experts run DeepGEMM (its multicast
    launches put 2-CTA clusters on the GPU at these sizes, and DeepEP's cooperative cluster launch
    fits beside those, not beside an unclustered persistent kernel), else the unclustered persistent
    kernel."""
    if asked != "auto":
        return asked, f"asked for {asked}"
    if "deepgemm" in plan.kernel_label:
        return "persistent-clustered", (
            "auto: the experts run DeepGEMM, which launches 2-CTA "
            "clusters (TMA multicast) at these sizes"
        )
    return "persistent", f"auto: the experts run {plan.kernel_label}, launched without clusters"


def _tune_overlap(
    plan: Plan,
    bench: Bench,
    workload: Workload,
    space: Space,
    options: TuneOptions,
    default: tuple[ChunkConfig, ChunkConfig],
) -> TuneResult:
    # only an overlap tune searches the split (three modules more)
    from moepolicy.tuning.overlap_search import OverlapSettings, search_overlap

    ov = options.overlap
    assert ov is not None, "called for an overlap tune only"
    if not hasattr(bench, "measure_overlap"):
        raise TuningError(
            "overlap tuning needs the live bench: it times DeepEP beside a confined GEMM on GPUs"
        )
    grid = sms_grid(space, plan.target, options)
    trials = options.trials_for(chunks_fitted=True)
    if ov.confirm_rounds < 1 or trials < 0:
        raise TuningError(
            f"overlap tuning needs confirm_rounds >= 1 and trials >= 0 "
            f"(got {ov.confirm_rounds} and {trials})"
        )
    gemm_kind, why_kind = overlap_gemm_kind(ov.gemm, plan)
    log.info("overlap: expert GEMM stand-in %s (%s)", gemm_kind, why_kind)
    try:
        settings = OverlapSettings(
            trials, ov.confirm_rounds, options.seed, gemm_kind, ov.confine, ov.order
        )
        found = search_overlap(
            plan, bench, workload, list(options.buckets), grid, default, settings
        )
    finally:
        bench.close()
    dispatch, combine = found.chunks
    last = len(options.buckets) - 1
    buckets = tuple(
        Bucket(None if i == last else tokens, dispatch, combine)
        for i, (tokens, _) in enumerate(options.buckets)
    )
    provenance = {
        "source": "measured",
        "bench": "live-overlap",
        "command": options.command,
        "date": _now(),
    }
    kept = KeptDeepEP(
        found.comm_sms,
        buckets,
        provenance,
        tuple({"measured": found.rows[t].to_doc()} for t, _ in options.buckets),
        schedule="overlapped",
        regime="gpu",
        overlap=found.summary(),
    )
    return TuneResult(
        deepep=kept,
        label="measured",
        region="overlapped",
        num_sms=found.comm_sms,
        why=found.why,
        overlap=found,
        overlap_gemm_note=f"{gemm_kind} ({why_kind})",
    )


def _extrapolated(plan: Plan, why: str, options: TuneOptions) -> KeptDeepEP:
    note = f"outside the model bench's measured envelope ({why}): DeepEP's default configs"
    return deepep_defaults(plan.target.deepep, plan.target.ep_size, note).with_provenance(
        {"source": "extrapolated", "note": note, "command": options.command}, regime=options.regime
    )


def study_name(plan: Plan, label: str, fingerprint: str) -> str:
    """The default study name: the model (its Hugging Face organisation kept, ``org--name``, so two
    fine-tunes of one name do not share a study), the target, the bench and the first 8 digits of
    the study's fingerprint, so that a tune of other buckets or another space in the same storage
    starts its own study instead of clashing with the tool's own name."""
    target = plan.target
    bench = "live" if label == "measured" else "model"
    return (
        f"{plan.model.name.replace('/', '--')}-{target.gpu}-ep{target.ep_size}-{target.backend}-"
        f"{bench}-{fingerprint[:8]}"
    )


def tune_plan(
    plan: Plan, bench: Bench, options: TuneOptions, space: Space, objective: dict
) -> TuneResult:
    """Tune DeepEP for ``plan`` on ``bench``; the result carries what was kept, as values (the policy
    document is composed from it by :func:`moepolicy.api.policy_document`, never here).

    The search (SM counts x token buckets, optuna) proposes; the re-measurement protocol
    (``tuning.confirm``) decides what is kept and what may be claimed. A ``KeyboardInterrupt`` ends
    the work early: the result is marked ``interrupted`` (a partial result) and holds what was found.
    """
    result = _tune(plan, bench, options, space, objective)
    return dataclasses.replace(result, plan=plan, command=options.command)


def _tune(
    plan: Plan, bench: Bench, options: TuneOptions, space: Space, objective: dict
) -> TuneResult:
    target = plan.target
    region = objective["timed_region"]
    label = "measured" if bench.source == "measured" else "modelled"
    workload = workload_for(plan, objective.get("routing", "uniform"), options.regime)
    envelope = bench.envelope(workload)
    sms_list = sms_grid(space, target, options) if options.overlap is None else []
    sms_list, outside = _calibrated(
        bench, workload, envelope, sms_list, [t for t, _ in options.buckets], target.gpu
    )
    if outside:
        log.info(
            "model bench: %s; the policy keeps DeepEP's defaults, labelled extrapolated", outside
        )
        extrapolated = _extrapolated(plan, outside, options)
        return TuneResult(
            deepep=extrapolated,
            label="extrapolated",
            region=region,
            num_sms=extrapolated.num_sms,
            why=extrapolated.provenance["note"],
        )
    storage = make_storage(options.storage)
    fingerprint = _fingerprint(plan, space, objective, label, workload, options)
    name = options.study or study_name(plan, label, fingerprint)
    open_parent_study(storage, name, fingerprint, where=redact_url(options.storage))
    default = default_configs(target.deepep, target.ep_size)
    if options.overlap is not None:
        return _tune_overlap(plan, bench, workload, space, options, default)
    chunks_fitted = envelope.chunks_fitted if envelope else True
    trials = options.trials_for(chunks_fitted)
    log.info(
        "tuning hidden=%d experts=%d top_k=%d payload=%s on %d SM counts x %d buckets x %d trials (%s region, "
        "%s regime)%s",
        workload.hidden,
        workload.num_experts,
        workload.top_k,
        workload.payload,
        len(sms_list),
        len(options.buckets),
        trials,
        region,
        options.regime,
        ""
        if chunks_fitted or options.trials
        else "; the model's chunk effects are not fitted: default chunks only",
    )
    options = dataclasses.replace(options, trials=trials)
    run = _Run(plan, bench, workload, options, region, label, default, name)
    results, interruption = _search(run, storage, space, sms_list)
    # an SM count whose buckets were not all searched is compared only when nothing else is left
    candidates = [r for r in results if r.complete] or results
    if interruption is not None and not any(
        b.best is not None for r in candidates for b in r.buckets
    ):
        raise interruption  # interrupted before anything was measured: there is nothing to write
    chosen, why = choose_sms(candidates, region, options.max_sms)
    kept, interruption = _protocol(run, chosen, why, envelope, interruption)
    timings = () if interruption else _both_orders(run, kept)
    bench.close()
    deepep = _partial_because(
        _kept_deepep(run, chosen, results, kept, interruption is not None), interruption
    )
    outcomes = tuple(BucketOutcome(t, p, kept.outcomes.get(t)) for t, p in kept.points.items())
    return TuneResult(
        deepep=deepep,
        label=label,
        region=region,
        num_sms=kept.num_sms,
        why=kept.why,
        buckets=outcomes,
        interruption=interruption,
        protocol=kept.result,
        timings=timings,
    )


def _partial_because(deepep: KeptDeepEP, interruption: Optional[BaseException]) -> KeptDeepEP:
    """A partial result ended by the study database failing says so (not "interrupted")."""
    if isinstance(interruption, StorageFailed) and deepep.partial is not None:
        reason = deepep.partial.replace(
            "interrupted", f"the study database failed ({interruption.cause})", 1
        )
        return dataclasses.replace(deepep, partial=reason)
    return deepep


def _protocol(
    run: _Run, chosen: SmsResult, why: str, envelope, interruption: Optional[Interruption]
) -> tuple[KeptConfigs, Optional[Interruption]]:
    """The protocol after a complete search; after an interrupt, nothing is claimed: the chosen SM
    count with DeepEP's default chunks, marked partial."""
    default, engine_sms = run.default, default_num_sms(run.plan.target.deepep)
    unclaimed = KeptConfigs(
        chosen.num_sms,
        {
            b.tokens: TunePoint(chosen.num_sms, b.tokens, *default)
            for b in chosen.buckets
            if b.best is not None
        },
        {},
        why,
        {},
    )
    if interruption is not None:
        return unclaimed, interruption
    chunks_fitted = envelope.chunks_fitted if envelope else True
    try:
        return _keep(run, chosen, why, engine_sms, chunks_fitted, envelope), None
    except KeyboardInterrupt as exc:
        log.info("interrupted during the re-measurement: no gain is claimed")
        return unclaimed, exc


def _calibrated(
    bench: Bench, workload: Workload, envelope, sms_list: list[int], tokens: list[int], gpu: str
) -> tuple[list[int], Optional[str]]:
    """The SM counts to try where the bench's answers are calibrated, or why none is (then the policy
    keeps DeepEP's defaults, labelled extrapolated). A bench that measures has no limits."""
    outside = bench.in_envelope(workload, gpu) or (
        envelope.problem(workload, tokens) if envelope else None
    )
    if outside or envelope is None:
        return sms_list, outside
    return _inside_sms(sms_list, envelope, workload.hidden, tokens)


def _inside_sms(
    sms_list: list[int], envelope, hidden: int, tokens: list[int]
) -> tuple[list[int], Optional[str]]:
    """The SM counts calibrated at every token bucket (said when some are dropped), or why none is."""
    if hasattr(envelope, "calibrated_sms"):
        inside = [
            s
            for s in sms_list
            if all(s in envelope.calibrated_sms(hidden, t, [s]) for t in tokens)
        ]
        where = (
            "calibrated at every token bucket ("
            + "; ".join(
                f"{t} tokens: {','.join(map(str, envelope.calibrated_sms(hidden, t, sms_list))) or 'none'}"
                for t in tokens
            )
            + ")"
        )
    else:
        lo, hi = envelope.sms
        inside = [s for s in sms_list if lo <= s <= hi]
        where = f"inside the calibrated {lo}-{hi}"
    dropped = [s for s in sms_list if s not in inside]
    if dropped:
        log.info(
            "model bench: SM counts %s are not %s and are not tried",
            ",".join(map(str, dropped)),
            where,
        )
    if not inside:
        return [], f"no SM count asked for is {where}"
    return inside, None


def _fingerprint(
    plan: Plan, space: Space, objective: dict, label: str, workload: Workload, options: TuneOptions
) -> str:
    target = plan.target
    return fingerprint(
        {
            "facts": plan.model.sha256(),
            "gpu": target.gpu,
            "ep": target.ep_size,
            "layout": target.layout,
            "deepep": target.deepep.name,
            "space": space.sha256,
            "objective": objective,
            "bench": "live" if label == "measured" else "model",
            "payload": workload.payload,
            "buckets": [list(b) for b in options.buckets],
            "max_buffer_mb": options.max_buffer_mb,
            "regime": options.regime,
        }
    )


def _search(
    run: _Run, storage, space: Space, sms_list: list[int]
) -> tuple[list[SmsResult], Optional[Interruption]]:
    """One optuna sub-study per (SM count, bucket); an interrupt ends it with what was measured."""
    bench, workload, options, name = run.bench, run.workload, run.options, run.study
    results: list[SmsResult] = []
    assert options.trials is not None, "the caller set the trials (TuneOptions.trials_for)"
    progress.phase("search", len(sms_list) * len(options.buckets) * options.trials)
    try:
        bench.start(workload)
        for num_sms in sms_list:
            max_recv = space.max_nvl_recv(
                num_sms, workload.hidden, workload.ep_size, options.max_buffer_bytes
            )
            if max_recv == 0:
                log.info(
                    "  sms %d: no receive capacity fits the %d MB buffer budget; skipped",
                    num_sms,
                    options.max_buffer_mb,
                )
                continue
            result = SmsResult(num_sms, [BucketResult(t, w) for t, w in options.buckets])
            results.append(result)
            for bucket in result.buckets:
                sub = SubStudy(
                    f"{name}/sms{num_sms}/t{bucket.tokens}",
                    num_sms,
                    options.trials,
                    run.default,
                    workload.internode,
                    max_recv,
                    run.region,
                    options.seed,
                )
                tune_bucket(storage, sub, bench, workload, space, bucket)
    except KeyboardInterrupt as exc:
        log.info("interrupted: keeping the best found so far")
        return results, exc
    except Exception as exc:  # noqa: BLE001 (the study database failing mid-tune ends it as an interrupt does)
        failed = storage_failure(exc, options.storage)
        if failed is None:
            raise
        log.info("the study database failed (%s): keeping the best found so far", failed.cause)
        return results, failed
    return results, None


def _both_orders(run: _Run, kept: KeptConfigs) -> tuple[OrderTiming, ...]:
    """Both orders at each bucket's kept config (live, fp8 payload only; ``confirm.time_both_orders``):
    measured facts for the rules where one order wins beyond noise. Every bucket or none."""
    bench, workload = run.bench, run.workload
    if run.label != "measured" or workload.payload != "fp8" or not kept.points:
        return ()
    try:
        return time_both_orders(
            bench,
            workload,
            dict(sorted(kept.points.items())),
            protocol_rounds(bench, run.options.confirm_rounds),
        )
    except Exception as exc:  # noqa: BLE001 (a failed extra measurement leaves the decisions unmeasured)
        log.info("  both-order measurement failed: %s; decisions stay unmeasured", exc)
        return ()
