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
from typing import Any, Optional

from moepolicy.deepep.configs import ChunkConfig, default_configs, default_num_sms
from moepolicy.errors import TuningError
from moepolicy.planner import (
    OrderTiming, Plan, buffer_bytes, build_document, default_deepep_section, with_measurements,
)
from moepolicy.tuning.bench import Bench, TunePoint, Workload
from moepolicy.tuning.confirm import ConfirmSettings, Confirmed, Contender, confirm_bucket, protocol_rounds
from moepolicy.tuning import progress
from moepolicy.tuning.options import TuneOptions
from moepolicy.tuning.space import Space
from moepolicy.redact import redact_url
from moepolicy.tuning.storage import StorageFailed, make_storage, storage_failure
from moepolicy.tuning.study import (BucketResult, SmsResult, SubStudy, choose_sms, fingerprint, open_parent_study,
                                     pareto_front, tune_bucket)

log = logging.getLogger("moepolicy.tuning")


@dataclass(frozen=True)
class BucketOutcome:
    """One token bucket of the chosen SM count: the config kept and, after the re-measurement
    protocol, its speed-ups over DeepEP's default chunks and the engine's default, with spreads."""

    tokens: int
    point: TunePoint  # the config written to the policy
    confirmed: Optional[Confirmed] = None  # None: interrupted before the re-measurement


@dataclass(frozen=True)
class TuneResult:
    """What a tune found, and the policy document that records it (not yet written)."""

    document: dict[str, Any]
    label: str  # measured | modelled | extrapolated
    region: str  # the timed region: full | cached
    num_sms: int
    why: str
    buckets: tuple[BucketOutcome, ...] = ()
    overlap: Any = None  # tuning.overlap.OverlapSearch with ``tune --overlap``
    overlap_gemm_note: str = ""
    interruption: Optional[KeyboardInterrupt] = None  # what ended the search early (Ctrl-C, SIGTERM)

    @property
    def interrupted(self) -> bool:
        return self.interruption is not None


def workload_for(plan: Plan, routing: str, regime: str = "host") -> Workload:
    moe = plan.model.moe_layers
    if not moe:
        raise TuningError(f"{plan.model.name} has no MoE layers: nothing to dispatch, nothing to tune")
    first = moe[0]
    fp8 = sum(1 for lp in plan.layers if lp.decision.wire.get("dtype") == "fp8_e4m3"
              and lp.decision.order == "quant_then_dispatch")
    payload = "fp8" if fp8 * 2 >= len(moe) else "bf16"
    nvfp4 = sum(1 for lp in plan.layers if lp.decision.wire.get("dtype") == "nvfp4")
    if nvfp4 * 2 >= len(moe):
        log.info("the policy sends NVFP4 on %d of %d MoE layers; the benches time bf16 rows (they have no NVFP4 "
                 "payload), so DeepEP's configs are chosen for about 4x the bytes NVFP4 sends", nvfp4, len(moe))
    return Workload(first.hidden_size, first.num_experts, first.top_k, plan.target.ep_size, payload, routing,
                    regime=regime, internode=plan.target.layout == "internode")


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


def _section(run: _Run, chosen: SmsResult, results: list[SmsResult], kept: "KeptConfigs",
             interrupted: bool) -> dict[str, Any]:
    """The policy's DeepEP section: the kept SM count and chunks per bucket, what the search measured
    and, per bucket, the re-measurement that backs (or refuses) each claim."""
    plan, label, region, options, study = run.plan, run.label, run.region, run.options, run.study
    target = plan.target
    buckets, configs = [], []
    searched = [b for b in chosen.buckets if b.best is not None]
    for i, b in enumerate(searched):
        last = i == len(searched) - 1  # open-ended, also when an interrupt left later buckets unsearched
        point = kept.points.get(b.tokens, b.best)
        configs += [point.dispatch, point.combine]
        m, d = b.best_measurement, b.default_measurement
        measured = {"search_best_us": round(m.objective(region), 2), "dispatch_us": round(m.dispatch_us, 2),
                    "dispatch_cached_us": round(m.dispatch_cached_us, 2), "combine_us": round(m.combine_us, 2),
                    "trials": b.trials, "failed": b.failed}
        if d is not None:
            measured["default_total_us"] = round(d.objective(region), 2)
        if b.tokens in kept.confirmed:
            measured["confirm"] = kept.confirmed[b.tokens].to_doc()
        buckets.append({"max_tokens": None if last else b.tokens, "dispatch": point.dispatch.to_doc(),
                        "combine": point.combine.to_doc(), "measured": measured})
    if not buckets:
        raise TuningError("no bucket has a usable measurement")
    moe = plan.model.moe_layers
    nvl, rdma = buffer_bytes(target, max(layer.hidden_size for layer in moe),
                             max(layer.num_experts for layer in moe), kept.num_sms, configs)
    provenance = {
        "source": label, "bench": "live" if label == "measured" else "model", "timed_region": region,
        "study": study, "storage": redact_url(options.storage), "chosen_num_sms": kept.num_sms, "why": kept.why,
        "pareto": pareto_front(results, region), "scan": _scan(results, region), "gpu": target.gpu,
        "ep_size": target.ep_size,
        "deepep": target.deepep.name, "command": options.command, "date": _now(),
        "protocol": kept.protocol,
    }
    section = {"num_sms": kept.num_sms, "num_nvl_bytes": nvl, "num_rdma_bytes": rdma, "buckets": buckets,
               "provenance": provenance, "schedule": "serial", "regime": options.regime}
    if interrupted:
        done = [r.num_sms for r in results if r.complete]
        section["partial"] = {"reason": (f"interrupted: {len(done)} of {len(results)} SM counts started were "
                                         f"searched in every bucket ({', '.join(map(str, done)) or 'none'})")}
    return section


def _scan(results: list[SmsResult], region: str) -> list[dict[str, Any]]:
    """Every (SM count, bucket) the search measured: its best and DeepEP's default (search samples)."""
    rows = []
    for r in results:
        for b in r.buckets:
            if b.best_measurement is None:
                continue
            row = {"num_sms": r.num_sms, "tokens": b.tokens, "best_us": round(b.best_measurement.objective(region), 2)}
            if b.default_measurement is not None:
                row["default_us"] = round(b.default_measurement.objective(region), 2)
            rows.append(row)
    return rows


@dataclass(frozen=True)
class KeptConfigs:
    """What the policy keeps after the protocol: the SM count, a config per bucket, and why."""

    num_sms: int
    points: dict[int, TunePoint]  # tokens -> kept point
    confirmed: dict[int, Confirmed]
    why: str
    protocol: dict[str, Any]


def _keep(run: _Run, chosen: SmsResult, why: str, engine_sms: int, chunks_fitted: bool) -> KeptConfigs:
    """The re-measurement protocol at the chosen SM count, per bucket (``tuning.confirm``): the search's
    top configs against DeepEP's default chunks, then the pick against the default and the engine's
    default (``engine_sms`` SMs, DeepEP's built-in table), in fresh benches. Where no bucket beats
    the engine's default beyond noise, the engine's default is kept."""
    bench, workload, default, options, region = run.bench, run.workload, run.default, run.options, run.region
    rounds = protocol_rounds(bench, options.confirm_rounds)
    protocol = {"rounds": rounds, "top_k": len(chosen.buckets[0].top) if chosen.buckets else 0,
                "engine_default": {"num_sms": engine_sms, "configs": "DeepEP's built-in table"},
                "fresh_bench": bench.restarts_fresh,
                "claim": "95% bootstrap lower bound of the paired per-round speed-up above 1"}
    if bench.noise_free:
        protocol["note"] = "modelled: the bench has no noise, so one round; the model's own error is not in the interval"
    points, confirmed = {}, {}
    per_bucket = [((len(b.top) + 1) if chunks_fitted else 0) + 3 for b in chosen.buckets if b.best]  # select, report
    progress.phase("re-measure", sum(per_bucket) * rounds)
    for i, b in enumerate(chosen.buckets):
        if b.best is None:
            continue
        log.info("re-measuring T=%d: the top %d configs and DeepEP's default at %d SMs, then the pick beside the "
                 "engine's default (%d SMs), %d interleaved round(s) each", b.tokens, len(b.top), chosen.num_sms,
                 engine_sms, rounds)
        d = TunePoint(chosen.num_sms, b.tokens, *default)
        e = TunePoint(engine_sms, b.tokens, *default)
        c = confirm_bucket(bench, workload, b.top, d, e, ConfirmSettings(rounds, region, options.seed + 101 * i,
                                                                         chunks_fitted))
        points[b.tokens], confirmed[b.tokens] = c.kept.point, c
        log.info("  T=%d: kept %s (%s); %s; %s", b.tokens, c.kept.name, c.selection, c.vs_default.words(),
                 c.vs_engine.words())
    if confirmed and not any(c.vs_engine.beyond_noise for c in confirmed.values()):
        why = (f"no gain beyond noise over the engine's default ({engine_sms} SMs, DeepEP's table) in any bucket: "
               "the engine's default kept")
        points = {t: TunePoint(engine_sms, t, *default) for t in points}
        confirmed = {t: dataclasses.replace(c, kept=Contender("engine", points[t]),
                                            selection=f"{c.selection}; {why}") for t, c in confirmed.items()}
        return KeptConfigs(engine_sms, points, confirmed, why, protocol)
    return KeptConfigs(chosen.num_sms, points, confirmed, why, protocol)


def sms_grid(space: Space, target, options: TuneOptions) -> list[int]:
    """The SM counts to try: ``options.sms`` when given (checked), else the space's grid under ``max_sms``."""
    if not options.sms:
        return space.sms_candidates(target.profile.sm_count, options.max_sms)
    bad = [s for s in options.sms if s <= 0 or s % 2 or s > target.profile.sm_count]
    if bad:
        raise TuningError(f"sms {bad[0]}: SM counts must be even, positive and at most "
                          f"{target.profile.sm_count} on {target.gpu}")
    return sorted(set(options.sms))


def overlap_gemm_kind(asked: str, plan: Plan) -> tuple[str, str]:
    """The stand-in expert GEMM for ``auto``: clustered where the experts run DeepGEMM (its multicast
    launches put 2-CTA clusters on the GPU at these sizes, and DeepEP's cooperative cluster launch
    fits beside those, not beside an unclustered persistent kernel), else the unclustered persistent
    kernel."""
    if asked != "auto":
        return asked, f"asked for {asked}"
    if "deepgemm" in plan.kernel_label:
        return "persistent-clustered", ("auto: the experts run DeepGEMM, which launches 2-CTA "
                                        "clusters (TMA multicast) at these sizes")
    return "persistent", f"auto: the experts run {plan.kernel_label}, launched without clusters"


def _tune_overlap(plan: Plan, bench: Bench, workload: Workload, space: Space, options: TuneOptions,
                  default: tuple[ChunkConfig, ChunkConfig]) -> TuneResult:
    from moepolicy.tuning.overlap_search import OverlapSettings, search_overlap

    ov = options.overlap
    if not hasattr(bench, "measure_overlap"):
        raise TuningError("overlap tuning needs the live bench: it times DeepEP beside a confined GEMM on GPUs")
    grid = sms_grid(space, plan.target, options)
    trials = options.trials_for(chunks_fitted=True)
    if ov.confirm_rounds < 1 or trials < 0:
        raise TuningError(f"overlap tuning needs confirm_rounds >= 1 and trials >= 0 "
                          f"(got {ov.confirm_rounds} and {trials})")
    gemm_kind, why_kind = overlap_gemm_kind(ov.gemm, plan)
    log.info("overlap: expert GEMM stand-in %s (%s)", gemm_kind, why_kind)
    try:
        settings = OverlapSettings(trials, ov.confirm_rounds, options.seed, gemm_kind, ov.confine, ov.order)
        found = search_overlap(plan, bench, workload, list(options.buckets), grid, default, settings)
    finally:
        bench.close()
    c = found.comm_sms
    dispatch, combine = found.chunks
    buckets_doc = [{"max_tokens": None if i == len(options.buckets) - 1 else tokens, "dispatch": dispatch.to_doc(),
                    "combine": combine.to_doc(), "measured": found.rows[tokens].to_doc()}
                   for i, (tokens, _) in enumerate(options.buckets)]
    moe = plan.model.moe_layers
    nvl, rdma = buffer_bytes(plan.target, max(x.hidden_size for x in moe), max(x.num_experts for x in moe), c,
                             [dispatch, combine])
    section = {"num_sms": c, "num_nvl_bytes": nvl, "num_rdma_bytes": rdma, "buckets": buckets_doc,
               "provenance": {"source": "measured", "bench": "live-overlap", "command": options.command,
                              "date": _now()},
               "overlap": found.summary(), "schedule": "overlapped", "regime": "gpu"}
    doc = build_document(plan, deepep=section, command=options.command)
    return TuneResult(document=doc, label="measured", region="overlapped", num_sms=c, why=found.why,
                      overlap=found, overlap_gemm_note=f"{gemm_kind} ({why_kind})")


def _extrapolated(plan: Plan, why: str, options: TuneOptions) -> dict[str, Any]:
    section = default_deepep_section(plan)
    section["provenance"] = {"source": "extrapolated", "note": f"outside the model bench's measured "
                             f"envelope ({why}): DeepEP's default configs", "command": options.command}
    section["regime"] = options.regime
    return section


def study_name(plan: Plan, label: str) -> str:
    target = plan.target
    bench = "live" if label == "measured" else "model"
    return f"{plan.model.name.split('/')[-1]}-{target.gpu}-ep{target.ep_size}-{target.backend}-{bench}"


def tune_plan(plan: Plan, bench: Bench, options: TuneOptions, space: Space, objective: dict) -> TuneResult:
    """Tune DeepEP for ``plan`` on ``bench``; the result carries the policy document to write.

    The search (SM counts x token buckets, optuna) proposes; the re-measurement protocol
    (``tuning.confirm``) decides what is kept and what may be claimed. A ``KeyboardInterrupt`` ends
    the work early: the result is marked ``interrupted`` (a partial result) and holds what was found.
    """
    target = plan.target
    region = objective["timed_region"]
    label = "measured" if bench.source == "measured" else "modelled"
    workload = workload_for(plan, objective.get("routing", "uniform"), options.regime)
    envelope = bench.envelope(workload)
    sms_list = sms_grid(space, target, options) if options.overlap is None else []
    outside = bench.in_envelope(workload, target.gpu) or (
        envelope.problem(workload, [t for t, _ in options.buckets]) if envelope else None)
    if envelope and not outside:
        sms_list, outside = _inside_sms(sms_list, envelope)
    if outside:
        log.info("model bench: %s; the policy keeps DeepEP's defaults, labelled extrapolated", outside)
        doc = build_document(plan, deepep=_extrapolated(plan, outside, options), command=options.command)
        section = doc["deepep"]
        return TuneResult(document=doc, label="extrapolated", region=region, num_sms=section["num_sms"],
                          why=section["provenance"]["note"])
    storage = make_storage(options.storage)
    name = options.study or study_name(plan, label)
    open_parent_study(storage, name, _fingerprint(plan, space, objective, label, workload, options))
    default = default_configs(target.deepep, target.ep_size)
    if options.overlap is not None:
        return _tune_overlap(plan, bench, workload, space, options, default)
    chunks_fitted = envelope.chunks_fitted if envelope else True
    trials = options.trials_for(chunks_fitted)
    log.info("tuning hidden=%d experts=%d top_k=%d payload=%s on %d SM counts x %d buckets x %d trials (%s region, "
             "%s regime)%s", workload.hidden, workload.num_experts, workload.top_k, workload.payload, len(sms_list),
             len(options.buckets), trials, region, options.regime,
             "" if chunks_fitted or options.trials else "; the model's chunk effects are not fitted: default chunks only")
    options = dataclasses.replace(options, trials=trials)
    run = _Run(plan, bench, workload, options, region, label, default, name)
    results, interruption = _search(run, storage, space, sms_list)
    # an SM count whose buckets were not all searched is compared only when nothing else is left
    candidates = [r for r in results if r.complete] or results
    if interruption is not None and not any(b.best is not None for r in candidates for b in r.buckets):
        raise interruption  # interrupted before anything was measured: there is nothing to write
    chosen, why = choose_sms(candidates, region, options.max_sms)
    kept = KeptConfigs(chosen.num_sms, {}, {}, why, {})
    if interruption is None:
        try:
            kept = _keep(run, chosen, why, default_num_sms(target.deepep), chunks_fitted)
        except KeyboardInterrupt as exc:
            interruption = exc
            log.info("interrupted during the re-measurement: no gain is claimed")
            kept = KeptConfigs(chosen.num_sms, {b.tokens: TunePoint(chosen.num_sms, b.tokens, *default)
                                                for b in chosen.buckets}, {}, why, {})
    timings = () if interruption else _both_orders(bench, workload, chosen, kept, label)
    bench.close()
    section = _partial_because(_section(run, chosen, results, kept, interruption is not None), interruption)
    doc = build_document(with_measurements(plan, timings), deepep=section, command=options.command)
    outcomes = tuple(BucketOutcome(t, p, kept.confirmed.get(t)) for t, p in kept.points.items())
    return TuneResult(document=doc, label=label, region=region, num_sms=kept.num_sms, why=kept.why,
                      buckets=outcomes, interruption=interruption)


def _partial_because(section: dict[str, Any], interruption: Optional[BaseException]) -> dict[str, Any]:
    """A partial result ended by the study database failing says so (not "interrupted")."""
    if isinstance(interruption, StorageFailed):
        section["partial"]["reason"] = section["partial"]["reason"].replace(
            "interrupted", f"the study database failed ({interruption.cause})", 1)
    return section


def _inside_sms(sms_list: list[int], envelope) -> tuple[list[int], Optional[str]]:
    """The SM counts inside the bench's calibrated range (said when some are dropped), or why none is."""
    lo, hi = envelope.sms
    inside = [s for s in sms_list if lo <= s <= hi]
    dropped = [s for s in sms_list if s not in inside]
    if dropped:
        log.info("model bench: SM counts %s are outside the calibrated %d-%d and are not tried",
                 ",".join(map(str, dropped)), lo, hi)
    if not inside:
        return [], f"no SM count asked for is inside the calibrated {lo}-{hi}"
    return inside, None


def _fingerprint(plan: Plan, space: Space, objective: dict, label: str, workload: Workload,
                 options: TuneOptions) -> str:
    target = plan.target
    return fingerprint({"facts": plan.model.sha256(), "gpu": target.gpu, "ep": target.ep_size,
                        "layout": target.layout, "deepep": target.deepep.name, "space": space.sha256,
                        "objective": objective, "bench": "live" if label == "measured" else "model",
                        "payload": workload.payload, "buckets": [list(b) for b in options.buckets],
                        "max_buffer_mb": options.max_buffer_mb, "regime": options.regime})


def _search(run: _Run, storage, space: Space, sms_list: list[int]) -> tuple[list[SmsResult], Optional[KeyboardInterrupt]]:
    """One optuna sub-study per (SM count, bucket); an interrupt ends it with what was measured."""
    bench, workload, options, name = run.bench, run.workload, run.options, run.study
    results: list[SmsResult] = []
    progress.phase("search", len(sms_list) * len(options.buckets) * options.trials)
    try:
        bench.start(workload)
        for num_sms in sms_list:
            max_recv = space.max_nvl_recv(num_sms, workload.hidden, workload.ep_size, options.max_buffer_bytes)
            if max_recv == 0:
                log.info("  sms %d: no receive capacity fits the %d MB buffer budget; skipped",
                         num_sms, options.max_buffer_mb)
                continue
            result = SmsResult(num_sms, [BucketResult(t, w) for t, w in options.buckets])
            results.append(result)
            for bucket in result.buckets:
                sub = SubStudy(f"{name}/sms{num_sms}/t{bucket.tokens}", num_sms, options.trials, run.default,
                               workload.internode, max_recv, run.region, options.seed)
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


def _both_orders(bench: Bench, workload: Workload, chosen: SmsResult, kept: KeptConfigs,
                 label: str) -> tuple[OrderTiming, ...]:
    """Both orders timed at each bucket's kept config (live, fp8 payload only); measured facts for
    the rules. Every bucket or none: a missing bucket would leave its order undecided."""
    if label != "measured" or workload.payload != "fp8":
        return ()
    both = dataclasses.replace(workload, both_orders=True)
    timings = []
    for b in chosen.buckets:
        if b.best is None:
            return ()
        try:
            orders = bench.measure(both, kept.points.get(b.tokens, b.best)).orders
            timings.append(OrderTiming(b.tokens, orders["quant_then_dispatch"], orders["dispatch_then_quant"]))
        except Exception as exc:  # noqa: BLE001 (a failed extra measurement leaves the decisions unmeasured)
            log.info("  both-order measurement at T=%d failed: %s; decisions stay unmeasured", b.tokens, exc)
            return ()
    return tuple(timings)
