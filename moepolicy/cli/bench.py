"""``moepolicy bench POLICY``: the MoE step with this policy against vLLM's choices and DeepEP's defaults.

Per routing (uniform, Zipf) and token bucket: dispatch → the expert stage (DeepGEMM's where it runs
for the policy, else a named stand-in whose times are never compared: ``moe_step.experts``) → combine,
for every kind of MoE layer the model has, weighted by its layer count; interleaved rounds, each
repetition counting its slowest rank; the policy's paired per-round speed-up over each baseline with
its 95 % interval (``measure.rounds``), each "faster" or "slower" claim tested with the exact
sign-flip test under Holm's correction over every comparison of the run (a run makes 2 per routing
and bucket). With too few rounds for that, the speed-ups are shown untested. On GPUs with DeepEP it
runs DeepEP in the policy's regime; elsewhere the emulated all-to-all on CPU checks the plumbing only:
it says "plumbing ok" and compares nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from moepolicy.cli._output import (
    STDOUT,
    add_output_flag,
    command_inputs,
    note,
    output_path,
    table,
    write_output,
)
from moepolicy.errors import MeasurementError, UsageError, carry
from moepolicy.measure.placement import SHARED_LABEL
from moepolicy.moe_step.experts import BenchExperts

from moepolicy.names import Regime

# four cycles of the three arms' balanced order: two decide (12 rounds; 12 comparisons under Holm
# need 9), two report
BENCH_ROUNDS = 24

RUN_AHEAD = 8  # measure.timing.RUN_AHEAD_CALLS (timing imports torch; a test keeps them equal)

WHAT_IT_IS = (
    "DeepEP following each arm's choices (the 'vllm' arm runs vLLM's choices, not vLLM itself)"
)
EMULATED = "emulated all-to-all on CPU (gloo): plumbing only, not a performance number"
MAX_EMULATED_RANKS = 64  # processes on one machine, each a rank of the emulated all-to-all
MAX_REPS = 10_000
TORCH_CPU = (
    "pip install torch --index-url https://download.pytorch.org/whl/cpu"  # the README's too
)
MAX_WATCHDOG_S = 86_400.0
WATCHDOG_S = 120.0  # the default --watchdog: far above one timing, far below NCCL's 10 minutes


# an interrupted bench keeps nothing: its ranks' times are written once, at the end
NOTHING_WRITTEN = ": nothing was written (a bench keeps no partial times; run it again)"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench", help="time the MoE step with the policy vs vLLM's choices vs DeepEP's defaults"
    )
    p.add_argument("policy", help="policy file")
    p.add_argument(
        "--tokens",
        help="tokens per rank, e.g. 128,1024,4096 (default: that on GPUs, 32,128 emulated)",
    )
    p.add_argument(
        "--routing", default="uniform,zipf", help="uniform, zipf or both (default uniform,zipf)"
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=BENCH_ROUNDS,
        help=f"interleaved rounds (default {BENCH_ROUNDS}): half decide, whole cycles of the balanced "
        "order (Holm's correction over every comparison of the run: 12 comparisons need 9 "
        "deciding rounds), the other half give the figures shown",
    )
    p.add_argument(
        "--reps",
        type=int,
        default=None,
        help="repetitions per timing (default 10 on GPUs, 3 emulated)",
    )
    p.add_argument(
        "--transport",
        choices=["auto", "deepep", "emulated"],
        default="auto",
        help="deepep (GPUs), emulated (CPU, plumbing only) or auto (deepep when it can run)",
    )
    p.add_argument(
        "--regime",
        choices=list(Regime.values()),
        default=None,
        help="what a timing includes on GPUs (default: the policy's regime): host (each step from an idle "
        "GPU, the host's launches counted: an upper bound), gpu (the GPU's own time: a CUDA-graph engine) "
        f"or runahead ({RUN_AHEAD} steps back to back, the host running ahead except where DeepEP's "
        "dispatch waits for its counts: an eager engine such as vLLM's DeepEP high-throughput path)",
    )
    p.add_argument(
        "--ranks",
        type=int,
        default=2,
        help=f"ranks of the emulated transport, 1 to {MAX_EMULATED_RANKS} (default 2)",
    )
    p.add_argument(
        "--watchdog",
        type=float,
        default=WATCHDOG_S,
        help=f"seconds a rank may go without finishing a timing before the bench ends every rank and "
        f"says which hung, in one line, exit 9 (default {WATCHDOG_S:g})",
    )
    add_output_flag(
        p,
        "the raw per-round times and the comparison as JSON (with '-', the table goes to stderr)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="read the policy and say what would be timed (arms, layers, ranks); start nothing",
    )
    p.add_argument(
        "--null",
        action="store_true",
        help="an A/A check: time the arms even where they make the same choices (a policy planned "
        "with --rules vllm), so every 'faster' or 'slower' the run claims is a false one",
    )
    p.set_defaults(run=run)


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        values = tuple(sorted({int(t) for t in text.split(",") if t.strip()}))
    except ValueError:
        raise UsageError(f"{flag} takes integers like 128,1024, got {text!r}") from None
    if not values or values[0] <= 0:
        raise UsageError(f"{flag} needs positive counts, got {text!r}")
    return values


def _transport(asked: str, ep_size: int) -> tuple[str, int, str]:
    """(transport, ranks, why). DeepEP with a GPU per rank; asked for on fewer GPUs, DeepEP's ranks
    share them: a functional run (no times compared); else the emulated transport."""
    from moepolicy.tuning.live_bench import deep_ep_importable, visible_gpus

    if asked == "emulated":
        return "emulated", 0, "asked for the emulated transport"
    gpus, missing = visible_gpus(), deep_ep_importable()
    if gpus >= 2 and not missing and gpus >= ep_size:
        from moepolicy.measure.ranks import gpu_placement

        gpu_placement(ep_size, gpus)  # peer access between the ranks' GPUs, before any rank starts
        return "deepep", ep_size, f"deep_ep imports and {gpus} GPUs are visible"
    if asked == "deepep" and gpus >= 1 and not missing:
        return "deepep", ep_size, f"{ep_size} ranks on {gpus} GPU(s): {SHARED_LABEL}"
    why = missing or f"{gpus} CUDA GPU(s) visible for EP{ep_size}"
    if asked == "deepep":
        raise MeasurementError(f"--transport deepep: {why}")
    return (
        "emulated",
        0,
        f"{why}; --transport deepep runs DeepEP's ranks on the GPUs there are, as a functional check",
    )


def _say_fused(doc) -> None:
    fused = sum(1 for layer in doc.layers if layer.order == "fused")
    if fused:
        note(
            f"{fused} fused layers (the expert kernel does its own communication) are not timed here"
        )


def _require_torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise UsageError(
            f"bench needs torch (any build; the CPU build is enough for the emulated transport; "
            f"PyTorch's CPU index gives it: {TORCH_CPU})"
        ) from None


def run(args: argparse.Namespace) -> int:
    import tempfile

    from moepolicy.cli._replay import read_for_replay

    _check_counts(args)
    output = output_path(args.output, command_inputs(args))  # before any work
    doc = read_for_replay(args.policy).doc
    routings = _checked_request(args, doc)
    kind, world, why = _transport(args.transport, doc.target.ep_size)
    world = world or args.ranks
    emulated = kind == "emulated"
    functional = EMULATED if emulated else (why if SHARED_LABEL in why else "")
    tokens = (
        _ints(args.tokens, "--tokens")
        if args.tokens
        else ((32, 128) if emulated else (128, 1024, 4096))
    )
    _require_torch()
    from moepolicy.moe_step.experts import bench_experts
    from moepolicy.moe_step.measure import run as run_step, spec_doc

    if doc.model.num_experts % world:
        raise UsageError(f"{doc.model.num_experts} experts do not divide over --ranks {world}")
    arms = _timed_arms(args.policy, doc)
    experts = bench_experts(doc, arms, kind)
    if not functional and not experts.comparable:
        functional = experts.what
    spec = _step_spec(args, doc, kind, tokens, routings, experts)
    _announce(spec, arms, (kind, world, why), functional, args.regime, experts)
    if same_step(arms, spec.tokens) and not args.null:
        note(
            f"nothing to compare: the {len(arms)} arms make the same choices here (the same orders "
            f"and wires, {arms[0].num_sms} SMs and the same DeepEP configs at every bucket), so the "
            "bench would time one MoE step several times; not timed. A policy whose decisions or "
            "DeepEP settings differ from vLLM's (a live tune, another --expert-kernel, a static fp8 "
            "checkpoint) has something to compare; --null times them anyway (an A/A check)"
            + (f"; {args.output} was not written" if args.output and args.output != STDOUT else "")
        )
        return 0
    if args.dry_run:
        note(
            f"dry run: {len(spec.routings)} routing(s) x {len(spec.tokens)} bucket(s) x {spec.rounds} rounds "
            f"x {spec.reps} reps not started"
        )
        return 0
    note(
        f"timing {len(arms)} arms x {len(routings)} routing(s) x {len(tokens)} bucket(s), {args.rounds} rounds of "
        f"{spec.reps} repetitions; progress per bucket below"
    )
    with tempfile.TemporaryDirectory(prefix="moepolicy-bench-") as tmp:
        try:
            times = run_step(arms, spec, world, tmp, args.watchdog)
        except KeyboardInterrupt as exc:  # the ranks are ended; their times are lost with them
            carry(exc, moepolicy_outcome=NOTHING_WRITTEN)
            raise
    rows = comparison(times)
    render(rows, functional, args.rounds, out=sys.stderr if args.output == STDOUT else sys.stdout)
    if args.output:
        write_output(
            output,
            json.dumps(
                {
                    "what": functional or WHAT_IT_IS,
                    "experts": experts.what,
                    "transport": kind,
                    "ranks": world,
                    "policy": args.policy,
                    "spec": spec_doc(spec),
                    "arms": {a.name: a.label for a in arms},
                    "times_us": times,
                    "times_are": "microseconds per forward pass through every MoE layer: each kind of "
                    "layer's step timed, times its layer count, per round",
                    "comparison": [] if functional else rows,
                },
                indent=1,
            )
            + "\n",
        )
    return 0


def _timed_arms(policy: str, doc):
    """The arms a bench times (``moe_step.arms``), after saying which layers it leaves out."""
    from moepolicy.moe_step.arms import build_arms

    _say_fused(doc)
    arms = build_arms(doc)
    if not arms[0].kinds:
        raise UsageError(f"{policy}: no MoE layer goes through DeepEP's dispatch; nothing to time")
    return arms


def same_step(arms, tokens) -> bool:
    """Every arm runs the same MoE step at every token count timed: the same layer kinds (order,
    wire, what the experts consume), SM count and chunk configs."""

    def step(arm):
        configs = [arm.deepep.bucket_for(t) for t in tokens]
        return arm.kinds, arm.num_sms, [(b.dispatch, b.combine) for b in configs]

    return all(step(arm) == step(arms[0]) for arm in arms[1:])


def _announce(
    spec, arms, transport: tuple, functional: str, asked_regime, experts: BenchExperts
) -> None:
    """What is about to be timed: the transport and why, the expert stage, the regime (DeepEP only)
    and each arm's layers; one thought per line (the first: what runs, and what it is)."""
    kind, world, why = transport
    emulated = spec.transport == "emulated"
    if emulated and asked_regime:
        note("--regime applies to DeepEP on GPUs; the emulated transport times plumbing only")
    regime = "" if emulated else f", {spec.regime} regime"
    note(f"bench: {kind}, {world} ranks{regime}; {functional or WHAT_IT_IS}")
    if why != functional:
        note(f"  transport: {why}")
    if experts.what != functional:
        note(f"  experts: {experts.what}")
    if experts.other_kernels:
        note(f"  experts: {experts.other_kernels}")
    for arm in arms:
        note(
            f"  {arm.name}: {arm.label}; "
            + ", ".join(f"{k.count} layers {k.order}" for k in arm.kinds)
        )


def _step_spec(args: argparse.Namespace, doc, kind: str, tokens, routings, experts: BenchExperts):
    """What each rank times (``moe_step.measure.StepSpec``) for this policy and these flags."""
    from moepolicy.moe_step.measure import StepSpec

    emulated = kind == "emulated"
    return StepSpec(
        doc.model.hidden_size,
        doc.model.num_experts,
        doc.model.top_k,
        intermediate=experts.intermediate,
        tokens=tokens,
        routings=routings,
        rounds=args.rounds,
        reps=args.reps or (3 if emulated else 10),
        transport=kind,
        regime=None if emulated else (args.regime or doc.deepep.regime),  # no GPU timing emulated
        experts=experts.stage,
    )


def _checked_request(args: argparse.Namespace, doc) -> tuple[str, ...]:
    """What ``bench`` is asked to time, checked against the policy: its routings."""
    if doc.target.backend != "deepep_ht":
        raise UsageError(
            f"{args.policy}: bench times DeepEP high-throughput; this policy is for {doc.target.backend}"
        )
    if args.rounds < 1:
        raise UsageError(f"--rounds must be at least 1, got {args.rounds}")
    routings = tuple(r.strip() for r in args.routing.split(",") if r.strip())
    bad = [r for r in routings if r not in ("uniform", "zipf")]
    if bad or not routings:
        raise UsageError(f"--routing takes uniform, zipf or both, got {args.routing!r}")
    return routings


def _check_counts(args: argparse.Namespace) -> None:
    """The counts a bench runs with, checked before anything is read or started."""
    if args.reps is not None and not 1 <= args.reps <= MAX_REPS:
        raise UsageError(f"--reps must be from 1 to {MAX_REPS}, got {args.reps}")
    if not (math.isfinite(args.watchdog) and 0 < args.watchdog <= MAX_WATCHDOG_S):
        raise UsageError(
            f"--watchdog must be a number of seconds above 0, at most {MAX_WATCHDOG_S:g}, got "
            f"{args.watchdog}"
        )
    if not 1 <= args.ranks <= MAX_EMULATED_RANKS:
        raise UsageError(
            f"--ranks must be from 1 to {MAX_EMULATED_RANKS} (processes of the emulated transport), "
            f"got {args.ranks}"
        )


BASELINES = ("vllm", "deepep-default")


def comparison(times: dict) -> list[dict]:
    """Per routing and bucket: each arm's median over rounds, and the policy against each baseline.
    The verdicts come from half the rounds, whole cycles of the balanced design (the exact test under
    Holm's correction over every comparison of the run); every figure shown, a speed-up and its
    interval, from the other half, which decided nothing (a figure from the rounds that decided
    would overstate a small gain)."""
    import statistics

    from moepolicy.measure.rounds import holm, least_rounds, paired_speedup, split_by_cycle
    from moepolicy.tuning.protocol import decision_doc, figure

    def pick(xs: list, rounds: list[int]) -> list:
        return [xs[r] for r in rounds]

    rows, tests, reported = [], [], []
    for routing, by_tokens in times.items():
        for tokens, arms in by_tokens.items():
            rows.append(
                {
                    "routing": routing,
                    "tokens": int(tokens),
                    "median_us": {
                        name: round(statistics.median(xs), 2) for name, xs in arms.items()
                    },
                }
            )
            decide, report = split_by_cycle(len(arms["policy"]), len(arms))
            for base in BASELINES:
                names = ("the policy", base)
                base_d, policy_d = pick(arms[base], decide), pick(arms["policy"], decide)
                tests.append(paired_speedup(base_d, policy_d, names=names))
                reported.append((pick(arms[base], report), pick(arms["policy"], report), names))
    deciding = tests[0].rounds if tests else 0
    needed = least_rounds(len(tests))
    tested = holm(tests, "both", "comparisons of this run") if deciding >= needed else tests
    for i, row in enumerate(rows):
        for j, base in enumerate(BASELINES):
            k = 2 * i + j
            base_r, policy_r, names = reported[k]
            shown = figure(base_r, policy_r, names, family=len(tests)).to_doc() if base_r else {}
            verdict = (
                tested[k].verdict
                if deciding >= needed
                else f"untested: {deciding} deciding rounds cannot test {len(tests)} comparisons at "
                f"5% (needs {needed}: --rounds {BENCH_ROUNDS})"
            )
            row[f"vs_{base}"] = {
                "speedup": shown.get("speedup"),
                "ci95": shown.get("ci95"),
                **shown,
                "verdict": verdict,
                "correction": tested[k].correction,
                "gate": decision_doc(tested[k]),
            }
    return rows


def _ratio(r: dict) -> str:
    from moepolicy.measure.rounds import interval_words, speedup_words

    low, high = r["ci95"] if r.get("ci95") else (None, None)
    verdict = r["verdict"]
    tail = {"faster": "", "slower": ", a loss beyond noise"}.get(
        verdict, ", " + verdict.split(":")[0]
    )
    if r.get("speedup") is None:  # one round: nothing left to report from
        return f"no report rounds{tail}"
    return f"{speedup_words(r['speedup'])}{tail} [{interval_words(low, high)}]"


def render(rows: list[dict], functional: str, rounds: int = 0, out=None) -> None:
    """The comparison table; for a functional run (``functional`` says why: the emulated transport,
    or DeepEP's ranks sharing a GPU) only that every arm ran end to end."""
    out = out or sys.stdout
    if functional:
        runs = sum(len(r["median_us"]) for r in rows)
        print(
            f"plumbing ok: {runs} arm runs ({len(rows)} routing x bucket pairs, {rounds} rounds each) went end to "
            f"end; {functional}: no time is shown or compared",
            file=out,
        )
        return
    table(
        [
            "routing",
            "tokens",
            "policy us",
            "vllm us",
            "deepep-default us",
            "policy vs vllm",
            "vs deepep-default",
        ],
        [
            [
                r["routing"],
                r["tokens"],
                r["median_us"]["policy"],
                r["median_us"]["vllm"],
                r["median_us"]["deepep-default"],
                _ratio(r["vs_vllm"]),
                _ratio(r["vs_deepep-default"]),
            ]
            for r in rows
        ],
        out=out,
    )
    family = rows[0]["vs_vllm"].get("correction", "") if rows else ""
    decide = rows[0]["vs_vllm"]["gate"]["rounds"] if rows else 0
    print(
        f"medians over all {rounds} rounds; 'faster'/'slower' only beyond noise, decided on {decide} "
        f"of them (whole cycles of the balanced order; exact signed-rank sign-flip test, 2.5% per "
        f"side, {family or 'one comparison'}); each speed-up and its 95% interval (simultaneous over "
        f"the run's comparisons) from the other {rounds - decide}, which decided nothing",
        file=out,
    )
