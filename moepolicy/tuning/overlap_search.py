"""``tune --overlap``: choose DeepEP's SM share and send chunks when communication overlaps the
expert GEMMs.

A measurement starts dispatch + combine on ``c`` SMs and the experts' GEMM on the other SMs together,
for every token bucket, and times the pair in each launch order (medians of repeats, with spread;
``measure/overlapped_step.py``). The order the split is chosen for is ``order``: ``gemm-first`` (the GEMM
holds its SMs when DeepEP launches; on H200 DeepEP's cooperative cluster launch then often waits for
the whole unclustered GEMM, depending on the split), ``comm-first`` (with the full dispatch's host
wait for its receive counts), ``comm-first-no-wait`` (the dispatch given ``num_worst_tokens``, no host
wait), or the ``mean`` of the first two. The search has three phases:

1. split scan: every candidate ``c`` (and vLLM's 20) with DeepEP's default chunks;
2. joint search: an optuna TPE study over (``c``, dispatch send chunk, combine send chunk) that
   starts from the scan's results; failures are FAIL trials; a config is never measured twice;
3. selection: the best config of each of the three best splits and vLLM's split (20 SMs, default
   chunks) re-measured side by side for ``rounds`` rounds, the launch order rotating each round; the
   pick is the best weighted median over those rounds. It proposes; it claims nothing.
4. gate, in a fresh worker group: the pick and vLLM's split over rotated rounds; the pick is kept
   only where its paired speed-up on the weighted buckets passes one exact sign-flip test at 2.5 %
   and no bucket is slower beyond noise (Holm over the buckets); otherwise vLLM's split is kept.
5. report, in another fresh worker group: the kept split beside vLLM's over rotated rounds; every
   figure written or printed (medians, paired speed-ups with their 95 % intervals) comes from these
   rounds, which decided nothing.

Each bucket's report also carries the bound: the lowest floor, max(comm alone, GEMM alone), of every
config measured, set beside vLLM's split (``split_bound``). No split of the grid overlaps below its
floor (beyond the measurement spread), so when that ratio is near 1 the split has little to give,
whatever the search finds.
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass
from typing import NamedTuple, Optional

from moepolicy.deepep.configs import ChunkConfig
from moepolicy.deepep.engines import VLLM_DBO_COMM_SMS
from moepolicy.measure.gemm_shape import GemmShape
from moepolicy.errors import TuningError
from moepolicy.measure.rounds import Speedup, round_orders
from moepolicy.tuning import progress
from moepolicy.tuning.bench import TrialFailed, TunePoint, Workload
from moepolicy.tuning.overlap_report import OverlapBucketRow, SplitBound, SplitTimes
from moepolicy.tuning.protocol import FAMILY_LEVELS, Figure, Option, Stage, decision_doc, run

log = logging.getLogger("moepolicy.tuning")
CHUNK_CANDIDATES = {"dispatch": (16, 20, 24, 32), "combine": (6, 8, 10, 12, 16)}

Chunks = tuple[ChunkConfig, ChunkConfig]  # (dispatch, combine)


class SplitConfig(NamedTuple):
    """One point of the overlap search: DeepEP's SM share and its (dispatch, combine) chunks."""

    comm_sms: int
    chunks: Chunks


CONFIRM_SPLITS = 3  # splits whose best config is re-measured beside vLLM's
# which launch order the split is chosen for (all are measured), and the pair of ``measure_overlap``'s
# row that times it: the GEMM enqueued first; DeepEP's calls enqueued first, with the full dispatch's
# host wait for its receive counts, or without it (``num_worst_tokens``); ``mean``: of the first two
ORDER_ROWS = {
    "gemm-first": "overlapped",
    "comm-first": "overlapped_comm_first",
    "comm-first-no-wait": "overlapped_comm_first_no_wait",
}
ORDERS = (*ORDER_ROWS, "mean")


def _field(order: str) -> str:
    """A launch order as it prefixes the report's fields: ``comm-first`` → ``comm_first``."""
    return order.replace("-", "_")


def comm_key(order: str) -> str:
    """The communication alone that bounds a pair in ``order`` (its floor is max(this, GEMM alone)):
    the dispatch without the host wait for ``comm-first-no-wait``, the full dispatch otherwise."""
    return "comm_no_wait" if order == "comm-first-no-wait" else "comm"


def objective_us(row: dict, order: str) -> float:
    """One measurement's overlapped time under ``order`` (``measure_overlap``'s row)."""
    parts = ("gemm-first", "comm-first") if order == "mean" else (order,)
    missing = [part for part in parts if ORDER_ROWS[part] not in row]
    if missing:
        raise TrialFailed(
            f"launch order {order} needs the {' and '.join(missing)} launch order measured; "
            f"this bench did not measure it"
        )
    return sum(row[ORDER_ROWS[part]]["median_us"] for part in parts) / len(parts)


def gemm_shape(
    plan, workload: Workload, tokens: int, kind: str = "persistent", confine: str = "grid"
) -> GemmShape:
    first = plan.model.moe_layers[0]
    intermediate = first.moe_intermediate_size or 2048
    return GemmShape(
        rows=tokens * workload.top_k,
        hidden=workload.hidden,
        out=2 * intermediate,
        kind=kind,
        confine=confine,
    )


def with_send_chunks(default: Chunks, dispatch: int, combine: int) -> Chunks:
    return default[0].with_nvl_send(dispatch), default[1].with_nvl_send(combine)


class _Measurer:
    """Measures a config over all buckets; remembers the first measurement of each config."""

    def __init__(
        self,
        plan,
        bench,
        workload: Workload,
        buckets: list[tuple[int, float]],
        gemm_kind: str,
        confine: str,
        order: str = "gemm-first",
    ):
        if order not in ORDERS:
            raise ValueError(f"launch order must be one of {ORDERS}, got {order!r}")
        self.plan, self.bench, self.workload, self.gemm_kind, self.confine = (
            plan,
            bench,
            workload,
            gemm_kind,
            confine,
        )
        self.order = order
        self.buckets, self.weight = buckets, dict(buckets)
        self.seen: dict[SplitConfig, Optional[dict[int, dict]]] = {}

    def fresh(self, config: SplitConfig) -> Optional[dict[int, dict]]:
        c, chunks = config
        rows = {}
        for tokens, _ in self.buckets:
            try:
                rows[tokens] = self.bench.measure_overlap(
                    self.workload,
                    TunePoint(c, tokens, *chunks),
                    gemm_shape(self.plan, self.workload, tokens, self.gemm_kind, self.confine),
                )
            except TrialFailed as exc:
                log.info(
                    f"  overlap c={c} chunks {chunks[0][0]}/{chunks[1][0]} T={tokens}: FAIL ({exc})"
                )
                return None
        return rows

    def once(self, config: SplitConfig) -> Optional[dict[int, dict]]:
        if config not in self.seen:
            self.seen[config] = self.fresh(config)
        return self.seen[config]

    def weighted(self, rows: dict[int, dict]) -> float:
        return sum(self.weight[t] * objective_us(rows[t], self.order) for t in rows)


def _say(config: SplitConfig, rows: dict[int, dict]) -> None:
    c, chunks = config
    for tokens, r in rows.items():
        comm_first = (
            f", comm first {r['overlapped_comm_first']['median_us']:.1f}"
            if "overlapped_comm_first" in r
            else ""
        )
        waited = "; DeepEP waited for the GEMM" if r.get("deepep_waited_for_gemm") else ""
        log.debug(
            f"  overlap c={c:3} chunks {chunks[0][0]:2}/{chunks[1][0]:2} T={tokens:5}: overlapped "
            f"{r['overlapped']['median_us']:8.1f} us (comm {r['comm']['median_us']:.1f}, GEMM "
            f"{r['gemm']['median_us']:.1f} on {r['gemm_sms']} SMs, serial {r['serial']['median_us']:.1f}"
            f"{comm_first}){waited}"
        )


def scan_splits(m: _Measurer, splits: list[int], default: Chunks) -> dict[int, float]:
    out = {}
    progress.phase("overlap splits", len(splits))
    for c in splits:
        rows = m.once(SplitConfig(c, default))
        progress.advance()
        if rows is not None:
            _say(SplitConfig(c, default), rows)
            out[c] = m.weighted(rows)
    return out


def joint_search(m: _Measurer, splits: list[int], default: Chunks, trials: int, seed: int) -> None:
    """optuna TPE over (c, dispatch chunk, combine chunk), told the split scan's results first."""
    import optuna

    dispatch = sorted(set(CHUNK_CANDIDATES["dispatch"]) | {default[0][0]})
    combine = sorted(set(CHUNK_CANDIDATES["combine"]) | {default[1][0]})
    dists: dict[str, optuna.distributions.BaseDistribution] = {
        "c": optuna.distributions.CategoricalDistribution(splits),
        "dispatch": optuna.distributions.CategoricalDistribution(dispatch),
        "combine": optuna.distributions.CategoricalDistribution(combine),
    }
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        direction="minimize", sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=3)
    )
    for (c, chunks), rows in m.seen.items():
        if c not in splits:  # a split that failed in the scan is not searched
            continue
        params = {"c": c, "dispatch": chunks[0][0], "combine": chunks[1][0]}
        state = (
            optuna.trial.TrialState.COMPLETE if rows is not None else optuna.trial.TrialState.FAIL
        )
        study.add_trial(
            optuna.trial.create_trial(
                params=params,
                distributions=dists,
                state=state,
                value=m.weighted(rows) if rows is not None else None,
            )
        )
    progress.phase("overlap joint search", trials)
    for i in range(trials):
        progress.advance()
        trial = study.ask(dists)
        config = SplitConfig(
            trial.params["c"],
            with_send_chunks(default, trial.params["dispatch"], trial.params["combine"]),
        )
        new = config not in m.seen
        rows = m.once(config)
        if rows is None:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            continue
        study.tell(trial, m.weighted(rows))
        if new:  # a search's figure: said at --log-level debug only
            log.debug(
                f"  joint {i + 1}/{trials}: c={config.comm_sms} chunks {config.chunks[0][0]}/{config.chunks[1][0]}: "
                f"weighted overlapped {m.weighted(rows):.1f} us"
            )


def best_per_split(
    measured: dict[SplitConfig, float], exclude: SplitConfig, splits: int
) -> list[SplitConfig]:
    """The best config of each of the ``splits`` best splits (a lucky reading of one split cannot
    crowd the others out of the confirmation)."""
    best: dict[int, SplitConfig] = {}
    for cfg in sorted(measured, key=measured.__getitem__):
        if cfg != exclude and cfg.comm_sms not in best:
            best[cfg.comm_sms] = cfg
    return list(best.values())[:splits]


def measured_rounds(
    m: _Measurer, configs: list[SplitConfig], rounds: int, warm_up: bool = False
) -> dict[SplitConfig, list[dict[int, dict]]]:
    """Every config measured once per round (at every bucket), in the carry-over-balanced orders of
    ``measure.rounds.round_orders``, for ``rounds`` rounds; with ``warm_up``, one pass first whose
    measurements are dropped (a fresh group's first calls pay its start-up). A round in which any
    config failed is dropped for all, so the i-th runs of two configs stay side by side."""
    cycle = round_orders(len(configs))
    out: dict[SplitConfig, list[dict[int, dict]]] = {cfg: [] for cfg in configs}
    for i in cycle[-1] if warm_up else ():
        m.fresh(configs[i])
    for r in range(rounds):
        fresh = {configs[i]: m.fresh(configs[i]) for i in cycle[r % len(cycle)]}
        progress.advance()
        got = {cfg: rows for cfg, rows in fresh.items() if rows is not None}
        if len(got) < len(fresh):
            log.info(f"  round {r + 1}/{rounds}: dropped (a measurement failed)")
            continue
        for cfg in configs:
            out[cfg].append(got[cfg])
        # a deciding round's figures are never printed as results: --log-level debug only
        log.debug(
            f"  round {r + 1}/{rounds}: "
            + ", ".join(
                f"c={cfg.comm_sms} {cfg.chunks[0][0]}/{cfg.chunks[1][0]}: {m.weighted(got[cfg]):.1f} us"
                for cfg in configs
            )
        )
    return out


def _fresh_group(bench) -> None:
    restart = getattr(bench, "restart", None)
    if restart is not None:
        restart()


class OverlapTimer:
    """The protocol's timer for the split: one measurement times a config at every bucket; each
    phase in a fresh worker group, each group of rounds after a dropped warm-up pass. The last
    rounds' full rows stay (``rows``): the report's bucket rows are built from them."""

    def __init__(self, m: _Measurer):
        self.m, self.phase = m, ""
        self.rows: dict[SplitConfig, list[dict[int, dict]]] = {}

    def fresh(self, phase: str) -> None:
        log.info(f"overlap {phase} (fresh workers)")
        self.phase = phase
        _fresh_group(self.m.bench)

    def rounds(self, arms, rounds: int) -> dict:
        configs = list(dict.fromkeys(cfg for cfgs in arms.values() for cfg in cfgs))
        progress.phase(f"overlap {self.phase}", rounds)
        self.rows = measured_rounds(self.m, configs, rounds, warm_up=True)
        if not all(self.rows[cfg] for cfg in configs):
            raise TuningError(
                f"the overlap {self.phase} rounds could not be measured: every round had a failed "
                "measurement"
            )
        return {
            t: {
                cfg: [objective_us(run[t], self.m.order) for run in self.rows[cfg]] for cfg in cfgs
            }
            for t, cfgs in arms.items()
        }


@dataclass(frozen=True)
class SplitGate:
    """The gate's decision: the split kept, the weighted test behind it and each bucket's loss test
    (the decision's own statistics, never a gain), and what it decided in words."""

    kept: SplitConfig
    test: Optional[Speedup]
    losses: dict[int, Speedup]
    why: str

    def to_doc(self) -> dict:
        return {
            "test": None if self.test is None else decision_doc(self.test),
            "losses": {str(t): decision_doc(s) for t, s in self.losses.items()},
            "why": self.why,
        }


def _median(runs: list[dict[int, dict]], tokens: int, key: str) -> float:
    return statistics.median(run[tokens][key]["median_us"] for run in runs)


def _split_times(runs: list[dict[int, dict]], tokens: int, order: str) -> SplitTimes:
    """One split's medians over its rounds, in every launch order the bench measured."""
    mine = [objective_us(run[tokens], order) for run in runs]
    by_order = {
        _field(o): round(_median(runs, tokens, key), 1)
        for o, key in ORDER_ROWS.items()
        if all(key in run[tokens] for run in runs)
    }
    no_wait = (
        _median(runs, tokens, "comm_no_wait")
        if all("comm_no_wait" in run[tokens] for run in runs)
        else None
    )
    waited = (
        sum(bool(run[tokens]["deepep_waited_for_gemm"]) for run in runs)
        if all("deepep_waited_for_gemm" in run[tokens] for run in runs)
        else None
    )
    first = runs[0][tokens]
    return SplitTimes(
        overlapped_us=statistics.median(mine),
        spread_us=(min(mine), max(mine)),
        comm_us=_median(runs, tokens, comm_key(order)),
        gemm_us=_median(runs, tokens, "gemm"),
        gemm_kind=first.get("gemm_kind"),
        gemm_sms=first.get("gemm_sms"),
        by_order=by_order,
        comm_no_wait_us=no_wait,
        deepep_waited_rounds=waited,
    )


def bucket_row(
    runs: list[dict[int, dict]],
    vllm_runs: Optional[list[dict[int, dict]]],
    tokens: int,
    order: str = "gemm-first",
    bound: Optional[SplitBound] = None,
    rounds_from: str = "report",
    family: int = 1,
) -> OverlapBucketRow:
    """The kept config's row at ``tokens``, beside vLLM's split measured in the same rounds."""
    mine = [objective_us(run[tokens], order) for run in runs]
    theirs = [objective_us(run[tokens], order) for run in vllm_runs] if vllm_runs else []
    return OverlapBucketRow(
        objective=order,
        rounds=len(mine),
        chosen=_split_times(runs, tokens, order),
        serial_us=_median(runs, tokens, "serial"),
        comm_region="no-wait" if comm_key(order) == "comm_no_wait" else "full",
        comm_end_us=_median(runs, tokens, "overlapped_comm_end"),
        gemm_end_us=_median(runs, tokens, "overlapped_gemm_end"),
        vllm=_split_times(vllm_runs, tokens, order) if vllm_runs else None,
        per_round_vs_vllm=tuple(round(a / b, 4) for a, b in zip(mine, theirs)),
        bound=bound,
        rounds_from=rounds_from,
        family=family,
    )


def split_bound(m: _Measurer, tokens: int) -> SplitBound:
    """The lowest floor, max(communication alone, GEMM alone), among every config measured at ``tokens``.
    A split cannot overlap faster than its floor (beyond the measurement spread), so no split of the
    grid beats this however well it overlaps: set beside vLLM's split it says how much any split could
    win (measured, from the search's first measurement of each config)."""
    floors = []
    for (c, _), rows in m.seen.items():
        if rows is not None:
            comm, gemm = (
                rows[tokens][comm_key(m.order)]["median_us"],
                rows[tokens]["gemm"]["median_us"],
            )
            floors.append((max(comm, gemm), c, "GEMM" if gemm >= comm else "communication"))
    floor, c, side = min(floors)
    return SplitBound(floor, c, side)


@dataclass(frozen=True)
class OverlapSearch:
    """What ``search_overlap`` found: the split, its chunks, and one row per bucket."""

    comm_sms: int
    gemm_sms: int
    chunks: Chunks
    rows: dict[int, OverlapBucketRow]  # tokens -> row
    gemm: str
    order: str
    gemm_fallback: Optional[str]
    splits_us: dict[int, float]  # each split's best weighted time in the search
    configs_measured: int
    confirmed_us: dict[str, float]  # the selection rounds' weighted medians (what chose the pick)
    why: str
    gate: Optional[SplitGate] = None
    # the report rounds: weighted, the kept split vs vLLM's
    report_vs_vllm: Optional[Figure] = None

    def summary(self) -> dict:
        """The document's ``deepep.overlap`` section."""
        out = {
            "comm_sms": self.comm_sms,
            "gemm_sms": self.gemm_sms,
            "gemm": self.gemm,
            "gemm_fallback": self.gemm_fallback,
            "order": self.order,
            "splits_us": self.splits_us,
            "splits_note": "search samples: each split's best weighted time (selected minima, not a claim)",
            "configs_measured": self.configs_measured,
            "confirmed_us": self.confirmed_us,
            "confirmed_note": "selection rounds' weighted medians: what chose the pick, not a claim",
            "gate": None if self.gate is None else self.gate.to_doc(),
            "report_vs_vllm_split": None
            if self.report_vs_vllm is None
            else self.report_vs_vllm.to_doc(),
            "why": self.why,
        }
        return {k: v for k, v in out.items() if v is not None}


@dataclass(frozen=True)
class OverlapSettings:
    """How the overlap search runs: its TPE trials, confirmation rounds and seed, the expert GEMM
    stand-in (kind, how it is confined) and the launch order the split is chosen for."""

    trials: int = 12
    rounds: int = 15
    seed: int = 0
    gemm_kind: str = "persistent"
    confine: str = "grid"
    order: str = "gemm-first"


def search_overlap(
    plan,
    bench,
    workload: Workload,
    buckets: list[tuple[int, float]],
    grid: list[int],
    default: Chunks,
    settings: OverlapSettings = OverlapSettings(),
) -> OverlapSearch:
    trials, rounds, order = settings.trials, settings.rounds, settings.order
    splits = sorted(set(grid) | {VLLM_DBO_COMM_SMS})
    m = _Measurer(plan, bench, workload, buckets, settings.gemm_kind, settings.confine, order)
    log.info(f"overlap phase 1: {len(splits)} splits with DeepEP's default chunks")
    scanned = scan_splits(m, splits, default)
    if not scanned:
        raise TrialFailed("no split produced a measurement for every bucket")
    log.info(f"overlap phase 2: joint search of split and send chunks, {trials} trials")
    joint_search(m, sorted(scanned), default, trials, settings.seed)
    measured = {cfg: m.weighted(rows) for cfg, rows in m.seen.items() if rows is not None}
    vllm = SplitConfig(VLLM_DBO_COMM_SMS, default)
    candidates = best_per_split(measured, exclude=vllm, splits=CONFIRM_SPLITS) + (
        [vllm] if vllm in measured else []
    )
    return _select_gate_report(m, candidates, measured, vllm, rounds)


def _name(cfg: SplitConfig) -> str:
    return f"c={cfg.comm_sms} chunks {cfg.chunks[0][0]}/{cfg.chunks[1][0]}"


def _split_stage(
    m: _Measurer,
    candidates: list[SplitConfig],
    measured: dict[SplitConfig, float],
    vllm: SplitConfig,
) -> Stage:
    """One joint stage: the candidates against vLLM's split; where vLLM's split failed in the search,
    against the search's best candidate (then nothing is claimed over vLLM's split)."""
    buckets = [t for t, _ in m.buckets]

    def option(cfg: SplitConfig, label: str = "") -> Option:
        return Option(_name(cfg), {t: cfg for t in buckets}, label)

    if vllm in measured:
        base_cfg, label = vllm, f"vLLM's split ({VLLM_DBO_COMM_SMS} SMs)"
    else:
        base_cfg = min(candidates, key=measured.__getitem__)
        label = f"the search's best ({_name(base_cfg)})"
    others = tuple(option(c) for c in candidates if c != base_cfg)
    return Stage("the split", option(base_cfg, label), others)


def _select_gate_report(
    m: _Measurer,
    candidates: list[SplitConfig],
    measured: dict[SplitConfig, float],
    vllm: SplitConfig,
    rounds: int,
) -> OverlapSearch:
    """Phases 3-5: the protocol (``tuning.protocol.run``), each phase in a fresh worker group."""
    buckets, order = m.buckets, m.order
    stage = _split_stage(m, candidates, measured, vllm)
    timer = OverlapTimer(m)
    log.info(f"overlap phases 3-5 (selection, gate, report): {rounds} balanced rounds each")
    done = run([stage], timer, dict(buckets), rounds, FAMILY_LEVELS["deepep"])
    gated, first = done.stages[0], buckets[0][0]
    kept, base = done.kept[first].arms[first], stage.baseline.arms[first]
    pick = gated.pick[first].arms[first]
    decided = SplitGate(
        kept, gated.overall, gated.tests, _gate_words(gated, pick, base, vllm in measured)
    )
    report = timer.rows
    vllm_runs = report.get(vllm) if kept != vllm and vllm in measured else None
    first_row = report[kept][0][first]
    rows = {
        t: bucket_row(report[kept], vllm_runs, t, order, split_bound(m, t), family=len(buckets))
        for t, _ in buckets
    }
    splits_us: dict[int, float] = {}
    for (cc, _), value in measured.items():
        splits_us[cc] = round(min(value, splits_us.get(cc, float("inf"))), 1)
    chose = done.selection_us
    weighted = done.weighted.get(stage.baseline.name)
    return OverlapSearch(
        comm_sms=kept.comm_sms,
        gemm_sms=first_row["gemm_sms"],
        chunks=kept.chunks,
        rows=rows,
        gemm=first_row.get("gemm_kind", "fp8" if first_row.get("gemm_fp8") else "bf16"),
        order=order,
        gemm_fallback=first_row.get("gemm_fallback"),
        splits_us=splits_us,
        configs_measured=len(measured),
        confirmed_us={
            _name(cfg): round(sum(m.weight[t] * chose[t][cfg] for t, _ in buckets), 1)
            for cfg in chose.get(first, {})
        },
        why=(
            f"picked: the fastest ({order} launch order) in {rounds} balanced selection rounds "
            f"among the best configs of the {CONFIRM_SPLITS} best splits of {len(measured)} configs "
            f"and vLLM's {VLLM_DBO_COMM_SMS}-SM split; kept: {decided.why}"
            + ("" if weighted is None else f"; {weighted.words()}")
        ),
        gate=decided,
        report_vs_vllm=weighted if vllm in measured else None,
    )


def _gate_words(gated, pick: SplitConfig, base: SplitConfig, vllm_measured: bool) -> str:
    """What the gate decided, in words (no figure)."""
    if not vllm_measured:
        return (
            f"vLLM's split failed to measure in the search: {_name(base)} (the search's best) or a "
            "config faster beyond noise than it kept, no gain over vLLM's split claimed"
        )
    if pick == base:
        return "vLLM's split was the fastest in the selection rounds"
    what = f"c={pick.comm_sms} against vLLM's split in the gate (fresh workers): {gated.words()}"
    return what if gated.claimed(next(iter(gated.kept))) else f"{what}: vLLM's split kept"
