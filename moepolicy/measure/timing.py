"""CUDA-event timing with an L2 flush before every repetition, and the one way a time is reported
over the ranks of a step (:func:`step_times`: the slowest rank per repetition, then the median).

Three launch modes:
- ``synced`` (default): host and GPUs are synchronised (barrier, then the GPU idle) right before the
  start event, so the host's launch cost of every call in ``fn`` counts — a host that never runs ahead;
- ``queued``: after the barrier the GPU first spins for ``HEAD_START_US`` while the host enqueues
  ``fn``; the start event fires after the spin, so the time is the GPU's own (host waits that ``fn``
  itself contains, like the full dispatch's CPU wait for counts, still count). This is what a
  CUDA-graph engine sees, and what DeepEP's own benchmark measures (it hides the launch cost behind a
  large kernel: DeepEP ``tests/utils.py``, ``bench_kineto``);
- ``runahead``: ``fn`` called ``RUN_AHEAD_CALLS`` times back to back from one synchronised start, the
  time divided by the calls: the host enqueues each call while the GPU still runs the one before,
  except where ``fn`` makes it wait (DeepEP's full dispatch waits on the host for its receive
  counts). This is an eager engine's forward pass over consecutive MoE layers (vLLM's DeepEP
  high-throughput path with CUDA graphs off).
"""

from __future__ import annotations

import statistics
from typing import Callable, Mapping, Sequence

import torch

from moepolicy.measure.rounds import Name
from moepolicy.measure.rounds import balanced_rounds  # noqa: F401 (re-exported: its home is torch-free)

L2_FLUSH_BYTES = 256 * 1024 * 1024
HEAD_START_US = 500.0
RUN_AHEAD_CALLS = 8  # consecutive calls (MoE layers) per runahead sample
LAUNCH_MODES = ("synced", "queued", "runahead")


class Timer:
    def __init__(self, device: torch.device, group=None, collective: bool = True):
        self.device = device
        self.group = group
        self.collective = collective
        self._flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device)
        self._cycles_per_us: float | None = None

    def _gloo(self) -> bool:
        import torch.distributed as dist

        return dist.get_backend(self.group) == "gloo"

    def _barrier(self) -> None:
        import torch.distributed as dist

        if self.collective and dist.is_initialized():
            if self._gloo():  # ranks that share a GPU (measure.placement): no device to name
                dist.barrier(group=self.group)
            else:
                dist.barrier(group=self.group, device_ids=[self.device.index])

    def quiesce(self) -> None:
        """Flush L2, meet the other ranks, and wait until this GPU is idle (the barrier's own
        kernels must not spill into the next timing)."""
        self._flush.zero_()
        self._barrier()
        torch.cuda.synchronize(self.device)

    def _spin_cycles(self, us: float) -> int:
        """GPU clock cycles that ``torch.cuda._sleep`` needs to spin for ``us`` (measured once)."""
        if self._cycles_per_us is None:
            probe = 2_000_000
            torch.cuda._sleep(1000)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(probe)
            end.record()
            end.synchronize()
            self._cycles_per_us = probe / max(start.elapsed_time(end) * 1000.0, 1.0)
        return int(us * self._cycles_per_us)

    def head_start(self) -> None:
        """Make the current stream spin ``HEAD_START_US`` so that the host enqueues what follows
        before the GPU reaches it (``queued`` mode)."""
        torch.cuda._sleep(self._spin_cycles(HEAD_START_US))

    def samples(
        self, fn: Callable[[], object], reps: int = 30, warmup: int = 5, mode: str = "synced"
    ) -> list[float]:
        """Microseconds of ``fn`` per repetition, each after a barrier and an L2 flush (``runahead``:
        per call of a repetition's ``RUN_AHEAD_CALLS`` calls back to back)."""
        if mode not in LAUNCH_MODES:
            raise ValueError(f"launch mode must be one of {LAUNCH_MODES}, got {mode!r}")
        calls = RUN_AHEAD_CALLS if mode == "runahead" else 1
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize(self.device)
        out = []
        for _ in range(reps):
            self.quiesce()
            if mode == "queued":
                self.head_start()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) * 1000.0 / calls)
        return out

    def step_us(
        self, fn: Callable[[], object], reps: int = 30, warmup: int = 5, mode: str = "synced"
    ) -> dict:
        """``fn`` timed ``reps`` times on every rank and reported as an EP step's time
        (:func:`step_times`: the slowest rank in each repetition, then the median)."""
        xs = self.samples(fn, reps, warmup, mode)
        return {
            **step_times(xs, self.group if self.collective else False, self.device),
            "mode": mode,
        }

    def slowest_rank_per_rep(self, samples: dict[str, list[float]]) -> dict[str, list[float]]:
        """``samples`` (this rank's timings of the same repetitions as every other rank's) reduced to
        the slowest rank's time in each repetition (:func:`slowest_per_rep`); unchanged on one process."""
        return gather_slowest(samples, self.group if self.collective else False, self.device)


def step_times(xs: Sequence[float], group=None, device=None) -> dict:
    """How every reported GPU time of moepolicy is taken (docs/BENCHMARKS.md, "How GPU times are
    taken"): each rank times the same repetitions, every one started together after a barrier; a
    repetition counts its slowest rank (an expert-parallel step ends when its last rank does); the
    median over the repetitions is reported, with the fastest and slowest of the same series.
    ``group``: the process group (None: the default one; False: this process alone)."""
    slowest = gather_slowest({"t": list(xs)}, group, device)["t"]
    return {
        "median_us": float(statistics.median(slowest)),
        "min_us": float(min(slowest)),
        "max_us": float(max(slowest)),
        "reps": len(slowest),
    }


def gather_slowest(samples: dict[str, list[float]], group=None, device=None) -> dict:
    """Every rank's ``samples`` gathered over ``group`` (gloo: host tensors; NCCL: on ``device``)
    and reduced to the slowest rank per repetition; unchanged on one process or ``group=False``."""
    import torch.distributed as dist

    if group is False or not dist.is_initialized():
        return samples
    keys = sorted(samples)
    local = torch.tensor([samples[k] for k in keys], dtype=torch.float64)
    if dist.get_backend(group) != "gloo":
        local = local.to(device)
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, local, group=group)
    return slowest_per_rep([{k: row.tolist() for k, row in zip(keys, g.cpu())} for g in gathered])


def slowest_per_rep(per_rank: Sequence[dict[str, list[float]]]) -> dict[str, list[float]]:
    """Every rank's timings of the same repetitions, reduced to the slowest rank's time in each
    repetition: the ranks of an expert-parallel step start together (barrier) and the step ends when
    the last one does."""
    keys = sorted(per_rank[0])
    for xs in per_rank:
        if sorted(xs) != keys or any(len(xs[k]) != len(per_rank[0][k]) for k in keys):
            raise ValueError("every rank must time the same repetitions of the same things")
    return {
        k: [max(xs[k][i] for xs in per_rank) for i in range(len(per_rank[0][k]))] for k in keys
    }


def interleaved_rounds(
    timer: Timer,
    fns: Mapping[Name, Callable[[], object]],
    rounds: int,
    reps: int,
    mode: str = "synced",
    warmup: int = 2,
) -> dict[Name, list[float]]:
    """Each round times every callable once (median of ``reps``, slowest rank), in turn
    (``balanced_rounds``), so slow drifts of the machine fall on all of them alike. Returns the
    per-round medians per name."""
    return balanced_rounds(
        list(fns),
        lambda name: timer.step_us(fns[name], reps, warmup=warmup, mode=mode)["median_us"],
        rounds,
    )
