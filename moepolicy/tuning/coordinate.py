"""Coordination for tuning under ``torchrun``: rank 0 is the only optuna client; it broadcasts
each trial's (workload, point) to every rank, every rank measures, and the slowest rank's answer
is told back. The coordination (ask, broadcast, gather, tell) is separate from the measurement, so
it runs on CPUs with gloo and the model bench as well as with a per-rank GPU bench.
"""

from __future__ import annotations

from typing import Optional, Union

from moepolicy.tuning.bench import Bench, Measurement, TrialFailed, TunePoint, Workload


def _measure(inner: Bench, workload: Workload, point: TunePoint) -> Union[Measurement, str]:
    try:
        return inner.measure(workload, point)
    except TrialFailed as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 (reported to rank 0 as the trial's reason)
        return f"{type(exc).__name__}: {exc}"


def slowest(results: list[Measurement]) -> Measurement:
    """A collective waits for its slowest rank: the max of each time over ranks."""
    return Measurement(
        dispatch_us=max(m.dispatch_us for m in results),
        dispatch_cached_us=max(m.dispatch_cached_us for m in results),
        combine_us=max(m.combine_us for m in results),
        source=results[0].source,
        orders={k: max(m.orders.get(k, 0.0) for m in results) for k in results[0].orders},
    )


class CoordinatedBench(Bench):
    """Rank 0's view: each measurement is a collective over the process group."""

    name = "coordinated"

    def __init__(self, inner: Bench, group=None):
        import torch.distributed as dist

        self.inner, self.group, self.dist = inner, group, dist
        self.world = dist.get_world_size(group)
        self.source = inner.source
        self._closed = False

    def identity(self) -> str:
        return f"{self.inner.identity()} on {self.world} ranks"

    def in_envelope(self, workload: Workload, gpu: str) -> Optional[str]:
        return self.inner.in_envelope(workload, gpu)

    def envelope(self, workload: Workload):
        return self.inner.envelope(workload)

    @property
    def noise_free(self) -> bool:
        return self.inner.noise_free

    restarts_fresh = False  # torchrun's ranks serve until told to stop: re-measurements reuse them

    def restart(self) -> None:
        pass

    def measure(self, workload: Workload, point: TunePoint) -> Measurement:
        self.dist.broadcast_object_list([("measure", workload, point)], src=0, group=self.group)
        gathered: list = [None] * self.world
        self.dist.all_gather_object(gathered, _measure(self.inner, workload, point), group=self.group)
        errors = [f"rank {r}: {g}" for r, g in enumerate(gathered) if isinstance(g, str)]
        if errors:
            raise TrialFailed("; ".join(errors))
        from moepolicy.tuning.bench import check_measurement

        return check_measurement(slowest(gathered))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.dist.broadcast_object_list([("stop", None, None)], src=0, group=self.group)
        self.inner.close()


def serve(inner: Bench, group=None) -> int:
    """Ranks other than 0: measure what rank 0 broadcasts until it says stop; returns the count."""
    import torch.distributed as dist

    world = dist.get_world_size(group)
    served = 0
    while True:
        box = [None]
        dist.broadcast_object_list(box, src=0, group=group)
        kind, workload, point = box[0]
        if kind == "stop":
            return served
        result = _measure(inner, workload, point)
        dist.all_gather_object([None] * world, result, group=group)
        served += 1
