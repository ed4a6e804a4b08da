"""Coordination for tuning under ``torchrun``: rank 0 is the only optuna client; it broadcasts
each trial's (workload, point) to every rank, every rank measures, and the slowest rank's answer
is told back. The coordination (ask, broadcast, gather, tell) is separate from the measurement, so
it runs on CPUs with gloo and the model bench as well as with a per-rank GPU bench.

Joining the job (:func:`join_group`) waits for the other ranks in Python, a second at a time, and
says what it waits for: a missing peer is named, and Ctrl-C or SIGTERM ends the wait (torch's own
rendezvous waits inside C++, where neither reaches Python, for up to 30 minutes, silently).
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Optional, Union

from moepolicy.tuning.bench import (
    Bench,
    Measurement,
    TrialFailed,
    TunePoint,
    Workload,
    check_measurement,
)
from moepolicy.errors import TuningError


def _measure(inner: Bench, workload: Workload, point: TunePoint) -> Union[Measurement, str]:
    try:
        return inner.measure(workload, point)
    except TrialFailed as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 (reported to rank 0 as the trial's reason)
        return f"{type(exc).__name__}: {exc}"


def slowest(results: list[Measurement]) -> Measurement:
    """The ranks' answers as one: a live rank's times are already the step's (``RankBench`` times
    with the group's timer, ``measure.timing.step_times``), so every rank answers the same; a bench
    that is not collective answers per rank, and a collective waits for its slowest rank."""
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
        self.noise_free = inner.noise_free  # a bench's kind: fixed for its life
        self._closed = False

    def identity(self) -> str:
        return f"{self.inner.identity()} on {self.world} ranks"

    def in_envelope(self, workload: Workload, gpu: str) -> Optional[str]:
        return self.inner.in_envelope(workload, gpu)

    def envelope(self, workload: Workload):
        return self.inner.envelope(workload)

    restarts_fresh = False  # torchrun's ranks serve until told to stop: re-measurements reuse them

    def restart(self) -> None:
        pass

    def measure(self, workload: Workload, point: TunePoint) -> Measurement:
        self.dist.broadcast_object_list([("measure", workload, point)], src=0, group=self.group)
        gathered: list = [None] * self.world
        self.dist.all_gather_object(
            gathered, _measure(self.inner, workload, point), group=self.group
        )
        errors = [f"rank {r}: {g}" for r, g in enumerate(gathered) if isinstance(g, str)]
        if errors:
            raise TrialFailed("; ".join(errors))

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
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0, group=group)
        kind, workload, point = box[0]
        if kind == "stop":
            return served
        result = _measure(inner, workload, point)
        dist.all_gather_object([None] * world, result, group=group)
        served += 1


JOIN_TIMEOUT_S = 1800.0  # as long as torch's default rendezvous waits
_NOTE_EVERY_S = 30.0


def join_group(
    backend: str,
    say: Callable[[str], None],
    device_id=None,
    timeout_s: float = JOIN_TIMEOUT_S,
    poll_s: float = 1.0,
) -> None:
    """``torch.distributed.init_process_group`` over torchrun's environment (``RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``; torchrun's own store when it offers one),
    once every rank has joined; until then ``say`` names what is awaited, and signals are honoured."""
    from datetime import timedelta

    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    host, port = (
        os.environ.get("MASTER_ADDR", "127.0.0.1"),
        int(os.environ.get("MASTER_PORT", "29500")),
    )
    hosts_store = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    deadline = time.monotonic() + timeout_s
    if not hosts_store:
        _wait_for_port(
            host,
            port,
            deadline,
            poll_s,
            lambda: say(
                f"rank {rank}: waiting for rank 0's store at {host}:{port} (Ctrl-C stops)"
            ),
        )
    store = dist.TCPStore(
        host,
        port,
        world,
        is_master=hosts_store,
        timeout=timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    key = f"moepolicy/{attempt}/joined"
    store.add(key, 1)
    started, said = time.monotonic(), None
    while (joined := store.add(key, 0)) < world:
        now = time.monotonic()
        if now > deadline:
            raise TuningError(
                f"--launcher torchrun: {world - joined} of {world} ranks did not join at {host}:{port} "
                f"within {timeout_s:.0f} s; start every rank (torchrun --nproc-per-node, --nnodes)"
            )
        if said is None or now - said >= _NOTE_EVERY_S:
            said = now
            say(
                f"rank {rank}: {joined} of {world} ranks joined at {host}:{port}; waiting for {world - joined} more "
                f"({now - started:.0f} s; Ctrl-C stops)"
            )
        time.sleep(poll_s)  # in Python: Ctrl-C and SIGTERM are handled here
    dist.init_process_group(
        backend,
        store=dist.PrefixStore(f"moepolicy/{attempt}/default_pg", store),
        rank=rank,
        world_size=world,
        device_id=device_id,
    )


def _wait_for_port(
    host: str, port: int, deadline: float, poll_s: float, waiting: Callable[[], None]
) -> None:
    """Until something listens at ``host:port`` (rank 0's store); ``waiting`` once, when it must wait."""
    import socket

    told = False
    while True:
        try:
            socket.create_connection((host, port), timeout=poll_s).close()
            return
        except OSError as exc:
            if time.monotonic() > deadline:
                raise TuningError(
                    f"--launcher torchrun: nothing answers at {host}:{port} (rank 0's store): "
                    f"{exc.strerror or exc}"
                ) from None
        if not told:
            told = True
            waiting()
        time.sleep(poll_s)
