"""Run the search: num_sms outer, chunk configs per token bucket, one optuna study each.

The tuning process is the only optuna client (ask/tell). Each sub-study is named
``<study>/sms<S>/t<T>`` in the same storage; the parent study records a fingerprint of the model,
target, search space, objective and bench, and a resume that does not match is refused. DeepEP's
default config is enqueued first, so a tune never reports worse than the default it measured;
an effective config already measured in a sub-study is told its earlier value without measuring.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import socket
import threading
from dataclasses import dataclass, field
from typing import Any, Optional

import logging

from moepolicy.errors import TuningError
from moepolicy.tuning import progress
from moepolicy.tuning.interrupts import deferred
from moepolicy.tuning.bench import Bench, Measurement, TrialFailed, TunePoint, Workload
from moepolicy.tuning.space import Space
from moepolicy.tuning.trial_storage import fail_stale_trials, fail_trial, heartbeat, trial_id

log = logging.getLogger("moepolicy.tuning")


@dataclass
class BucketResult:
    tokens: int
    weight: float
    best: Optional[TunePoint] = None
    best_measurement: Optional[Measurement] = None
    top: tuple[TunePoint, ...] = ()  # the best few distinct configs of the search, best first
    default_measurement: Optional[Measurement] = None
    trials: int = 0
    failed: int = 0
    deduplicated: int = 0


@dataclass
class SmsResult:
    num_sms: int
    buckets: list[BucketResult] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Every bucket has a measured best config."""
        return all(b.best_measurement is not None for b in self.buckets)

    def weighted(self, region: str) -> float:
        """Weighted time over the buckets measured (all of them unless a run was interrupted)."""
        done = [
            (b.weight, b.best_measurement) for b in self.buckets if b.best_measurement is not None
        ]
        if not done:
            return math.inf
        return sum(weight * m.objective(region) for weight, m in done)


def make_sampler(seed: int):
    """TPE with 3 random start-up trials; constant_liar keeps parallel workers' proposals apart.
    Chosen by replaying samplers over live-measured grids (benchmarks/sample_efficiency.py)."""
    import optuna

    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=3, constant_liar=True)


def fingerprint(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def open_parent_study(storage, name: str, fp: str, where: str = ""):
    """The study ``name`` (made, or resumed when its fingerprint matches); ``where`` is the storage
    as it may be shown."""
    import optuna

    study = optuna.create_study(study_name=name, storage=storage, load_if_exists=True)
    existing = study.user_attrs.get("fingerprint")
    if existing is None:
        study.set_user_attr("fingerprint", fp)
        log.info(
            "study '%s'%s: new (run the same command again to resume it)",
            name,
            f" in {where}" if where else "",
        )
    elif existing != fp:
        raise TuningError(
            f"study '{name}' was made for another model, target, search space or bench "
            f"(fingerprint {existing[:12]} != {fp[:12]}); use a new study name (--study) or another storage "
            f"(--storage), or delete it ('moepolicy studies --delete {name}' with the same --storage)"
        )
    else:
        finished = _finished_sub_trials(storage, name)
        log.info(
            "resuming study '%s': %d finished trial%s from before count%s toward the budget and %s not "
            "measured again",
            name,
            finished,
            "" if finished == 1 else "s",
            "s" if finished == 1 else "",
            "is" if finished == 1 else "are",
        )
    return study


def _finished_sub_trials(storage, name: str) -> int:
    """Finished trials of the sub-studies (``<name>/...``) already in ``storage``."""
    import optuna

    names = [n for n in optuna.study.get_all_study_names(storage) if n.startswith(name + "/")]
    return sum(
        1
        for n in names
        for t in optuna.load_study(study_name=n, storage=storage).get_trials(deepcopy=False)
        if t.state.is_finished()
    )


# A trial's config goes into optuna's storage as a string (a user attribute holds JSON-serialisable
# values, and the string is also what workers compare to share one measurement of a config): these two
# are the only JSON round trip a bucket's config makes between the study and the plugin.
def _effective_key(point: TunePoint) -> str:
    return json.dumps([point.num_sms, point.tokens, list(point.dispatch), list(point.combine)])


def _stored_point(key: str) -> TunePoint:
    return TunePoint(*json.loads(key))


@dataclass(frozen=True)
class SubStudy:
    """One optuna sub-study of the search: its name, the SM count it holds fixed, its trial budget,
    DeepEP's default chunks (tried first), the space's bounds for this target and the sampler seed."""

    name: str
    num_sms: int
    trials: int
    default: tuple  # (dispatch, combine) ChunkConfigs
    internode: bool = False
    max_nvl_recv: int = 768
    region: str = "full"
    seed: int = 0
    enqueue_default: bool = True


def tune_bucket(
    storage, sub: SubStudy, bench: Bench, workload: Workload, space: Space, bucket: BucketResult
) -> None:
    """Run ``sub``'s trials for ``bucket`` (resuming the study in ``storage``), recording the best in it."""
    import optuna

    name, num_sms, default, internode = sub.name, sub.num_sms, sub.default, sub.internode

    sampler = make_sampler(sub.seed)
    study = optuna.create_study(
        study_name=name,
        storage=storage,
        load_if_exists=True,
        direction="minimize",
        sampler=sampler,
    )
    fail_stale_trials(study)
    _fail_orphans(storage, study)
    done = [t for t in study.trials if t.state.is_finished()]
    seen = {
        t.user_attrs["effective"]: t.value
        for t in done
        if t.state == optuna.trial.TrialState.COMPLETE and "effective" in t.user_attrs
    }
    if sub.enqueue_default and not any(t.user_attrs.get("is_default") for t in study.trials):
        d, c = default
        params = {
            "dispatch.nvl_send": d[0],
            "dispatch.nvl_recv": d[1],
            "combine.nvl_send": c[0],
            "combine.nvl_recv": c[1],
        }
        if internode:
            params.update(
                {
                    "dispatch.rdma_send": d[2],
                    "dispatch.rdma_recv": d[3],
                    "combine.rdma_send": c[2],
                    "combine.rdma_recv": c[3],
                }
            )
        study.enqueue_trial(params, user_attrs={"is_default": True}, skip_if_exists=True)
    ctx = _StudyStep(study, storage, name, bench, bucket, num_sms, sub.trials, seen)
    try:
        while True:
            with deferred():  # the study's bookkeeping is never split by an interrupt
                proposal = ctx.propose(space, internode, sub.max_nvl_recv, default)
            if proposal is None:
                break
            if proposal is _SKIP:
                continue
            if proposal is _TOLD:  # counted against the budget without a measurement
                progress.advance()
                continue
            # an interrupt lands here (no storage call), or waits
            outcome = ctx.measure(workload, proposal)
            with deferred():
                ctx.record(proposal, outcome, sub.region)
            progress.advance()
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: no trial of this process is left RUNNING
        _fail_interrupted(storage, study, ctx.asked)
        raise
    finally:
        _collect(study, bucket, num_sms)  # also when interrupted: what was measured counts


# yielded to another worker (not counted) / told a known value (counted)
_SKIP, _TOLD = object(), object()


@dataclass(frozen=True)
class _Proposal:
    """A trial this process measures: optuna's trial, its point, the effective-config key and the
    trial's storage id (looked up while interrupts are held back, so measuring needs no storage)."""

    trial: Any
    point: TunePoint
    key: str
    storage_id: int


class _StudyStep:
    """One sub-study's trials, a step at a time: propose (ask, claim, deduplicate), measure, record.

    The caller holds interrupts back (:func:`deferred`) across ``propose`` and ``record``: every
    storage call of a trial is made there. ``measure`` makes none, so Ctrl-C or SIGTERM never lands
    inside SQLAlchemy while a trial of this process is RUNNING (an interrupted query can keep its
    SQLite lock, and failing the trial afterwards would then wait for it and fail)."""

    def __init__(
        self,
        study,
        storage,
        name: str,
        bench: Bench,
        bucket: BucketResult,
        num_sms: int,
        trials: int,
        seen: dict,
    ):
        self.study, self.storage, self.name, self.bench, self.bucket = (
            study,
            storage,
            name,
            bench,
            bucket,
        )
        self.num_sms, self.trials, self.seen = num_sms, trials, seen
        self.host = socket.gethostname()
        self.asked: list[int] = []  # this process's trials: an interrupt never leaves one RUNNING

    def propose(self, space: Space, internode: bool, max_nvl_recv: int, default: tuple):
        """The next trial and its point; None when the budget is used; ``_TOLD`` when the trial was told
        a config's known value at once; ``_SKIP`` when another worker is measuring that config."""
        import optuna

        study = self.study
        if _budget_used(study) >= self.trials:
            return None
        trial = study.ask()
        self.asked.append(trial.number)
        trial.set_user_attr("host", self.host)
        trial.set_user_attr("pid", os.getpid())
        trial.set_user_attr("hardware", self.bench.identity())
        if _budget_used(study, below=trial.number) >= self.trials:
            # earlier trials of other workers filled it
            trial.set_user_attr("reason", "budget reached by other workers")
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            return None
        try:
            point = TunePoint(
                self.num_sms,
                self.bucket.tokens,
                space.suggest(trial, "dispatch", internode, max_nvl_recv, default[0][2:]),
                space.suggest(trial, "combine", internode, max_nvl_recv, default[1][2:]),
            )
        except TuningError:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            raise
        key = _effective_key(point)
        trial.set_user_attr("effective", key)
        state, value, other = _same_config(study, key, trial.number, self.seen)
        if state is None:  # claim it, then look again: of two racing claims at least one yields
            trial.set_user_attr("measuring", True)
            state, value, other = _same_config(study, key, trial.number, self.seen)
        if state == "complete":
            trial.set_user_attr("dedup", True)
            trial.set_user_attr("dedup_of", other)
            study.tell(trial, value)
            self.bucket.deduplicated += 1
            return _TOLD
        if state == "running":
            trial.set_user_attr(
                "reason", f"the same effective config is being measured by trial {other}"
            )
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            self.bucket.deduplicated += 1
            return _SKIP
        return _Proposal(trial, point, key, trial_id(self.storage, self.name, trial.number))

    def measure(self, workload: Workload, proposal: _Proposal):
        """The bench's measurement (with a heartbeat meanwhile, from its own thread), or the
        :class:`TrialFailed` it raised. No storage call in this thread."""
        stop = threading.Event()
        beat = threading.Thread(
            target=heartbeat, args=(self.storage, proposal.storage_id, stop), daemon=True
        )
        beat.start()
        try:
            return self.bench.measure(workload, proposal.point)
        except TrialFailed as exc:
            return exc
        finally:
            stop.set()
            beat.join(timeout=1.0)  # a beat being written ends before the trial is told or failed

    def record(self, proposal: _Proposal, outcome, region: str) -> None:
        import optuna

        trial, key = proposal.trial, proposal.key
        where = f"  [sms {self.num_sms:3} | T {self.bucket.tokens:5}] trial {trial.number + 1}/{self.trials}"
        if isinstance(outcome, TrialFailed):
            trial.set_user_attr("reason", str(outcome))
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            self.bucket.failed += 1
            log.debug(f"{where}: FAIL ({outcome})")
            return
        value = outcome.objective(region)
        trial.set_user_attr("measurement", outcome.as_dict())
        self.study.tell(trial, value)
        self.seen[key] = value
        log.debug(f"{where}: {value:8.1f} us (best {self.study.best_value:8.1f})")


def _fail_interrupted(storage, study, asked: list[int]) -> None:
    """Fail this process's RUNNING trials through the storage (an interrupt may have landed inside a
    ``tell``, or between an ``ask`` and the trial's first attribute); like a killed worker's, they do
    not use up the budget."""
    import optuna

    mine = set(asked)
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        owned = (
            t.user_attrs.get("pid") == os.getpid()
            and t.user_attrs.get("host") == socket.gethostname()
        )
        if owned or t.number in mine:
            try:
                _fail_orphan(storage, study, t, "interrupted before its measurement finished")
            except Exception as exc:  # noqa: BLE001 (the storage failing too: the next run fails it)
                log.warning(
                    "trial %d of study '%s' stays RUNNING (%s); the next run of this command marks it "
                    "failed",
                    t.number,
                    study.study_name,
                    " ".join(str(exc).split())[:200],
                )


ORPHAN_GRACE_S = 2.0  # a trial with no owner yet is another worker's only this long after its ask


def _fail_orphans(storage, study) -> None:
    """RUNNING trials left by a worker on this host whose process is gone (kill -9) are failed at
    once, without waiting for the heartbeat's grace period, so the budget counts only live work. A
    trial killed between its ask and its first attribute has no owner: once it is
    ``ORPHAN_GRACE_S`` old nobody owns it; a younger one is waited for (another worker may be about
    to claim it), then failed if it is still unclaimed."""
    import datetime as dt
    import time

    import optuna

    host = socket.gethostname()
    unclaimed = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        pid = t.user_attrs.get("pid")
        if pid is None:
            age = (
                (dt.datetime.now() - t.datetime_start).total_seconds()
                if t.datetime_start
                else ORPHAN_GRACE_S
            )
            unclaimed.append((t.number, max(0.0, ORPHAN_GRACE_S - age)))
            continue
        if t.user_attrs.get("host") != host or not isinstance(pid, int) or pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
            continue  # still alive
        except ProcessLookupError:
            _fail_orphan(storage, study, t, f"worker process {pid} is gone")
        except PermissionError:
            continue
    if unclaimed:
        time.sleep(max(wait for _, wait in unclaimed))
        numbers = {n for n, _ in unclaimed}
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            if t.number in numbers and t.user_attrs.get("pid") is None:
                _fail_orphan(
                    storage,
                    study,
                    t,
                    f"no worker claimed it within {ORPHAN_GRACE_S:.0f} s of its ask",
                )


def _fail_orphan(storage, study, t, reason: str) -> None:
    fail_trial(storage, study.study_name, t.number, reason)


def _budget_used(study, below: Optional[int] = None) -> int:
    """Trials that count against the budget, by every worker: complete, failed, running (not the
    orphans of killed workers: their measurement never finished). With ``below``, running trials
    count only when their number is lower, so of two racing workers exactly the later one yields."""
    import optuna

    states = (
        optuna.trial.TrialState.COMPLETE,
        optuna.trial.TrialState.FAIL,
        optuna.trial.TrialState.RUNNING,
    )
    count = 0
    for t in study.get_trials(deepcopy=False, states=states):
        if t.user_attrs.get("orphan"):
            continue
        if below is not None and t.state == optuna.trial.TrialState.RUNNING and t.number >= below:
            continue
        count += 1
    return count


def _same_config(
    study, key: str, number: int, seen: dict
) -> tuple[Optional[str], Optional[float], Optional[int]]:
    """Has this effective config been measured (by any worker), or has another trial claimed it
    ('measuring')? A trial claims before its second look, so two claims cannot both pass unseen:
    two workers never both measure one config (at worst both yield and it is proposed again)."""
    import optuna

    if key in seen:
        return "complete", seen[key], None
    for t in study.get_trials(deepcopy=False):
        if t.number == number or t.user_attrs.get("effective") != key:
            continue
        if t.state == optuna.trial.TrialState.COMPLETE and "measurement" in t.user_attrs:
            seen[key] = t.value
            return "complete", t.value, t.number
        if t.state == optuna.trial.TrialState.RUNNING and t.user_attrs.get("measuring"):
            return "running", None, t.number
    return None, None, None


def _collect(study, bucket: BucketResult, num_sms: int) -> None:
    import optuna

    complete = [
        t
        for t in study.trials
        if t.state == optuna.trial.TrialState.COMPLETE and "measurement" in t.user_attrs
    ]
    bucket.trials = len([t for t in study.trials if t.state.is_finished()])
    bucket.failed = len([t for t in study.trials if t.state == optuna.trial.TrialState.FAIL])
    if not complete:
        return
    ranked = sorted(complete, key=lambda t: t.value)
    top: dict[Any, Any] = {}  # a point's key -> its best trial
    for t in ranked:
        top.setdefault(t.user_attrs["effective"], t)
    bucket.top = tuple(_stored_point(key) for key in list(top)[:TOP_K])
    best = ranked[0]
    bucket.best = bucket.top[0]
    bucket.best_measurement = Measurement(**best.user_attrs["measurement"])
    defaults = [t for t in complete if t.user_attrs.get("is_default")]
    if defaults:
        bucket.default_measurement = Measurement(**defaults[0].user_attrs["measurement"])


TOP_K = 3  # configs of each bucket re-measured against the default after the search


def choose_sms(
    results: list[SmsResult], region: str, max_sms: Optional[int]
) -> tuple[SmsResult, str]:
    """The SM count for DeepEP in the serial schedule (DeepEP, then the experts' GEMM on every SM):
    the MoE step is comm(SMs) + GEMM(all SMs), so more SMs for DeepEP cost the GEMM nothing and the
    fastest communication wins, within the SM counts tried (the bench's calibrated range, the buffer
    budget, ``max_sms``). The overlapped schedule chooses its split in ``tuning.overlap``."""
    usable = [r for r in results if math.isfinite(r.weighted(region))]
    if not usable:
        raise TuningError(
            "every trial failed: no usable measurement (see the study's FAIL trials)"
        )
    fastest = min(usable, key=lambda r: r.weighted(region))
    budget = f" within the {max_sms}-SM budget" if max_sms else ""
    return fastest, (
        f"serial schedule: the MoE step is DeepEP's time plus the experts' GEMM on every SM, so "
        f"the fastest communication{budget} wins: {fastest.num_sms} SMs "
        f"({fastest.weighted(region):.1f} us weighted, search samples)"
    )


def pareto_front(results: list[SmsResult], region: str) -> list[dict]:
    points = sorted(
        (r.num_sms, r.weighted(region)) for r in results if math.isfinite(r.weighted(region))
    )
    front, best = [], math.inf
    for sms, t in points:
        if t < best:
            front.append({"num_sms": sms, "weighted_us": round(t, 2)})
            best = t
    return front
