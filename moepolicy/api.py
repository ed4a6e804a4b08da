"""The library's front door: plan, tune, write and load a policy from Python.

    import moepolicy
    plan = moepolicy.plan("Qwen3-30B-A3B-FP8", moepolicy.TargetSpec(gpu="h200", ep_size=8))
    result = moepolicy.tune(plan, bench="model")          # optional: DeepEP's settings
    moepolicy.write_policy(result, "policy.yaml")
    policy = moepolicy.load_policy("policy.yaml", model="Qwen/Qwen3-30B-A3B-FP8", ep_size=8)

``load_policy`` is the serving runtime's (``moepolicy.runtime.loader``), light enough for every
rank. The CLI is a shell over these functions. They return typed values and print nothing: progress and
notes go to the ``moepolicy`` loggers. Errors are :class:`moepolicy.MoePolicyError` subclasses.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional, Sequence, Union

from moepolicy.checkpoint import RawCheckpoint, resolve
from moepolicy.checkpoint.reader import facts_from_raw
from moepolicy.deepep.configs import default_configs, default_num_sms
from moepolicy.document.compose import build_document
from moepolicy.document.yaml_io import write_document
from moepolicy.errors import TuningError, UsageError
from moepolicy.measure.placement import SHARED_LABEL
from moepolicy.planner import Plan, make_plan
from moepolicy.planner import decided_plan as decide_again
from moepolicy.rules.packs import pack_stack
from moepolicy.target import TargetSpec, resolve_target
from moepolicy.tuning.bench_source import BenchSource
from moepolicy.tuning.options import TuneOptions, refuse
from moepolicy.tuning.space import load_objective, load_space
from moepolicy.tuning.storage import check_storage, storage_failure
from moepolicy.weights_memory import fit_warning_for

DEFAULT_NODE_GPUS = 8  # the EP size the CLI plans for without --ep-size (one full node)


def plan(
    model: str,
    target: Optional[TargetSpec] = None,
    *,
    rules: Sequence[str] = (),
    default_ep: Optional[int] = None,
) -> Plan:
    """Decide every layer of ``model`` (catalog name, Hugging Face id, ``config.json`` or folder) for
    ``target``; ``rules`` are extra rule packs (files or built-in names), above the built-in pack."""
    return read_plan(model, target, rules=rules, default_ep=default_ep).plan


@dataclasses.dataclass(frozen=True)
class ReadPlan:
    """A plan and the checkpoint it was decided from, read once (the CLI's plan and tune also say
    whether the checkpoint's weights fit the target's GPUs)."""

    plan: Plan
    checkpoint: RawCheckpoint

    def fit_warning(self) -> Optional[str]:
        """Why the weights do not fit one GPU of the target at its EP size; None when they do."""
        target = self.plan.target
        return fit_warning_for(self.checkpoint, self.plan.model, target.gpu, target.ep_size)


def read_plan(
    model: str,
    target: Optional[TargetSpec] = None,
    *,
    rules: Sequence[str] = (),
    default_ep: Optional[int] = None,
) -> ReadPlan:
    """:func:`plan`, with the checkpoint it read."""
    resolved = resolve_target(target or TargetSpec(), default_ep=default_ep)
    checkpoint = resolve(model)
    facts = facts_from_raw(checkpoint, engine=resolved.engine)
    return ReadPlan(make_plan(facts, resolved, pack_stack(list(rules))), checkpoint)


def choose_bench(kind: str = "auto", ep_size: Optional[int] = None):
    """The bench ``kind`` resolves to here (``tuning.bench_source.BenchChoice``), or a one-line error."""
    if kind not in ("auto", "live", "model"):
        raise UsageError(f"bench: expected auto, live or model, got {kind!r}")
    try:
        return BenchSource().choose(None if kind == "auto" else kind, ep_size)
    except TuningError as exc:
        raise UsageError(f"bench {kind}: {exc}") from None


def tune(
    plan: Plan,
    *,
    bench: str = "auto",
    tokens: Sequence[int] = (),
    options: Optional[TuneOptions] = None,
    **settings,
):
    """Tune DeepEP's SM count and chunk sizes for ``plan`` with optuna (on DeepEP v2: its own SM
    count and overlap option, live only), returning the ``tuning.runner.TuneResult`` (write it with
    :func:`write_policy`). ``tokens`` are the token buckets per rank (default:
    moepolicy/data/tuning/objective.yaml's); ``bench`` is ``auto`` (live when deep_ep imports and
    GPUs are visible, else the calibrated model), ``live`` or ``model``. ``settings`` are
    :class:`TuneOptions`' own (``trials``, ``storage``, ``study_name``, ``seed``, ``max_sms``,
    ``sms``, ``max_buffer_mb``, ``confirm_rounds``, ``trial_timeout_s``: ``moepolicy tune``'s flags),
    checked before anything runs (one line naming the option and its flag); ``options`` (a full
    :class:`TuneOptions`) replaces them all."""
    objective, space = load_objective(), load_space()
    options = options or tune_options(buckets(tokens, objective), settings)
    choice = choose_bench(bench, plan.target.ep_size)
    check_bench_fits(choice, plan.target.ep_size)
    return tune_with(plan, choice, options, objective, space)


TUNE_SETTINGS = (
    "trials",
    "storage",
    "study_name",
    "seed",
    "max_sms",
    "sms",
    "max_buffer_mb",
    "confirm_rounds",
    "trial_timeout_s",
)


def tune_options(chosen: tuple[tuple[int, float], ...], settings: dict) -> TuneOptions:
    """:func:`tune`'s keywords as the options they name (``study_name`` is the option ``study``)."""
    unknown = sorted(set(settings) - set(TUNE_SETTINGS))
    if unknown:
        raise UsageError(
            f"tune() has no option {unknown[0]!r}: pass one of {', '.join(TUNE_SETTINGS)}, or options="
        )
    named = {("study" if k == "study_name" else k): v for k, v in settings.items()}
    if isinstance(named.get("sms"), list):
        named["sms"] = tuple(named["sms"])
    return TuneOptions(buckets=chosen, **named)


def check_bench_fits(choice, ep_size: Optional[int]) -> None:
    """A live bench measures on its own ranks: a plan for another EP size cannot be tuned there."""
    if choice.kind == "live" and ep_size is not None and ep_size != choice.ranks:
        raise UsageError(
            f"live tuning runs on the {choice.ranks} visible GPUs; the plan is for EP {ep_size} "
            f"(tune with the model bench, --bench model, or where {ep_size} GPUs are visible)"
        )


def buckets(tokens: Sequence[int], objective: dict) -> tuple[tuple[int, float], ...]:
    """Token buckets as (tokens per rank, weight): ``tokens`` weighted alike, else the objective's."""
    if tokens:
        chosen = sorted({int(t) for t in tokens})
        if chosen[0] <= 0:
            raise refuse(
                "tokens",
                "needs positive token counts per rank",
                list(tokens),
                "pass e.g. 128,1024",
            )
        return tuple((t, 1.0) for t in chosen)
    return tuple(
        sorted((int(b["tokens"]), float(b.get("weight", 1.0))) for b in objective["buckets"])
    )


def tune_with(
    plan: Plan,
    choice,
    options: TuneOptions,
    objective: dict,
    space,
    bench=None,
    experts_bench=None,
):
    """The tune itself, for a bench already chosen: optuna's study over the plan's wire formats, or
    on DeepEP v2 its settings measured in turn. ``bench`` is a bench already built (the CLI's torchrun
    ranks, a test's; a ``v2_tune.V2Bench`` on v2); by default ``choice``'s. ``experts_bench`` times
    the expert stage (``tuning.expert_bench``); by default ``choice``'s."""
    if plan.target.deepep.api == "v2":
        return _tune_v2(plan, choice, options, bench)
    optuna = require_tuner()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    from moepolicy.tuning.runner import tune_plan  # optuna's study: imported when a tune runs

    check_storage(options.storage)
    if bench is None:
        bench = build_bench(plan, choice, options, objective)
    if getattr(choice, "shared", False):  # its times are no figure: the runner shows none
        bench.functional = choice.why
    try:
        result = tune_plan(plan, bench, options, space, objective)
    except Exception as exc:  # noqa: BLE001 (the study database failing: one line; anything else re-raised)
        failed = storage_failure(exc, options.storage)
        if failed is None:
            raise
        raise failed from None
    if not result.interrupted:
        experts = compare_experts(plan, choice, options, experts_bench)
        result = dataclasses.replace(result, experts=experts)
    return functional(result, choice) if getattr(choice, "shared", False) else result


def build_bench(
    plan: Plan,
    choice,
    options: TuneOptions,
    objective: dict,
    source: Optional[BenchSource] = None,
):
    """The bench ``choice`` names for ``plan``, built by ``source`` (the CLI's, a test's; by default
    this machine's): DeepEP's legacy Buffer timed, or on DeepEP v2 its own live bench."""
    source = source or BenchSource()
    if plan.target.deepep.api == "v2":
        return source.build_v2(choice, options.trial_timeout_s, V2_REPS)
    reps = int(objective.get("reps", 20))
    return source.build(
        choice, plan.target.gpu, options.max_buffer_bytes, options.trial_timeout_s, reps
    )


def require_tuner():
    """optuna (which brings numpy, the model bench's fit), or the one-line fix: checked before a
    bench is built, so that nothing fails further in with a missing module."""
    try:
        import numpy  # noqa: F401
        import optuna
    except ImportError:
        raise UsageError(
            "tuning needs optuna: pip install optuna (or, in a moepolicy checkout, pip install '.[tune]')"
        ) from None
    return optuna


# balanced rounds per phase of the expert-stage comparison (gate, report; selection)
EXPERT_ROUNDS = 12


def compare_experts(plan: Plan, choice, options: TuneOptions, bench=None):
    """The expert kernels' MoE steps for ``plan``'s target (``tuning.expert_choice``): the
    expert stage from ``choice``'s expert bench, the communication from the DeepEP model bench
    (modelled; none outside its calibrated range). None where no kernel moepolicy can time runs
    the checkpoint's experts."""
    from moepolicy.tuning.expert_choice import (
        choice_inputs,
        choose_experts,
        model_communication,
        model_communication_words,
    )
    from moepolicy.tuning.model_bench import ModelBench
    from moepolicy.tuning.runner import workload_for

    target = plan.target
    inputs = choice_inputs(plan.model, target, options.buckets, EXPERT_ROUNDS, options.seed)
    if inputs is None or target.deepep.api != "legacy":
        return None
    comm_bench = ModelBench(target.gpu)
    workload = workload_for(plan, "uniform", options.regime)
    dispatch, combine = default_configs(target.deepep, target.ep_size)
    communication = model_communication(
        comm_bench, workload, default_num_sms(target.deepep), dispatch, combine
    )
    inputs = dataclasses.replace(
        inputs, communication_words=model_communication_words(comm_bench, workload)
    )
    bench = bench or BenchSource().build_experts(choice, target.gpu, options.regime)
    return choose_experts(inputs, bench, communication)


V2_REPS = 20  # timings per DeepEP v2 measurement (their median counts)


def _tune_v2(plan: Plan, choice, options: TuneOptions, bench=None):
    """DeepEP v2: its SM count and prefer-overlap option, measured live (no model of v2 exists)."""
    from moepolicy.tuning.v2_tune import tune_v2_plan

    if choice.kind != "live":
        raise UsageError(
            f"{plan.target.deepep.name}: DeepEP v2 sizes its own buffers and chunks; its settings "
            "(num_sms, 0 = its analytical count, and prefer_overlap_with_compute) are measured only "
            "live, on GPUs with DeepEP v2 (it needs NCCL with GIN; unverified on this project's "
            "machines), not with the model bench; 'moepolicy plan' writes DeepEP's defaults as deepep.v2"
        )
    if bench is None:
        bench = build_bench(plan, choice, options, {})
    result = tune_v2_plan(plan, bench, options)
    return functional(result, choice) if getattr(choice, "shared", False) else result


def functional(result, choice):
    """A tune whose ranks shared GPUs checked the live path's function only: its result is marked
    partial with why (the serving runtime uses DeepEP's defaults for a partial policy)."""
    return dataclasses.replace(result, deepep=functional_deepep(result.deepep, choice))


def functional_deepep(kept, choice):
    """``kept`` (a ``deepep.kept.KeptDeepEP``) marked partial: timed by ranks that share GPUs."""
    reason = (
        f"functional run, {SHARED_LABEL} ({choice.why}); its times measure no communication "
        "and its configs are not for serving"
    )
    if kept.partial:
        reason += f"; {kept.partial}"
    return dataclasses.replace(kept, partial=reason)


def policy_document(result, command: str = "") -> dict:
    """The policy document of a :class:`Plan` (DeepEP's defaults) or of a tune's result: its plan
    decided again with what the tune measured (:func:`decided_plan`), and what it kept."""
    if isinstance(result, Plan):
        return build_document(result, command=command)
    return decided_policy(result, command)[1]


def decided_policy(result: Any, command: str = "") -> tuple[Plan, dict]:
    """A tune's result as the plan it writes (:func:`decided_plan`, decided once) and its policy
    document."""
    decided = decided_plan(result)
    return decided, build_document(decided, result.deepep, command or result.command)


def decided_plan(result) -> Plan:
    """The plan a tune's result writes: decided again with what the tune measured."""
    return decide_again(result.plan, result.timings, getattr(result, "experts", None))


def write_policy(
    result, path: Union[str, "os.PathLike[str]"], *, fmt: Optional[str] = None, command: str = ""
) -> dict:
    """Write the policy of ``result`` (a :class:`Plan` or a tune's result) to ``path`` atomically
    (YAML, or JSON for a ``.json`` path or ``fmt='json'``); returns the document written."""
    doc = policy_document(result, command=command)
    write_document(doc, path, fmt)
    return doc
