"""The MoE step ``moepolicy bench`` times, per arm (``moe_step.arms``) and token bucket.

For each kind of MoE layer an arm runs: prepare (quantize then dispatch, or dispatch then quantize,
as the arm decides) → the expert stage on the received rows → finalize (combine). The expert stage
is DeepGEMM's (``measure.expert_stage.ReceivedRowsStage``: the w13 and w2 grouped fp8 GEMMs with
their quantizations, at the model's expert shapes) where it runs for the policy; elsewhere (CPUs, no
DeepGEMM, a wire it does not take) a stand-in of two matmuls per local expert, which the CLI names
and gives no ratio for (its hundreds of small ops per layer dilute every ratio toward 1). The
arm's step is the sum over its layer kinds of (layers of that kind) × (the kind's median time). Each
repetition counts its slowest rank (an EP step ends when its last rank does). Rounds take the arms in
carry-over-balanced orders (``rounds.balanced_rounds``, after a warm-up pass whose timings are
dropped), so a drifting machine falls on every arm alike, no arm always follows the same one, and the
first timings after the ranks start count for none.

Transports: DeepEP on GPUs (NCCL; the arm's SM count and chunk configs per bucket), or the emulated
all-to-all over gloo on CPUs, which checks the plumbing only and is labelled so.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Optional, Sequence

import torch
import torch.distributed as dist

from moepolicy.deepep.buffers import ht_buffer_bytes
from moepolicy.errors import MeasurementError
from moepolicy.measure.expert_stage import DeepGemmExperts, ReceivedRowsStage
from moepolicy.measure.ranks import START_TIMEOUT_S, RanksFailed, join_group, spawn_ranks, tell
from moepolicy.measure.rounds import balanced_rounds
from moepolicy.measure.routing import ExpertShape
from moepolicy.measure.timing import Timer, step_times
from moepolicy.moe_step.arms import Arm, LayerKind
from moepolicy.moe_step.experts import DEEPGEMM, STAND_IN
from moepolicy.names import LAUNCH_MODE, Order
from moepolicy.reference.prepare_finalize import PrepareFinalize, QuantSpec
from moepolicy.reference.transport import DeepEPTransport, GatherTransport


STAND_IN_STATIC_SCALE = 0.05


@dataclass(frozen=True)
class StepSpec:
    hidden: int
    num_experts: int
    top_k: int
    intermediate: int  # one expert's intermediate size (the model's with DeepGEMM's stage)
    tokens: tuple[int, ...]
    routings: tuple[str, ...]  # uniform | zipf
    rounds: int
    reps: int
    transport: str  # emulated | deepep
    # deepep: a names.Regime, timed in names.LAUNCH_MODE's mode; None on the emulated transport
    regime: Optional[str] = "host"
    zipf_s: float = 1.2
    seed: int = 0
    experts: str = STAND_IN  # DEEPGEMM: DeepGEMM's expert stage; STAND_IN: the named stand-in


def routing(tokens: int, num_experts: int, top_k: int, kind: str, seed: int, s: float = 1.2):
    """Top-k expert ids and weights: ``uniform`` (each token picks k distinct experts at random) or
    ``zipf`` (expert e is picked with weight 1/(e+1)^s, as skewed real traffic is)."""
    g = torch.Generator().manual_seed(seed)
    if kind == "uniform":
        weights = torch.ones(num_experts)
    elif kind == "zipf":
        weights = 1.0 / torch.arange(1, num_experts + 1, dtype=torch.float64) ** s
        weights = weights[
            torch.randperm(num_experts, generator=g)
        ]  # popular experts spread over ranks
    else:
        raise ValueError(f"routing must be uniform or zipf, got {kind!r}")
    idx = torch.multinomial(
        weights.float().expand(tokens, -1), top_k, replacement=False, generator=g
    )
    return idx.to(torch.int64), torch.rand(tokens, top_k, generator=g)


def _wire(flat: tuple) -> "object":
    """A wire (as the policy writes it) from its flattened form, for ``QuantSpec.from_wire``."""
    fields = dict(flat)
    scale = {k.split(".", 1)[1]: v for k, v in fields.items() if k.startswith("scale.")}
    return SimpleNamespace(
        dtype=fields["dtype"],
        scale=SimpleNamespace(
            granularity=scale.get("granularity"),
            group=scale.get("group"),
            dtype=scale.get("dtype"),
        )
        if scale
        else None,
    )


class StandInExperts:
    """Two matmuls per local expert on the rows routed to it, weighted and summed per received row.

    The rows are grouped by expert on the device, in groups sized by the per-expert counts DeepEP's
    dispatch already handed the host, so the host never waits here: like vLLM's expert kernels, the
    stand-in leaves DeepEP's dispatch the only place a step makes the host wait (what the runahead
    regime times)."""

    def __init__(self, local: int, hidden: int, intermediate: int, device, dtype):
        g = torch.Generator().manual_seed(7)
        self.w1 = (torch.randn(local, hidden, intermediate, generator=g) / hidden**0.5).to(
            device, dtype
        )
        self.w2 = (torch.randn(local, intermediate, hidden, generator=g) / intermediate**0.5).to(
            device, dtype
        )
        self.dtype = dtype

    def __call__(
        self,
        x: torch.Tensor,
        scales: Optional[torch.Tensor],
        topk_idx: torch.Tensor,
        topk_weights: torch.Tensor,
        tokens_per_expert: Sequence[int],
    ) -> torch.Tensor:
        """``topk_idx``: each received row's local experts (-1: another rank's); ``tokens_per_expert``:
        the rows each local expert received (DeepEP's ``num_recv_tokens_per_expert_list``)."""
        rows = _dequant(x, scales).to(self.dtype)
        out = torch.zeros(rows.shape[0], rows.shape[1], dtype=torch.float32, device=rows.device)
        top_k, flat = topk_idx.shape[1], topk_idx.reshape(-1)
        other_ranks = torch.full_like(flat, len(tokens_per_expert))  # sorted after the local ones
        by_expert = torch.argsort(torch.where(flat >= 0, flat, other_ranks), stable=True)
        pairs = by_expert[: sum(tokens_per_expert)]  # the (row, local expert) pairs, by expert
        weights = topk_weights.reshape(-1)[pairs].float().unsqueeze(1)
        start = 0
        for e, n in enumerate(tokens_per_expert):
            if n:
                which = pairs[start : start + n] // top_k
                h = torch.relu(rows[which] @ self.w1[e]) @ self.w2[e]
                out.index_add_(0, which, h.float() * weights[start : start + n])
            start += n
        return out


Experts = Callable[..., torch.Tensor]  # (rows, scales, topk_idx, topk_weights, tokens_per_expert)


def _experts(spec: StepSpec, world: int, device) -> Experts:
    """The rank's expert stage: DeepGEMM's at the model's shapes, or the stand-in."""
    if spec.experts == DEEPGEMM:
        shape = ExpertShape(spec.hidden, spec.intermediate, spec.num_experts, spec.top_k, world)
        return ReceivedRowsStage(DeepGemmExperts(shape, device))
    return StandInExperts(
        spec.num_experts // world,
        spec.hidden,
        spec.intermediate,
        device,
        torch.bfloat16 if device.type == "cuda" else torch.float32,
    )


def _dequant(x: torch.Tensor, scales: Optional[torch.Tensor]) -> torch.Tensor:
    if x.dtype == torch.bfloat16 or scales is None or scales.dtype != torch.float32:
        return x.float()  # bf16, or packed UE8M0 (the stand-in only needs the shapes and the work)
    groups = scales.shape[1]
    if groups == 1:
        return x.float() * scales
    return (x.float().view(x.shape[0], groups, -1) * scales[:, :, None]).view(x.shape)


class _Clock:
    """Per-repetition times of ``fn`` on every rank, reported as an EP step's time
    (``measure.timing.step_times``: the slowest rank per repetition, then the median); each timing
    done tells the supervisor this rank is alive (``bench``'s watchdog)."""

    def __init__(self, device, regime: Optional[str]):
        self.device, self.regime = device, regime
        self.timer = None
        if device.type == "cuda":
            self.timer = Timer(device)

    def median_us(self, fn, reps: int) -> float:
        if self.timer is not None:
            assert self.regime is not None, "a GPU rank times DeepEP, in its regime"
            us = self.timer.step_us(fn, reps, warmup=2, mode=LAUNCH_MODE[self.regime])["median_us"]
        else:
            us = step_times(_host_samples(fn, reps))["median_us"]
        tell("progress")
        return us


def _host_samples(fn, reps: int) -> list[float]:
    """Wall-clock microseconds of ``fn`` per repetition, each started after a barrier (CPUs)."""
    fn()  # warm-up
    xs = []
    for _ in range(reps):
        dist.barrier()
        start = time.perf_counter()
        fn()
        xs.append((time.perf_counter() - start) * 1e6)
    return xs


def _transport(arm: Arm, tokens: int, spec: StepSpec, buffer):
    if spec.transport == "emulated":
        return GatherTransport(None, spec.num_experts)
    import deep_ep

    bucket = arm.deepep.bucket_for(tokens)
    return DeepEPTransport(
        buffer,
        spec.num_experts,
        deep_ep.Config(arm.num_sms, *bucket.dispatch),
        deep_ep.Config(arm.num_sms, *bucket.combine),
        sources=False,  # the received rows' sources are for checks; reading them waits for the GPU
    )


def _kind_step(kind: LayerKind, transport, experts: Experts, inputs, backend: str):
    order = (
        kind.order
        if kind.order in (Order.QUANT_THEN_DISPATCH, Order.DISPATCH_THEN_QUANT)
        else Order.NO_QUANT.value
    )
    # a static per-tensor scale is the checkpoint's; the stand-in times the work with a fixed one
    spec = QuantSpec.from_wire(_wire(kind.consumes), static_scale=STAND_IN_STATIC_SCALE)
    pf = PrepareFinalize(order, spec, transport, backend=backend)
    x, idx, w = inputs

    def step():
        got = pf.prepare(x, idx, w)
        pf.finalize(
            experts(got.x, got.scales, got.topk_idx, got.topk_weights, got.tokens_per_expert),
            got.handle,
        )

    return step


def worker(rank: int, world: int, arms: tuple[Arm, ...], spec: StepSpec, outdir: str) -> None:
    """One rank: every (routing, bucket), rounds rotating over the arms; rank 0 writes the times."""
    gpu = spec.transport == "deepep"
    if gpu:  # a GPU per rank (NCCL), or ranks sharing the GPUs visible (gloo): measure.placement
        device = join_group(rank, world, f"{outdir}/rendezvous")
    else:
        dist.init_process_group(
            "gloo", rank=rank, world_size=world, init_method=f"file://{outdir}/rendezvous"
        )
        device = torch.device("cpu")
    buffer = _buffer(arms, spec, world) if gpu else None
    experts = _experts(spec, world, device)
    clock = _Clock(device, spec.regime)
    results: dict = {}
    done = 0
    tell("progress")  # up, with its buffer: from here the watchdog counts
    dist.barrier()
    if rank == 0:  # the group is up and its buffer made: measuring starts (a test waits for this)
        _progress(f"bench: {world} ranks ready, measuring")
    for r_kind in spec.routings:
        for tokens in spec.tokens:
            idx, w = routing(
                tokens, spec.num_experts, spec.top_k, r_kind, spec.seed + 31 * rank, spec.zipf_s
            )
            x = torch.randn(tokens, spec.hidden, generator=torch.Generator().manual_seed(rank)).to(
                torch.bfloat16
            )
            inputs = (x.to(device), idx.to(device), w.to(device))
            steps = {
                arm.name: [
                    (
                        k.count,
                        _kind_step(
                            k, _transport(arm, tokens, spec, buffer), experts, inputs, "auto"
                        ),
                    )
                    for k in arm.kinds
                ]
                for arm in arms
            }

            def time_once(name: str, steps=steps) -> float:
                return sum(count * clock.median_us(fn, spec.reps) for count, fn in steps[name])

            started = time.perf_counter()
            results.setdefault(r_kind, {})[str(tokens)] = balanced_rounds(
                [a.name for a in arms], time_once, spec.rounds, warm_up=True
            )
            if rank == 0:
                done += 1
                _progress(
                    f"bench: {done}/{len(spec.routings) * len(spec.tokens)} {r_kind} routing, {tokens} tokens: "
                    f"{spec.rounds} rounds in {time.perf_counter() - started:.1f} s"
                )
    if rank == 0:
        (Path(outdir) / "times.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


def _progress(line: str) -> None:
    """A progress line on the CLI's standard error (rank 0 of a spawned group writes it directly)."""
    print(line, file=sys.stderr, flush=True)


def _buffer(arms: tuple[Arm, ...], spec: StepSpec, world: int):
    import deep_ep

    nvl = max(
        ht_buffer_bytes(
            arm.num_sms,
            [c for b in arm.deepep.buckets for c in (b.dispatch, b.combine)],
            spec.hidden,
            world,
        )[0]
        for arm in arms
    )
    return deep_ep.Buffer(dist.group.WORLD, nvl, 0)


def run(arms: tuple[Arm, ...], spec: StepSpec, world: int, outdir: str, watchdog_s: float) -> dict:
    """Spawn ``world`` ranks, run the benchmark, return {routing: {tokens: {arm: [us per round]}}}.
    A rank that dies or raises, or sends nothing for ``watchdog_s`` (a hung collective), ends every
    rank and the run in one line; the ranks ignore Ctrl-C, which ends them here and is raised again."""
    os.makedirs(outdir, exist_ok=True)
    # quiet: Ctrl-C is the bench's; it ends the ranks (group.kill) and says nothing was written
    group = spawn_ranks(worker, [(world, arms, spec, outdir)] * world, quiet=True)
    try:
        group.watch(watchdog_s, "timing the MoE step", start_s=max(START_TIMEOUT_S, watchdog_s))
    except RanksFailed as exc:
        if exc.hung:
            who = (
                "no rank finished a timing (one stuck in a collective holds up the others)"
                if exc.rank is None
                else f"rank {exc.rank} finished no timing while the others waited"
            )
            raise MeasurementError(
                f"a benchmark rank hung: {who} within --watchdog {watchdog_s:g} s; every rank "
                "was ended"
            ) from None
        raise MeasurementError(f"a benchmark rank failed: {exc}") from None
    finally:
        group.kill()
    return json.loads((Path(outdir) / "times.json").read_text())


def spec_doc(spec: StepSpec) -> dict:
    return asdict(spec)
