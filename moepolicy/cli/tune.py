"""``moepolicy tune``: plan, then tune DeepEP for the plan's wire formats; write the policy.

Bench: ``live`` (DeepEP on the visible GPUs) when deep_ep imports and CUDA GPUs are visible,
otherwise ``model`` (a cost model fitted to measurements shipped in moepolicy/data/tuning/calibration); it says
which first. Outside the model's measured envelope the policy keeps DeepEP's defaults, labelled
``extrapolated``. The policy is written atomically, also on Ctrl-C with what was found so far.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Optional

from moepolicy import api
from moepolicy.cli._deepep_summary import overlap_lines
from moepolicy.cli._output import (
    Input,
    add_output_flag,
    default_output,
    model_inputs,
    note,
    output_path,
    progress_to_stderr,
    rules_inputs,
    table,
    write_result,
)
from moepolicy.cli._plan import build_plan, vllm_difference
from moepolicy.cli._target import add_target_flags
from moepolicy.deepep.engines import VLLM_DBO_COMM_SMS
from moepolicy.document.reader import read_policy
from moepolicy.document.yaml_io import dumps
from moepolicy.errors import MoePolicyError, TuningError, UsageError, carry
from moepolicy.measure.placement import SHARED_LABEL
from moepolicy.measure.ranks import safe_environment
from moepolicy.measure.rounds import DEFAULT_ROUNDS, MIN_ROUNDS, interval_words, speedup_words
from moepolicy.redact import redact_command
from moepolicy.target import TargetSpec, resolve_target
from moepolicy.tuning.bench import REGIMES
from moepolicy.tuning.bench_source import (
    FUNCTIONAL_REPS,
    SHARED_RANKS_ENV,
    BenchChoice,
    BenchSource,
)
from moepolicy.tuning.coordinate import CoordinatedBench, join_group, serve
from moepolicy.tuning.options import (
    DEFAULT_STORAGE,
    ENGINE_REGIME,
    OVERLAP_CONFINES,
    OVERLAP_GEMMS,
    OverlapOptions,
    TuneOptions,
)
from moepolicy.tuning.overlap_report import OverlapBucketRow
from moepolicy.tuning.space import load_objective, load_space
from moepolicy.tuning.storage import StorageFailed, check_storage, storage_file

DEFAULT_OUTPUT = "policy.yaml"

# The one line an interrupt before any result ends with: nothing of this run is on disk but the
# study's finished trials, which the same command resumes.
NOTHING_WRITTEN = ": nothing was written (run the same command again to resume the study)"
# DeepEP v2's tune keeps its measurements in memory only (no optuna study to resume)
NOTHING_WRITTEN_V2 = (
    ": nothing was written (a DeepEP v2 tune keeps no study: the same command starts over)"
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tune", help="tune DeepEP (optuna, live or modelled) and write the policy")
    p.add_argument(
        "--model",
        required=True,
        help="catalog name, Hugging Face id (org/name[@rev]), config.json, or model folder",
    )
    add_target_flags(
        p,
        ep_default="the visible GPU count when tuning live, else one full node (--gpus-per-node)",
    )
    p.add_argument(
        "--bench",
        choices=["live", "model"],
        help="default: live when deep_ep and GPUs are present",
    )
    p.add_argument(
        "--trials",
        type=int,
        default=None,
        help="trials per (SM count, token bucket) study (default 24; 1 on the model bench, whose chunk "
        "effects are not fitted from measurements, so only DeepEP's default chunks are timed and "
        "kept: more trials there change nothing, and tune warns)",
    )
    p.add_argument(
        "--max-sms",
        type=int,
        help="the most SMs DeepEP may take (default: the bench's range and the GPU)",
    )
    p.add_argument(
        "--sms", help="explicit SM counts to try, e.g. 20,24 (default: the space's grid)"
    )
    p.add_argument(
        "--max-buffer-mb", type=int, default=2048, help="NVLink buffer budget (default 2048)"
    )
    p.add_argument(
        "--tokens",
        help=f"token buckets per rank, e.g. 128,1024,4096 (default {_default_buckets()}, from "
        "moepolicy/data/tuning/objective.yaml); the largest should reach what one rank "
        "dispatches at vLLM's --max-num-batched-tokens",
    )
    p.add_argument("--storage", help="optuna storage URL (default sqlite:///moepolicy-studies.db)")
    p.add_argument(
        "--study",
        "--study-name",
        dest="study",
        help="optuna study name (default from model and target); an existing study is resumed",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="the sampler's seed (default 0): the same seed, the same trials",
    )
    p.add_argument(
        "--trial-timeout", type=float, default=90.0, help="live watchdog per trial, seconds"
    )
    _add_overlap_flags(p)
    p.add_argument(
        "--confirm-rounds",
        type=int,
        default=DEFAULT_ROUNDS,
        help="balanced rounds of each phase of the re-measurement protocol: selection, gate and report, "
        "each in fresh workers (a new Buffer) after a dropped warm-up pass. The gate decides with "
        "the exact signed-rank sign-flip test on the per-round speed-ups (Holm over the buckets "
        "where several are claimed; a policy with no true difference records any claim at most 5%% "
        "of the time); the report's figures, from rounds that decided nothing, are the ones "
        "written and printed "
        f"(default {DEFAULT_ROUNDS}; at least {MIN_ROUNDS}, the fewest in which every claim can pass "
        "its test with Holm over three buckets)",
    )
    p.add_argument(
        "--regime",
        choices=list(REGIMES),
        default=None,
        help="what the timings include: host (each call started on an idle GPU after an L2 flush "
        "and a barrier, the host's launches and waits charged: an upper bound on what an eager "
        "engine such as vLLM's DeepEP high-throughput path pays, since its host runs ahead) or gpu "
        "(the GPU's own time, the host enqueued ahead: a CUDA-graph engine); default: host for "
        "vllm and sglang with deepep_ht",
    )
    p.add_argument(
        "-v", "--verbose", action="store_true", help="a line per trial instead of progress bars"
    )
    p.add_argument(
        "--launcher",
        choices=["local", "torchrun"],
        default="local",
        help="torchrun: one process per rank from torchrun's environment (several nodes); rank 0 alone "
        "talks to the study; --bench live measures on every rank's GPU (NCCL), --bench model "
        "checks the coordination on CPUs (gloo)",
    )
    add_output_flag(p, "the policy", default=DEFAULT_OUTPUT)
    p.set_defaults(run=run)


def _buckets(args, objective) -> tuple[tuple[int, float], ...]:
    """``--tokens`` as the library's buckets (the objective's when not given)."""
    tokens: list[int] = []
    if args.tokens:
        try:
            tokens = [int(t) for t in args.tokens.split(",") if t.strip()]
        except ValueError:
            raise UsageError(
                f"--tokens takes integers like 128,1024,4096, got {args.tokens!r}"
            ) from None
        if not tokens or min(tokens) <= 0:
            raise UsageError(f"--tokens needs positive token counts, got {args.tokens!r}")
    return api.buckets(tokens, objective)


def _sms(text: Optional[str]) -> tuple[int, ...]:
    if not text:
        return ()
    try:
        return tuple(sorted({int(s) for s in text.split(",") if s.strip()}))
    except ValueError:
        raise UsageError(f"--sms takes even integers like 20,24, got {text!r}") from None


def _add_overlap_flags(p: argparse.ArgumentParser) -> None:
    """--overlap and how its GEMM, confinement and launch order are chosen."""
    p.add_argument(
        "--overlap",
        action="store_true",
        help="choose DeepEP's SMs and send chunks against the experts' GEMM on the other SMs "
        "(live bench; --trials joint trials after a scan of the --sms splits)",
    )
    p.add_argument(
        "--overlap-gemm",
        choices=list(OVERLAP_GEMMS),
        default="auto",
        help="--overlap: the experts' GEMM beside the communication: persistent (block-fp8 grouped "
        "Triton kernel on exactly the GEMM's SMs), persistent-clustered (the same in 2-CTA "
        "clusters, as DeepGEMM's multicast launches), grouped (torch's fp8 grouped GEMM) or dense "
        "(one cuBLAS fp8 GEMM); auto (default): persistent-clustered where the experts run "
        "DeepGEMM, else persistent; a kind that cannot run falls back",
    )
    p.add_argument(
        "--overlap-confine",
        choices=list(OVERLAP_CONFINES),
        default="grid",
        help="--overlap: grid (default): the GEMM is held to its SMs only by the persistent kernel's "
        "grid, as serving does when it tells DeepGEMM its SMs; green: also a green context "
        "(an idealised partition, for analysis)",
    )
    p.add_argument(
        "--overlap-order",
        choices=["gemm-first", "comm-first", "comm-first-no-wait", "mean"],
        default="gemm-first",
        help="--overlap: which launch order the split is chosen for: gemm-first (default: the GEMM "
        "already holds its SMs when DeepEP launches), comm-first (DeepEP's calls are enqueued "
        "first, as vLLM's DBO and SGLang's TBO schedules order them; the full dispatch's host "
        "wait for its receive counts then delays the GEMM's launch), comm-first-no-wait (the "
        "same order with the dispatch given num_worst_tokens, so the host does not wait: what "
        "a CUDA-graph or run-ahead engine can do), or the mean of gemm-first and comm-first; "
        "all are always measured and recorded",
    )


def _default_buckets() -> str:
    try:
        return ",".join(str(b["tokens"]) for b in load_objective()["buckets"])
    except Exception:  # noqa: BLE001 (help text only)
        return "128,1024,4096"


def tune_options(args: argparse.Namespace, objective: dict) -> TuneOptions:
    """The frozen options a tune runs with: the flags as the library's options, which check every
    value themselves (one line naming the flag)."""
    overlap = None
    if args.overlap:
        overlap = OverlapOptions(
            gemm=args.overlap_gemm,
            confine=args.overlap_confine,
            order=args.overlap_order,
            confirm_rounds=args.confirm_rounds,
        )
    return TuneOptions(
        buckets=_buckets(args, objective),
        trials=args.trials,
        max_sms=args.max_sms,
        sms=_sms(args.sms),
        max_buffer_mb=args.max_buffer_mb,
        storage=args.storage or DEFAULT_STORAGE,
        study=args.study,
        seed=args.seed,
        command="moepolicy " + redact_command(sys.argv[1:]),
        overlap=overlap,
        regime=args.regime or ENGINE_REGIME,
        confirm_rounds=args.confirm_rounds,
        trial_timeout_s=args.trial_timeout,
    )


def _torchrun(args: argparse.Namespace, source: BenchSource) -> int:
    """Rank 0 tunes as usual with a coordinated bench; the other ranks serve measurements."""
    safe_environment()  # torchrun started this process: NVLink multicast off before NCCL starts
    import torch.distributed as dist

    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise UsageError(
            "--launcher torchrun: RANK and WORLD_SIZE are not set (start it with torchrun)"
        )
    if args.bench not in ("model", "live"):
        raise UsageError(
            "--launcher torchrun needs --bench model (CPUs, gloo) or --bench live (GPUs, NCCL)"
        )
    world = int(os.environ["WORLD_SIZE"])
    if args.ep_size is not None and args.ep_size != world:
        raise UsageError(
            f"--launcher torchrun measures on its {world} ranks; --ep-size {args.ep_size} differs"
        )
    args.ep_size = world
    api.require_tuner()  # every rank: rank 0 runs the study, the model bench's ranks fit with numpy
    shared = False
    if args.bench == "live":
        inner, shared = _rank_bench(args, source, world)
    else:
        join_group("gloo", note)
        inner = source.build(
            BenchChoice("model", "torchrun", world),
            resolve_target(TargetSpec(gpu=args.gpu, ep_size=world), probe=False).gpu,
            0,
            0.0,
            0,
        )
    try:
        if dist.get_rank() != 0:
            served = serve(inner)
            note(f"rank {dist.get_rank()}: measured {served} trials")
            return 0
        bench = CoordinatedBench(inner)
        try:
            why = f"torchrun, {world} ranks, rank 0 drives the study"
            if shared:
                why += f" ({SHARED_RANKS_ENV}=1): a functional run, not for serving"
            choice = BenchChoice(args.bench, why, world, shared=shared)
            return _tune_and_write(args, choice, None, coordinated=bench)
        finally:
            bench.close()
    finally:
        dist.barrier()
        dist.destroy_process_group()


def _rank_bench(args: argparse.Namespace, source: BenchSource, world: int):
    """This torchrun rank's live bench, joined to the job: on a GPU of its own (NCCL), or, as the
    test-only functional run, on a GPU its node's ranks share (gloo). Returns (bench, shared)."""
    import torch
    import torch.distributed as dist

    from moepolicy.tuning.live_bench import RankBench

    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    try:
        placement = source.torchrun_placement(local_ranks)
    except TuningError as exc:
        raise UsageError(f"--launcher torchrun --bench live: {exc}") from None
    device = torch.device("cuda", placement.device_index(int(os.environ.get("LOCAL_RANK", "0"))))
    torch.cuda.set_device(device)
    join_group(placement.backend, note, device_id=None if placement.shared else device)
    budget = args.max_buffer_mb * 1024 * 1024 // 128 * 128
    reps = FUNCTIONAL_REPS if placement.shared else 20
    return RankBench(dist.group.WORLD, budget, reps=reps, device=device), placement.shared


def run(args: argparse.Namespace, source: Optional[BenchSource] = None) -> int:
    source = source or BenchSource()
    if args.launcher == "torchrun":
        return _torchrun(args, source)
    try:
        choice = source.choose(args.bench, args.ep_size)
    except TuningError as exc:  # no GPU, no DeepEP: the tuner cannot go on (exit 7, not usage)
        raise TuningError(f"--bench {args.bench}: {exc}") from None
    if args.overlap and choice.kind != "live":
        raise UsageError(
            "--overlap needs the live bench: it times DeepEP beside a confined GEMM on GPUs "
            f"(bench: {choice.kind}, {choice.why})"
        )
    api.check_bench_fits(choice, args.ep_size)
    return _tune_and_write(args, choice, source)


def _tune_and_write(
    args: argparse.Namespace,
    choice: BenchChoice,
    source: Optional[BenchSource],
    coordinated: Optional[Any] = None,
) -> int:
    """Plan, tune with the benches ``source`` builds (or, on torchrun's rank 0, the ``coordinated``
    bench; the expert stage then the library's own), render and write the policy."""
    if args.backend == "deepep_ll":
        raise UsageError(
            "--backend deepep_ll: low-latency mode has no SM count or chunk sizes to tune (its kernels "
            "size themselves by num_max_dispatch_tokens_per_rank); 'moepolicy plan --backend deepep_ll' "
            "writes its decisions and buffer size"
        )
    note(f"bench: {choice.kind} ({choice.why})")
    _warn_unfitted_trials(args.trials, choice)
    objective, space = load_objective(), load_space()
    options = tune_options(args, objective)
    output = _checked_output(args, options.storage)
    plan = build_plan(args, default_ep=choice.ranks if choice.kind == "live" else None)
    v2 = plan.target.deepep.api == "v2"
    if not v2:
        api.require_tuner()  # before the bench: the model bench's fit needs numpy, which optuna brings
        bench = coordinated
        if bench is None:
            bench = api.build_bench(plan, choice, options, objective, source)
    elif coordinated is not None:  # torchrun's ranks time DeepEP's legacy Buffer only
        raise UsageError(
            f"{plan.target.deepep.name}: DeepEP v2's settings are measured by its own live bench, "
            "not with --launcher torchrun; run 'moepolicy tune' on the GPUs with DeepEP v2"
        )
    elif choice.kind == "live":
        note(
            "DeepEP v2: measuring its SM count and prefer-overlap option (unverified on this "
            "project's machines)"
        )
        bench = api.build_bench(plan, choice, options, objective, source)
    else:
        bench = None  # api.tune_with refuses DeepEP v2 off the live bench, in one line
    experts = source.build_experts(choice, plan.target.gpu, options.regime) if source else None
    result = _tune(args, (plan, choice, options, objective, space), bench, experts)
    # ranks sharing a GPU: api.tune_with marked the result partial (not for serving); no time is shown
    functional = f"{SHARED_LABEL}: {choice.why}" if choice.shared else ""
    if functional:
        note(f"{functional}; its times measure no communication: the summary shows none")
    decided, document = api.decided_policy(result)  # the layers decided again once, as written
    if v2:
        _render_v2(result)
        write_result(_output_for(result, output), dumps(document))
        return 0
    render(result, document, functional)
    if getattr(result, "experts", None) is not None:
        render_experts(result.experts, document["experts"]["kernel"])
    _closing_line(decided, result, functional)
    write_result(
        _output_for(result, output),
        dumps(document),
        "a partial result, marked so in the file" if result.interrupted else "",
    )
    return _after_interrupt(result)


def _checked_output(args: argparse.Namespace, storage: str) -> Optional[str]:
    """The storage and where the policy goes (``policy.yaml``, said, without -o), checked before any
    work."""
    check_storage(storage)
    args.output = default_output(args.output, DEFAULT_OUTPUT)
    return output_path(args.output, tune_inputs(args, storage))


def _warn_unfitted_trials(trials: Optional[int], choice: BenchChoice) -> None:
    """--trials above 1 on the model bench: its chunk effects are hand-set, not fitted, so a modelled
    tune keeps DeepEP's default chunks whatever the search finds; the trials only cost time."""
    if choice.kind != "model" or trials is None or trials <= 1:
        return
    note(
        f"warning: --trials {trials}: the model bench fits no chunk effects, so a modelled tune keeps "
        "DeepEP's default chunks whatever the search finds; the extra trials cost time and change no "
        "setting the policy keeps (leave --trials out on the model bench)"
    )


def _tune(args: argparse.Namespace, inputs: tuple[Any, Any, Any, Any, Any], bench, experts_bench):
    """``api.tune_with`` with progress on stderr; an interrupt before a result says nothing was
    written (the tune writes only after it)."""
    try:
        with progress_to_stderr(verbose=args.verbose):
            return api.tune_with(*inputs, bench=bench, experts_bench=experts_bench)
    except (KeyboardInterrupt, StorageFailed) as exc:  # the database failing is said by itself
        v2 = inputs[0].target.deepep.api == "v2"
        carry(exc, moepolicy_outcome=NOTHING_WRITTEN_V2 if v2 else NOTHING_WRITTEN)
        raise


def _render_v2(result) -> None:
    """What a DeepEP v2 tune kept and the report rounds' figures (fresh workers; they decided nothing)."""
    chosen = result.v2
    note(f"DeepEP v2: kept {chosen.kept.name} ({chosen.why})")
    for tokens, speedup in chosen.vs_default.items():
        times = ", ".join(
            f"{name} {us} us" for name, us in chosen.report_us.get(tokens, {}).items()
        )
        note(
            f"  T={tokens}: "
            + (speedup.words() if speedup is not None else f"report rounds: {times}")
        )
    if chosen.report_weighted is not None:
        note(f"  weighted over the buckets: {chosen.report_weighted.words()}")


def render_experts(choice, kernel: str) -> None:
    """The expert kernels' MoE steps compared, per bucket, and what the policy runs (stderr)."""
    label = "modelled" if choice.source == "modelled" else "measured"
    note(f"expert kernels ({label}): {choice.basis}")
    for k in choice.kernels:
        said = ("recorded" if label == "modelled" else "timed") if k.runs else "not measured"
        note(f"  {k.kernel}: {said} ({k.detail})")
    for name, timings in choice.orders:
        for t in timings:
            verdict = {
                "quant_then_dispatch": "quantizing first faster",
                "dispatch_then_quant": "quantizing after faster",
            }.get(
                t.verdict,
                "no order faster beyond "
                + ("the model's error" if label == "modelled" else "noise"),
            )
            spread = (
                f" [{interval_words(*t.ci95)}, {t.rounds} report rounds]"
                if t.ci95 is not None
                else ""
            )
            note(
                f"  {name} T={t.tokens}: quantize->dispatch {t.quant_then_dispatch_us:.0f} us, "
                f"dispatch->quantize {t.dispatch_then_quant_us:.0f} us ({label}); quantizing first "
                f"{speedup_words(t.speedup)}{spread}: {verdict}"
            )
    note(f"  experts: the policy runs {kernel}; {choice.why}")


def _closing_line(plan, result, functional: str = "") -> None:
    """How the policy differs from what vLLM runs today: its decisions, then its DeepEP settings."""
    kept = {getattr(b.confirmed.kept, "name", "") if b.confirmed else "" for b in result.buckets}
    if functional:  # a partial result: the runtime serves DeepEP's defaults for it
        deepep = "DeepEP: a functional run, not for serving (load_policy serves DeepEP's defaults)"
    elif result.overlap is not None:  # --overlap keeps its split and chunks, not DeepEP's defaults
        deepep = _overlap_words(result.overlap, result.label)
    elif result.label == "extrapolated" or not result.buckets:
        deepep = f"DeepEP: its default configs ({result.label}), as vLLM runs it"
    elif result.interrupted or not any(b.confirmed for b in result.buckets):
        deepep = (
            f"DeepEP: {result.num_sms} SMs and the search's best configs so far ({result.label}, "
            "interrupted: not re-measured, a partial result not for serving)"
        )
    elif kept == {"engine"}:
        deepep = f"DeepEP: vLLM's own settings kept ({result.num_sms} SMs, DeepEP's table; {result.label})"
    else:
        deepep = (
            f"DeepEP: {result.num_sms} SMs (vLLM runs 20) and the configs above ({result.label})"
        )
    experts = getattr(result, "experts", None)
    if experts is not None:
        deepep += f"; experts: {plan.kernel_label} ({evidence_words(experts)})"
    line = vllm_difference(plan, deepep)
    if line:
        note(line)


def _overlap_words(found, label: str) -> str:
    """What an overlap tune keeps of DeepEP, for the closing line."""
    sms = (
        "vLLM's 20 SMs"
        if found.comm_sms == VLLM_DBO_COMM_SMS
        else f"{found.comm_sms} SMs (vLLM runs {VLLM_DBO_COMM_SMS})"
    )
    return (
        f"DeepEP: {sms} beside the experts' GEMM on {found.gemm_sms}, with the send chunks chosen "
        f"with them ({label}, overlapped)"
    )


def evidence_words(choice) -> str:
    """At which evidence level the expert kernels were compared, in a few words."""
    stage = (
        "expert stage measured on this GPU"
        if choice.source == "measured"
        else "expert stage modelled from the recorded H200 campaign"
    )
    comm = (
        "communication modelled"
        if "communication modelled" in choice.basis
        else "no communication figure for this target"
    )
    return f"{stage}, {comm}"


def _after_interrupt(result) -> int:
    if result.interruption is not None:
        raise result.interruption
    return 0


def tune_inputs(args: argparse.Namespace, storage: str) -> list[Input]:
    """What a tune reads, which its ``-o`` must not name: the checkpoint, the rule packs, the study database."""
    return [
        *model_inputs(args.model),
        *rules_inputs(args.rules),
        ("the study database", storage_file(storage)),
    ]


def _output_for(result, output: Optional[str]) -> Optional[str]:
    """Where the result goes: ``output``, unless the result is partial (an interrupted tune, a
    functional run on shared ranks) and ``output`` holds a complete policy, which a partial result
    never replaces (it goes beside it, ``*.partial.yaml``)."""
    if output is None or result.deepep.partial is None or not Path(output).exists():
        return output
    try:
        previous = read_policy(output)
    except MoePolicyError:
        return output  # not a policy (or a damaged one): nothing complete to keep
    if previous.doc.deepep.partial is not None:
        return output
    p = Path(output)
    beside = str(p.with_name(p.stem + ".partial" + (p.suffix or ".yaml")))
    note(
        f"{'interrupted' if result.interrupted else 'a partial result'}: {output} holds a complete "
        f"policy and is kept; the partial result goes to {beside}"
    )
    return beside


def render(result, document: dict, functional: str = "") -> None:
    """The tune's summary on stderr: the overlap split per bucket, or per bucket the config kept with
    what backs it: the report rounds' speed-ups (live) or the model's answers (modelled). For a
    functional run (``functional`` says why: ranks sharing a GPU) only what ran and what it kept."""
    if functional and not result.interrupted:
        note(f"plumbing ok: {_functional_words(result)}")
        return
    if result.overlap is not None:
        found = result.overlap
        note(f"overlap: {found.comm_sms} communication SMs, GEMM on {found.gemm_sms}: {found.why}")
        stored = [bucket["measured"] for bucket in document["deepep"]["buckets"]]
        for tokens, measured in zip(found.rows, stored):  # rendered as audit renders the file
            note(f"  T={tokens}:")
            for line in overlap_lines(OverlapBucketRow.from_doc(measured)):
                note(line)
        return
    if not result.buckets:
        if result.label != "extrapolated":  # the tuner's own line said why it kept the defaults
            note(
                f"DeepEP: {result.num_sms} SMs, DeepEP's default configs ({result.label}): {result.why}"
            )
        return
    note(f"num_sms {result.num_sms} ({result.label}): {result.why}")
    if result.interrupted or not any(b.confirmed for b in result.buckets):
        note("  not re-measured (interrupted): no gain is claimed")
        return
    if result.label == "modelled":
        _render_modelled(result)
    else:
        _render_measured(result)


def _functional_words(result) -> str:
    """What a functional run ran end to end, and what it kept."""
    if result.overlap is not None:
        found = result.overlap
        return (
            f"the overlap grid ran in {len(found.rows)} bucket(s), keeping {found.comm_sms} "
            f"communication SMs beside the GEMM on {found.gemm_sms}"
        )
    confirmed = [b for b in result.buckets if b.confirmed]
    if not confirmed:
        return f"the search ran; {result.num_sms} SMs and DeepEP's default configs kept"
    kept = ", ".join(f"T={b.tokens} {_kept_words(b)}" for b in confirmed)
    return (
        f"the search, then the selection, gate and report rounds ran in "
        f"{len(confirmed)} bucket(s); kept {result.num_sms} SMs: {kept}"
    )


def _kept_words(b) -> str:
    return f"{b.confirmed.kept.name} d{tuple(b.point.dispatch[:2])} c{tuple(b.point.combine[:2])}"


def _render_measured(result) -> None:
    from moepolicy.tuning.confirm import report_words

    rows = []
    for b in result.buckets:
        c = b.confirmed
        rows.append(
            [
                b.tokens,
                f"{c.times_us['engine']:.1f}",
                f"{c.times_us['default']:.1f}",
                f"{c.times_us['kept']:.1f}",
                report_words(c.vs_engine),
                report_words(c.vs_default),
                _kept_words(b),
            ]
        )
    table(
        [
            "tokens",
            "engine default us",
            f"default chunks @{result.num_sms} us",
            "kept us",
            "kept vs engine",
            "kept vs default chunks",
            "kept (nvl send, recv)",
        ],
        rows,
        out=sys.stderr,
    )
    weighted = getattr(result.protocol, "weighted", None)
    if weighted is not None:
        note(f"  weighted over the buckets: {weighted.words()}")
    note(
        f"  measured, {result.region} region: DeepEP's dispatch + combine, medians of the report rounds (fresh workers; "
        "they decided nothing); the serial MoE step adds the experts' GEMM, the same in every column. Speed-ups: "
        "the report rounds' paired estimates (Hodges-Lehmann) with the signed-rank test's 95% intervals, "
        "simultaneous over the buckets; what is kept was decided in the gate rounds before, whose own "
        "figures are never printed"
    )


def _render_modelled(result) -> None:
    chosen = next((b.confirmed.chosen_sms for b in result.buckets if b.confirmed.chosen_sms), None)
    if chosen is None:  # the engine's SM count: nothing compared
        table(
            ["tokens", "kept us (modelled)", "kept (nvl send, recv)"],
            [[b.tokens, f"{b.confirmed.us['kept']:.1f}", _kept_words(b)] for b in result.buckets],
            out=sys.stderr,
        )
    else:
        rows = [
            [
                b.tokens,
                f"{b.confirmed.us['engine']:.1f}",
                f"{b.confirmed.us['chosen']:.1f}",
                b.confirmed.words(),
                _kept_words(b),
            ]
            for b in result.buckets
        ]
        table(
            [
                "tokens",
                "engine default us (modelled)",
                f"{chosen} SMs us (modelled)",
                "chosen vs engine (modelled)",
                "kept (nvl send, recv)",
            ],
            rows,
            out=sys.stderr,
        )
    note(
        f"  modelled, {result.region} region: the model bench's answers (a cost model fitted to measurements on "
        "2 x H200), not measurements: no interval (a model has no round-to-round noise); an SM count other than "
        "the engine's is kept only where the modelled speed-up exceeds the model's held-out error there"
    )
