"""The live bench for DeepEP v2 (``deep_ep.ElasticBuffer``): one supervised process per GPU, as the
live bench runs, answering v2 measurements.

Unverified here: no machine this project can use runs DeepEP v2 (it needs NCCL with GIN); the
worker group's plumbing is tested on CPUs with stand-in workers (``moepolicy.testing.fake_deepep``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from moepolicy.tuning.bench import TrialFailed, Workload
from moepolicy.names import LAUNCH_MODE
from moepolicy.tuning.live_bench import LiveBench, serve_commands
from moepolicy.tuning.v2_tune import V2Point

MAX_TOKENS = 8192  # per rank: the buffers are sized once for the largest bucket the tuner uses


@dataclass
class V2RankState:
    """One rank's ElasticBuffers (one per prefer-overlap setting, made on first use), inputs per
    bucket, timer and repeats."""

    group: Any
    rank: int
    device: Any
    timer: Any
    reps: int
    buffers: dict = field(default_factory=dict)
    works: dict = field(default_factory=dict)

    def buffer(self, workload: Workload, prefer_overlap: bool):
        import deep_ep

        if prefer_overlap not in self.buffers:
            self.buffers[prefer_overlap] = deep_ep.ElasticBuffer(
                self.group,
                num_max_tokens_per_rank=MAX_TOKENS,
                hidden=workload.hidden,
                num_topk=workload.top_k,
                use_fp8_dispatch=workload.payload == "fp8",
                prefer_overlap_with_compute=prefer_overlap,
            )
        return self.buffers[prefer_overlap]


def measure_v2_point(state: V2RankState, workload: Workload, point: V2Point, tokens: int) -> float:
    """Dispatch (fp8 with 1x128 float32 scales, or bf16) plus combine, in µs, the slowest rank's median."""
    import torch

    from moepolicy.measure.deepep_ops import make_workload
    from moepolicy.quant import triton_kernels

    if tokens > MAX_TOKENS:
        raise TrialFailed(f"{tokens} tokens per rank is above the v2 bench's {MAX_TOKENS}")
    buffer = state.buffer(workload, point.prefer_overlap)
    key = (tokens, workload.hidden, workload.num_experts, workload.top_k, workload.routing)
    if key not in state.works:
        work = make_workload(
            tokens,
            workload.hidden,
            workload.num_experts,
            workload.top_k,
            state.rank,
            state.device,
            routing=workload.routing,
        )
        x = triton_kernels.per_token_group(work.x, 128) if workload.payload == "fp8" else work.x
        state.works[key] = (work, x)
    work, x = state.works[key]

    def dispatch():
        return buffer.dispatch(
            x,
            topk_idx=work.topk_idx,
            topk_weights=work.topk_weights,
            num_experts=work.num_experts,
            num_sms=point.num_sms,
        )

    received, _, _, handle, _ = dispatch()
    rows = (received[0] if isinstance(received, tuple) else received).shape[0]
    y = torch.ones(rows, workload.hidden, dtype=torch.bfloat16, device=state.device)
    mode = LAUNCH_MODE[workload.regime]
    dispatch_us = state.timer.step_us(dispatch, state.reps, mode=mode)["median_us"]
    combine_us = state.timer.step_us(lambda: buffer.combine(y, handle), state.reps, mode=mode)[
        "median_us"
    ]
    return dispatch_us + combine_us


def _v2_worker(
    rank: int, world: int, rendezvous: str, buffer_bytes: int, commands, results, reps: int
) -> None:
    import torch.distributed as dist

    from moepolicy.measure.ranks import join_group
    from moepolicy.measure.timing import Timer

    device = join_group(rank, world, rendezvous)
    state = V2RankState(dist.group.WORLD, rank, device, Timer(device), reps)
    serve_commands(
        rank,
        commands,
        results,
        {
            "v2": lambda token, workload, point, tokens: measure_v2_point(
                state, workload, point, tokens
            )
        },
    )
    dist.destroy_process_group()


class V2LiveBench(LiveBench):
    """The supervised worker group, answering DeepEP v2 measurements (``V2Bench``)."""

    def __init__(self, world: int, trial_timeout_s: float = 90.0, reps: int = 20, worker=None):
        super().__init__(
            world, 0, trial_timeout_s=trial_timeout_s, reps=reps, worker=worker or _v2_worker
        )

    def measure_v2(self, workload: Workload, point: V2Point, tokens: int) -> float:
        us = self._ask(
            "v2",
            (workload, point, tokens),
            f"measuring DeepEP v2 at {point.name}, {tokens} tokens",
        )
        if not isinstance(us, (int, float)) or not us > 0:
            raise TrialFailed(
                f"DeepEP v2 measurement at {point.name} is not a positive time: {us!r}"
            )
        return float(us)
