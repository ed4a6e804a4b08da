"""CUDA-event timing with an L2 flush before every repetition; medians, spreads, max over ranks."""

from __future__ import annotations

import statistics
from typing import Callable

import torch

L2_FLUSH_BYTES = 256 * 1024 * 1024


class Timer:
    def __init__(self, device: torch.device, group=None, collective: bool = True):
        self.device = device
        self.group = group
        self.collective = collective
        self._flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device)

    def _barrier(self) -> None:
        import torch.distributed as dist

        if self.collective and dist.is_initialized():
            dist.barrier(group=self.group, device_ids=[self.device.index])

    def samples(self, fn: Callable[[], object], reps: int = 30, warmup: int = 5) -> list[float]:
        """Microseconds of ``fn`` per repetition, each after a barrier and an L2 flush."""
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize(self.device)
        out = []
        for _ in range(reps):
            self._flush.zero_()
            self._barrier()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) * 1000.0)
        return out

    def median_max_over_ranks(self, fn: Callable[[], object], reps: int = 30, warmup: int = 5) -> dict:
        """Median per rank, then the slowest rank's median (a collective waits for the slowest)."""
        import torch.distributed as dist

        xs = self.samples(fn, reps, warmup)
        med = statistics.median(xs)
        stats = torch.tensor([med, min(xs), max(xs)], dtype=torch.float64, device=self.device)
        if dist.is_initialized():
            gathered = [torch.empty_like(stats) for _ in range(dist.get_world_size(self.group))]
            dist.all_gather(gathered, stats, group=self.group)
            slowest = max(gathered, key=lambda t: float(t[0]))
        else:
            slowest = stats
        return {"median_us": float(slowest[0]), "min_us": float(slowest[1]), "max_us": float(slowest[2]),
                "reps": reps}
