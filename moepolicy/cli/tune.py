"""``moepolicy tune``: plan, then tune DeepEP for the plan's wire formats; write the policy.

Bench: ``live`` (DeepEP on the visible GPUs) when deep_ep imports and CUDA GPUs are visible,
otherwise ``model`` (a cost model fitted to measurements shipped in tuning/calibration); it says
which first. Outside the model's measured envelope the policy keeps DeepEP's defaults, labelled
``extrapolated``. The policy is written atomically, also on Ctrl-C with what was found so far.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from moepolicy.cli._output import note
from moepolicy.cli._target import add_target_flags
from moepolicy.errors import UsageError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tune", help="tune DeepEP (optuna, live or modelled) and write the policy")
    p.add_argument("--model", required=True)
    add_target_flags(p, ep_required_hint="default: the visible GPU count when tuning live")
    p.add_argument("--bench", choices=["live", "model"], help="default: live when deep_ep and GPUs are present")
    p.add_argument("--trials", type=int, default=24, help="trials per (SM count, token bucket) study (default 24)")
    p.add_argument("--max-sms", type=int, help="SM budget for communication; without it, the Pareto front")
    p.add_argument("--sms", help="explicit SM counts to try, e.g. 20,24 (default: the space's grid)")
    p.add_argument("--max-buffer-mb", type=int, default=2048, help="NVLink buffer budget (default 2048)")
    p.add_argument("--tokens", help="token buckets per rank, e.g. 128,1024,4096 (default from tuning/objective.yaml)")
    p.add_argument("--storage", help="optuna storage URL (default sqlite:///moepolicy-studies.db)")
    p.add_argument("--study", help="study name (default from model and target)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trial-timeout", type=float, default=90.0, help="live watchdog per trial, seconds")
    p.add_argument("--overlap", action="store_true",
                   help="choose DeepEP's SMs and send chunks against the experts' GEMM on the other SMs "
                        "(live bench; --trials joint trials after a scan of the --sms splits)")
    p.add_argument("--overlap-gemm", choices=["auto", "persistent", "persistent-clustered", "grouped", "dense"],
                   default="auto",
                   help="--overlap: the experts' GEMM beside the communication: persistent (block-fp8 grouped "
                        "Triton kernel on exactly the GEMM's SMs), persistent-clustered (the same in 2-CTA "
                        "clusters, as DeepGEMM's multicast launches), grouped (torch's fp8 grouped GEMM) or dense "
                        "(one cuBLAS fp8 GEMM); auto (default): persistent-clustered where the experts run "
                        "DeepGEMM, else persistent; a kind that cannot run falls back")
    p.add_argument("--overlap-confine", choices=["grid", "green"], default="grid",
                   help="--overlap: grid (default): the GEMM is held to its SMs only by the persistent kernel's "
                        "grid, as serving does when it tells DeepGEMM its SMs; green: also a green context "
                        "(an idealised partition, for analysis)")
    p.add_argument("--overlap-order", choices=["gemm-first", "comm-first", "comm-first-no-wait", "mean"],
                   default="gemm-first",
                   help="--overlap: which launch order the split is chosen for: gemm-first (default: the GEMM "
                        "already holds its SMs when DeepEP launches), comm-first (DeepEP's calls are enqueued "
                        "first, as vLLM's DBO and SGLang's TBO schedules order them; the full dispatch's host "
                        "wait for its receive counts then delays the GEMM's launch), comm-first-no-wait (the "
                        "same order with the dispatch given num_worst_tokens, so the host does not wait: what "
                        "a CUDA-graph or run-ahead engine can do), or the mean of gemm-first and comm-first; "
                        "all are always measured and recorded")
    p.add_argument("--confirm-rounds", type=int, default=5,
                   help="--overlap: rounds in which the best configs and vLLM's split are re-measured (default 5)")
    p.add_argument("--launcher", choices=["local", "torchrun"], default="local",
                   help="torchrun: one process per rank from torchrun's environment; rank 0 alone "
                        "talks to the study (coordination over gloo; with --bench model)")
    p.add_argument("-o", "--output", default="policy.yaml", help="policy file to write (default policy.yaml)")
    p.set_defaults(run=run)


def _bench_kind(args) -> tuple[str, str, int]:
    import os

    from moepolicy.tuning.live_bench import deep_ep_importable, visible_gpus

    if os.environ.get("MOEPOLICY_FAKE_DEEPEP") and args.bench == "live":  # CI: the supervisor, no GPUs
        return "live", "fake DeepEP workers (MOEPOLICY_FAKE_DEEPEP)", int(os.environ["MOEPOLICY_FAKE_DEEPEP"])

    gpus = visible_gpus() if args.bench != "model" else 0
    missing = deep_ep_importable() if args.bench != "model" else "not asked"
    if args.bench == "live":
        if gpus < 2:
            raise UsageError(f"--bench live needs CUDA GPUs (visible: {gpus})")
        if missing:
            raise UsageError(f"--bench live: {missing}")
        return "live", "asked for with --bench live", gpus
    if args.bench == "model":
        return "model", "asked for with --bench model", gpus
    if gpus >= 2 and not missing:
        return "live", f"deep_ep imports and {gpus} GPUs are visible", gpus
    why = f"{gpus} CUDA GPU(s) visible" if gpus < 2 else missing
    return "model", f"{why}: using the calibrated model bench", gpus


def _buckets(args, objective) -> list[tuple[int, float]]:
    if args.tokens:
        try:
            tokens = sorted({int(t) for t in args.tokens.split(",") if t.strip()})
        except ValueError:
            raise UsageError(f"--tokens takes integers like 128,1024,4096, got {args.tokens!r}") from None
        if not tokens or tokens[0] <= 0:
            raise UsageError(f"--tokens needs positive token counts, got {args.tokens!r}")
        return [(t, 1.0) for t in tokens]
    return sorted((int(b["tokens"]), float(b.get("weight", 1.0))) for b in objective["buckets"])


def _torchrun(args: argparse.Namespace) -> int:
    """Rank 0 tunes as usual with a coordinated bench; the other ranks serve measurements."""
    import os

    import torch.distributed as dist

    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise UsageError("--launcher torchrun: RANK and WORLD_SIZE are not set (start it with torchrun)")
    if args.bench not in ("model", "live"):
        raise UsageError("--launcher torchrun needs --bench model (CPUs, gloo) or --bench live (GPUs, NCCL)")
    world = int(os.environ["WORLD_SIZE"])
    if args.ep_size is not None and args.ep_size != world:
        raise UsageError(f"--launcher torchrun measures on its {world} ranks; --ep-size {args.ep_size} differs")
    args.ep_size = world
    from moepolicy.target import resolve_target
    from moepolicy.tuning.coordinate import CoordinatedBench, serve

    if args.bench == "live":
        import torch

        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        from moepolicy.tuning.live_bench import RankBench

        inner = RankBench(dist.group.WORLD, args.max_buffer_mb * 1024 * 1024 // 128 * 128)
    else:
        dist.init_process_group("gloo")
        from moepolicy.tuning.model_bench import ModelBench

        inner = ModelBench(resolve_target(gpu=args.gpu, ep_size=world, probe=False).gpu)
    try:
        if dist.get_rank() != 0:
            served = serve(inner)
            note(f"rank {dist.get_rank()}: measured {served} trials")
            return 0
        args.coordinated = CoordinatedBench(inner)
        try:
            return _run_local(args)
        finally:
            args.coordinated.close()
    finally:
        dist.barrier()
        dist.destroy_process_group()


def run(args: argparse.Namespace) -> int:
    if args.launcher == "torchrun":
        return _torchrun(args)
    return _run_local(args)


def _run_local(args: argparse.Namespace) -> int:
    from moepolicy.cli.plan import build_plan
    from moepolicy.tuning.space import load_objective, load_space

    if args.trials < 1:
        raise UsageError(f"--trials must be at least 1, got {args.trials}")
    if args.max_sms is not None and args.max_sms < 2:
        raise UsageError(f"--max-sms must be at least 2, got {args.max_sms}")
    if getattr(args, "coordinated", None) is not None:
        kind, why, gpus = args.bench, f"torchrun, {args.ep_size} ranks, rank 0 drives the study", args.ep_size
    else:
        kind, why, gpus = _bench_kind(args)
    note(f"bench: {kind} ({why})")
    if kind == "live" and args.ep_size is not None and args.ep_size != gpus and getattr(args, "coordinated", None) is None:
        raise UsageError(f"live tuning runs on the {gpus} visible GPUs; --ep-size {args.ep_size} differs "
                         f"(use --bench model, or run where {args.ep_size} GPUs are visible)")
    plan = build_plan(args, default_ep=gpus if kind == "live" else None)
    try:
        import optuna
    except ImportError:
        raise UsageError("tuning needs optuna: pip install 'moepolicy[tune]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    objective, space = load_objective(), load_space()
    from moepolicy.tuning.runner import redact, tune_plan

    tune_plan(plan, kind=kind, args=args, space=space, objective=objective,
                    buckets=_buckets(args, objective),
                    command=redact("moepolicy " + " ".join(shlex.quote(a) for a in sys.argv[1:])))
    note(f"wrote {args.output}")
    return 0
