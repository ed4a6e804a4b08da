"""The live bench: one process per GPU running DeepEP, supervised by the tuning process.

The tuning process (the only optuna client) sends each trial's config to every worker; the workers
measure it together (NCCL + DeepEP) and rank 0 answers with the step's times, taken as every GPU
time is (``measure.timing.step_times``: the slowest rank in each repetition, then the median). The
workers are ranks of the one harness (``measure.ranks``); a per-trial watchdog kills the whole group
when a worker dies or a measurement hangs (a DeepEP device trap poisons the CUDA context and strands
the peers), the trial fails with the reason, and the next measurement starts a fresh group.
"""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from moepolicy.names import LAUNCH_MODE
from moepolicy.tuning.bench import (
    Bench,
    Measurement,
    TrialFailed,
    TunePoint,
    Workload,
    check_measurement,
)
from moepolicy.deepep.buffers import budget_buffers
from moepolicy.measure.placement import SHARED_LABEL
from moepolicy import hardware

if TYPE_CHECKING:
    from moepolicy.measure.ranks import RankGroup


def _worker(
    rank: int, world: int, rendezvous: str, buffer_bytes: int, commands, results, reps: int
) -> None:
    import torch.distributed as dist

    from moepolicy.measure.deepep_ops import join_rank
    from moepolicy.measure.timing import Timer

    device, buffer = join_rank(rank, world, rendezvous, buffer_bytes)
    state = RankState(buffer, rank, device, Timer(device), reps)

    serve_commands(
        rank,
        commands,
        results,
        {
            "measure": lambda token, workload, point: measure_point(state, workload, point),
            "overlap": lambda token, workload, point, gemm_shape: _overlap(
                state, workload, point, gemm_shape
            ),
        },
    )
    dist.destroy_process_group()


def serve_commands(rank: int, commands, results, handlers) -> None:
    """A worker's loop: answer each (token, kind, args) with ``handlers[kind](token, *args)`` until ``None``.
    Every rank measures (the measurement is collective); rank 0 answers; an error from any rank is
    reported."""
    results.put(("ready", rank, None))
    while True:
        command = commands.get()
        if command is None:
            return
        token, kind, args = command
        try:
            value = handlers[kind](token, *args)
            if rank == 0 and value is not None:
                results.put(("ok", token, value))
        except Exception as exc:  # noqa: BLE001 (reported as a FAIL trial)
            results.put(
                (
                    "error",
                    token,
                    f"rank {rank}: {type(exc).__name__}: {exc}"
                    f" [{traceback.format_exc(limit=2).splitlines()[-1]}]",
                )
            )


@dataclass
class RankState:
    """What one rank measures with: its DeepEP buffer, GPU, timer and repeats, and the inputs it has
    built (routed tokens per bucket, expert GEMM operands, green contexts), kept across trials."""

    buffer: Any
    rank: int
    device: Any
    timer: Any
    reps: int
    works: dict = field(default_factory=dict)

    def ops(self, workload: Workload, point: TunePoint):
        """DeepEP dispatch/combine of ``point``'s configs over this bucket's routed tokens."""
        import deep_ep

        from moepolicy.measure.deepep_ops import DeepEPOps, make_workload

        key = (
            point.tokens,
            workload.hidden,
            workload.num_experts,
            workload.top_k,
            workload.routing,
        )
        if key not in self.works:
            self.works[key] = make_workload(
                point.tokens,
                workload.hidden,
                workload.num_experts,
                workload.top_k,
                self.rank,
                self.device,
                routing=workload.routing,
            )
        return DeepEPOps(
            self.buffer,
            self.works[key],
            deep_ep.Config(point.num_sms, *point.dispatch),
            deep_ep.Config(point.num_sms, *point.combine),
        )


def measure_point(state: RankState, workload: Workload, point: TunePoint) -> Measurement:
    """One collective measurement on this rank (every rank calls it with the same point): the full
    dispatch call, the cached-handle kernel, combine, and both orders when asked; each an EP step's
    time (``Timer.step_us``)."""
    ops = state.ops(workload, point)
    payload, mode = workload.payload, LAUNCH_MODE[workload.regime]

    def timed(fn) -> float:
        return state.timer.step_us(fn, state.reps, mode=mode)["median_us"]

    full = timed(lambda: ops.dispatch_only(payload, "full"))
    cached = timed(lambda: ops.dispatch_only(payload, "cached"))
    combine = timed(ops.combine)
    orders = {}
    if workload.both_orders:
        both = {
            "quant_then_dispatch": lambda: ops.quant_then_dispatch("full"),
            "dispatch_then_quant": lambda: ops.dispatch_then_quant("full"),
        }
        for name in sorted(both, key=lambda n: n != workload.orders_first):
            # the round's first order first
            orders[name] = timed(both[name])
    return Measurement(full, cached, combine, "measured", orders)


class RankBench(Bench):
    """The live bench for ``torchrun``: this process measures on its own GPU, in the job's process
    group, together with every other rank (multi-node EP). No supervisor here: torchrun restarts
    a failed job (``--max-restarts``) and the study resumes."""

    name = "live"
    source = "measured"

    def __init__(self, group, buffer_bytes: int, reps: int = 20, max_sms: int = 64, device=None):
        import deep_ep
        import torch
        import torch.distributed as dist

        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.device = device or torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(self.device)

        internode = self.world > 8
        nvl, rdma = budget_buffers(buffer_bytes, self.world)
        self.buffer = deep_ep.Buffer(
            group, nvl, rdma, num_qps_per_rank=max(max_sms, 24) if internode else 1
        )
        # torch: the worker's side
        from moepolicy.measure.timing import Timer

        self.state = RankState(
            self.buffer, self.rank, self.device, Timer(self.device, group), reps
        )

    def measure(self, workload: Workload, point: TunePoint) -> Measurement:
        try:
            measured = measure_point(self.state, workload, point)
        except Exception as exc:  # noqa: BLE001 (a host assert; a device trap would end the job)
            raise TrialFailed(f"rank {self.rank}: {type(exc).__name__}: {exc}") from None
        return check_measurement(measured)

    def identity(self) -> str:
        import torch

        return f"{torch.cuda.get_device_name(self.device)} x{self.world} (torchrun)"


def _overlap(state: RankState, workload: Workload, point: TunePoint, gemm_shape) -> dict:
    import torch

    from moepolicy.measure.overlapped_step import ConfinedGemm, ExpertGemm, measure_overlap

    ops, works = state.ops(workload, point), state.works
    sm_count = torch.cuda.get_device_properties(state.device).multi_processor_count
    expert_key = (
        "expert-gemm",
        gemm_shape.rows,
        gemm_shape.hidden,
        gemm_shape.out,
        gemm_shape.kind,
        point.tokens,
    )
    if expert_key not in works:  # operands once per bucket (weights once per expert stack)
        works[expert_key] = ExpertGemm(
            gemm_shape,
            state.device,
            ops.rows_per_local_expert,
            works.setdefault("expert-weights", {}),
        )
    confined_key = ("confined-gemm", gemm_shape, point.tokens, sm_count - point.num_sms)
    if confined_key not in works:  # one green context per split, reused
        works[confined_key] = ConfinedGemm(
            works[expert_key], sm_count - point.num_sms, gemm_shape.confine
        )
    gemm = works[confined_key]

    def comm(region: str = "full"):
        ops.dispatch_only(workload.payload, region)
        ops.combine()

    result = measure_overlap(
        comm, gemm, state.reps, state.timer, comm_no_wait=lambda: comm("no-wait")
    )
    result.update(
        {
            "comm_sms": point.num_sms,
            "gemm_sms": sm_count - point.num_sms,
            "gemm_fp8": gemm.fp8,
            "gemm_tflop": gemm.flops / 1e12,
        }
    )
    return result


class LiveBench(Bench):
    name = "live"
    source = "measured"

    def __init__(
        self,
        world: int,
        buffer_bytes: int,
        trial_timeout_s: float = 90.0,
        reps: int = 20,
        start_timeout_s: float = 180.0,
        worker=None,
    ):
        self.world, self.buffer_bytes = world, buffer_bytes
        self.trial_timeout_s, self.start_timeout_s, self.reps = (
            trial_timeout_s,
            start_timeout_s,
            reps,
        )
        self._worker = worker or _worker
        self._group: Optional[RankGroup] = None  # while the workers run
        self._commands: list = []
        self._token = 0
        self.restarts = 0

    def _start_group(self) -> None:
        # worker processes: only a live bench starts them
        from moepolicy.measure.ranks import context, rendezvous_file, spawn_ranks

        self._commands = [context().Queue() for _ in range(self.world)]
        results = context().Queue()  # the group's events: ready, and rank 0's answers
        rendezvous = rendezvous_file("moepolicy-live-")
        self._group = spawn_ranks(
            self._worker,
            [
                (self.world, rendezvous, self.buffer_bytes, q, results, self.reps)
                for q in self._commands
            ],
            quiet=True,  # Ctrl-C is the supervisor's: it stops or kills the group
            events=results,
        )
        ready = 0
        deadline = time.monotonic() + self.start_timeout_s
        while ready < self.world:
            kind, _, payload = self._get(deadline, "starting the worker group")
            if kind == "ready":
                ready += 1

    def _get(self, deadline: float, what: str):
        """The next answer from the workers; a worker's death or a deadline passed kill the group
        and fail the trial."""
        from moepolicy.measure.ranks import RanksFailed

        assert self._group is not None, "read only while the workers run"
        try:
            event = self._group.next_event(deadline, what)
        except RanksFailed as exc:
            self._kill_group(failed=True)
            if exc.hung:
                raise TrialFailed(
                    f"no answer within the watchdog while {what}; group killed and restarted"
                ) from None
            if exc.detail:
                raise TrialFailed(f"worker {exc}; group restarted") from None
            raise TrialFailed(
                f"worker died while {what} (rank {exc.rank} exit {exc.exitcode}); group restarted"
            ) from None
        if event[0] == "exited":  # a worker ends only when told to
            self._kill_group(failed=True)
            raise TrialFailed(
                f"worker died while {what} (rank {event[1]} exit 0); group restarted"
            )
        return event

    def _kill_group(self, failed: bool = False) -> None:
        if self._group is not None:
            self._group.kill()
            if failed:
                self.restarts += 1
        self._group = None

    def _ask(self, kind: str, args: tuple, what: str):
        """Every rank runs ``kind`` on ``args``; rank 0's answer (a failure kills the group: a failed
        collective leaves peers in an unknown state)."""
        if self._group is None:
            self._start_group()
        self._token += 1
        for q in self._commands:
            q.put((self._token, kind, args))
        deadline = time.monotonic() + self.trial_timeout_s
        while True:
            answer, token, payload = self._get(deadline, what)
            if token != self._token:
                continue  # a late answer from an earlier trial
            if answer == "error":
                self._kill_group(failed=True)
                raise TrialFailed(payload)
            return payload

    def measure(self, workload: Workload, point: TunePoint) -> Measurement:
        return check_measurement(self._ask("measure", (workload, point), f"measuring {point}"))

    def measure_overlap(self, workload: Workload, point: TunePoint, gemm_shape) -> dict:
        """Dispatch + combine on ``point.num_sms`` SMs beside a GEMM on the rest (green context)."""
        return self._ask(
            "overlap", (workload, point, gemm_shape), f"measuring overlap at {point.num_sms} SMs"
        )

    def restart(self) -> None:
        """The next measurement starts a fresh worker group (new processes, a new DeepEP buffer)."""
        self._kill_group()

    def identity(self) -> str:
        names = hardware.nvml_gpus()
        if not names:
            return f"{self.world} ranks (NVML unavailable)"
        if len(names) < self.world:
            return f"{names[0]} x{len(names)}, {self.world} ranks ({SHARED_LABEL})"
        return f"{names[0]} x{self.world}"

    def close(self) -> None:
        for q in self._commands:
            try:
                q.put(None)
            except Exception:  # noqa: BLE001
                pass
        if self._group is not None:
            self._group.close(15.0)
        self._kill_group()


def visible_gpus() -> int:
    try:
        import torch
    except ImportError:  # `pip install .[tune]` brings no torch: no GPUs to measure on
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def deep_ep_importable() -> Optional[str]:
    try:
        import deep_ep  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        return f"deep_ep does not import ({type(exc).__name__}: {exc})"
    return None
