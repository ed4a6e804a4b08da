"""The rank harness: every process moepolicy runs a rank in is started, placed, watched and ended here.

- **The safe environment.** NVLink multicast stays off (``SAFE_ENV``): a program that uses it can put
  a shared host's GPUs out of service. It is set in the process that starts the ranks (every child
  inherits it) and again in each rank before it imports NCCL, NVSHMEM or DeepEP; the torchrun path,
  whose processes torchrun starts, sets it in its own process (:func:`safe_environment`).
- **Spawn**, never fork (CUDA), with Ctrl-C blocked while the ranks start; a ``quiet`` rank then
  ignores it (its supervisor ends the group). A rank that raises reports one line and exits 1; a
  rank whose supervisor died without ending it (SIGKILL, the OOM killer) exits at once
  (``measure.worker_process``), never holding its GPU and DeepEP buffers.
- **A device per rank** (``measure.placement``: a GPU each, or ranks sharing the GPUs visible) and
  the join (:func:`join_group`); peer access between the ranks' GPUs is checked once, before the
  first group (:func:`gpu_placement`), and refused in one line naming the GPU pair.
- **One supervisor loop** (:meth:`RankGroup.next_event`): the ranks' events, a rank's death or
  error, and a deadline, each ending the group in one line (:class:`RanksFailed`).

This module is the one place where rank processes are spawned and joined.
"""

from __future__ import annotations

import os
import queue
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Mapping, Optional, Sequence

from moepolicy import hardware
from moepolicy.errors import InfeasibleError
from moepolicy.measure.placement import RankPlacement, visible_placement
from moepolicy.measure.worker_process import exit_with_parent, sigint_blocked

SAFE_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
START_TIMEOUT_S = 300.0  # spawning, importing torch and DeepEP, joining: slow on a loaded host


def safe_environment() -> None:
    """NVLink multicast off in NCCL, torch's symmetric memory and NVSHMEM, in this process (and so
    in every process it starts from now on); call it before any of them starts."""
    os.environ.update(SAFE_ENV)


class RanksFailed(Exception):
    """A rank of a group died, raised, or sent nothing before a deadline. ``exitcode`` is None for
    a group that is alive but hung (``rank`` None where no one rank was behind the others);
    ``detail`` is the rank's own one line when it raised."""

    def __init__(
        self, rank: Optional[int], what: str, exitcode: Optional[int] = None, detail: str = ""
    ):
        self.rank, self.what, self.exitcode, self.detail = rank, what, exitcode, detail
        if detail:
            said = f"rank {rank} failed while {what}: {detail}"
        elif exitcode is None:
            who = "no rank sent anything" if rank is None else f"rank {rank} sent nothing"
            said = f"{who} in time while {what} (a hung collective?)"
        else:
            said = f"rank {rank} died (exit {exitcode}) while {what}"
        super().__init__(said)

    @property
    def hung(self) -> bool:
        return self.exitcode is None and not self.detail


_REPORTER: Optional[tuple[Any, int]] = None  # (the group's event queue, this rank) in a rank


def tell(kind: str, payload: object = None) -> None:
    """From inside a rank: an event ``(kind, rank, payload)`` for the supervisor (progress, a
    result); nothing outside a rank of this harness."""
    if _REPORTER is not None:
        events, rank = _REPORTER
        events.put((kind, rank, payload))


def _rank_main(entry: Callable, rank: int, args: tuple, events, quiet: bool) -> None:
    """A spawned rank's first frame: the safe environment, signals, then ``entry(rank, *args)``."""
    import signal

    global _REPORTER
    safe_environment()
    exit_with_parent()  # never outlive the supervisor (SIGKILL, the OOM killer), holding a GPU
    _REPORTER = (events, rank)
    if quiet:  # Ctrl-C (sent to the whole process group) is the supervisor's to handle
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked while it started
    try:
        entry(rank, *args)
    except KeyboardInterrupt:
        os._exit(130)
    except Exception as exc:  # noqa: BLE001 (one line to the supervisor, never a traceback)
        said = f"{type(exc).__name__}: {exc}"
        where = traceback.extract_tb(exc.__traceback__)[-1]
        said = said[:400] + f" [{os.path.basename(where.filename)}:{where.lineno} {where.name}]"
        events.put(("crashed", rank, " ".join(said.split())))
        events.close()
        events.join_thread()  # the line is in the pipe before the exit code is
        os._exit(1)


def context():
    """The multiprocessing context of every rank and of the queues they share: spawn."""
    import torch.multiprocessing as mp

    return mp.get_context("spawn")


def rendezvous_file(prefix: str = "moepolicy-ranks-") -> str:
    """A fresh path for a group's file rendezvous (the file must not exist yet)."""
    return tempfile.mktemp(prefix=prefix)


@dataclass
class RankGroup:
    """Spawned ranks and the queue their events come on: ``(kind, rank, payload)``."""

    procs: list
    events: Any
    heard: dict = field(default_factory=dict)  # event[1] (a rank) -> when its last event came
    told: dict = field(default_factory=dict)  # event[1] (a rank) -> how many events it sent

    def exited(self, done: Sequence[int] = ()) -> list[tuple[int, int]]:
        """(rank, exit code) of every rank that ended and is not in ``done``."""
        return [
            (r, p.exitcode)
            for r, p in enumerate(self.procs)
            if p.exitcode is not None and r not in done
        ]

    def next_event(self, deadline: float, what: str, done: Sequence[int] = ()) -> tuple:
        """The next event ``(kind, rank, payload)``, or ``("exited", rank, 0)`` for a rank not in
        ``done`` that ended cleanly (once its events are read); :class:`RanksFailed` (the group
        killed) when such a rank ended otherwise or raised, or ``deadline`` (``time.monotonic``)
        passed first."""
        while True:
            try:
                event = self.events.get(timeout=min(1.0, max(deadline - time.monotonic(), 0.01)))
            except queue.Empty:
                event = None
            if event is not None:
                self.heard[event[1]] = time.monotonic()
                self.told[event[1]] = self.told.get(event[1], 0) + 1
                if event[0] == "crashed":
                    self._fail(RanksFailed(event[1], what, 1, event[2]))
                return event
            for rank, code in self.exited(done):
                if code != 0:
                    self._fail(RanksFailed(rank, what, code))
                return ("exited", rank, 0)
            if time.monotonic() >= deadline:
                self._fail(RanksFailed(self.behind(done), what))

    def _fail(self, failure: RanksFailed):
        self.kill()
        raise failure

    def behind(self, done: Sequence[int] = ()) -> Optional[int]:
        """The one rank not in ``done`` that sent fewer events than every other, or None: ranks
        stuck together in a collective all stop at once, and which of them hung cannot be told."""
        waiting = [r for r in range(len(self.procs)) if r not in done]
        counts = sorted((self.told.get(r, 0), r) for r in waiting)
        if len(counts) == 1 or (len(counts) > 1 and counts[0][0] < counts[1][0]):
            return counts[0][1]
        return None

    def watch(self, idle_s: float, what: str, start_s: float = START_TIMEOUT_S) -> list:
        """Every rank's events until each has ended with exit 0; a rank silent for ``idle_s`` (for
        ``start_s`` before its first event) ends the group. Returns the events, progress left out."""
        got: list = []
        started, finished = time.monotonic(), set[int]()
        while len(finished) < len(self.procs):
            deadline = min(
                self.heard.get(r, started + start_s - idle_s) + idle_s
                for r in range(len(self.procs))
                if r not in finished
            )
            kind, rank, payload = self.next_event(deadline, what, tuple(finished))
            if kind == "exited":
                finished.add(rank)
            elif kind != "progress":
                got.append((kind, rank, payload))
        return got

    def kill(self) -> None:
        """End every rank still running (a hung collective never returns) and reap them."""
        for p in self.procs:
            if p.is_alive():
                p.kill()
        for p in self.procs:
            p.join(timeout=10)

    def close(self, timeout_s: float = 15.0) -> None:
        """Wait ``timeout_s`` for the ranks to end by themselves, then end the rest."""
        for p in self.procs:
            p.join(timeout=timeout_s)
        self.kill()


def spawn_ranks(
    entry: Callable, args: Sequence[tuple], quiet: bool = False, events=None
) -> RankGroup:
    """One spawned process per element of ``args``, running ``entry(rank, *args[rank])`` in the
    safe environment; the events they :func:`tell` (or put on ``events``, a :func:`context` queue
    the caller also hands them) arrive on the group's queue."""
    safe_environment()
    ctx = context()
    events = events if events is not None else ctx.Queue()
    procs = [
        ctx.Process(target=_rank_main, args=(entry, r, tuple(a), events, quiet), daemon=True)
        for r, a in enumerate(args)
    ]
    with sigint_blocked():
        for p in procs:
            p.start()
    return RankGroup(procs, events)


def run_ranks(entry: Callable, args: tuple, world: int, timeout_s: float = 300.0) -> None:
    """``world`` ranks of ``entry(rank, *args)`` until every one has ended; a rank that fails, or a
    group not done within ``timeout_s`` (a hung collective), ends every rank and raises why."""
    group = spawn_ranks(entry, [args] * world)
    try:
        group.watch(timeout_s, f"running {world} ranks", start_s=timeout_s)
    finally:
        group.kill()


def join_group(rank: int, world: int, rendezvous: str, placement: Optional[RankPlacement] = None):
    """This process's GPU, joined to the group of ``world`` ranks (file rendezvous): NCCL with a GPU
    per rank, gloo where ranks share a GPU (``placement``; by default over the GPUs visible)."""
    import torch
    import torch.distributed as dist

    placement = placement or visible_placement(world)
    device = torch.device("cuda", placement.device_index(rank))
    torch.cuda.set_device(device)
    extra: dict[str, Any] = {} if placement.shared else {"device_id": device}
    dist.init_process_group(
        placement.backend, rank=rank, world_size=world, init_method=f"file://{rendezvous}", **extra
    )
    return device


@dataclass(frozen=True)
class PeerLink:
    """How two GPUs reach each other: peer access (CUDA IPC mappings, which DeepEP's intranode
    buffer needs) and whether it is NVLink (None: unknown, NVML could not say)."""

    access: bool
    nvlink: Optional[bool] = None


Probe = Callable[[tuple[int, ...]], Mapping[tuple[int, int], PeerLink]]


@lru_cache(maxsize=None)
def probe_peer_links(devices: tuple[int, ...]) -> Mapping[tuple[int, int], PeerLink]:
    """Every pair of ``devices`` (CUDA indices): peer access from CUDA, NVLink from NVML. Once per
    process for a set of devices."""
    import torch

    links = {}
    for i, a in enumerate(devices):
        for b in devices[i + 1 :]:
            access = torch.cuda.can_device_access_peer(a, b) and torch.cuda.can_device_access_peer(
                b, a
            )
            links[(a, b)] = PeerLink(access, _nvml_nvlink(a, b, hardware.nvml_nvlink))
    return links


def _nvml_nvlink(a: int, b: int, nvml_nvlink) -> Optional[bool]:
    import torch

    try:
        return nvml_nvlink(
            torch.cuda._get_nvml_device_index(a), torch.cuda._get_nvml_device_index(b)
        )
    except Exception:  # noqa: BLE001 (no NVML, or a device NVML does not list: unknown)
        return None


def check_peer_links(placement: RankPlacement, probe: Optional[Probe] = None) -> None:
    """Refuse, in one line naming the GPU pair, where DeepEP's intranode buffer cannot join the
    ranks' GPUs: no peer access between two of them, or PCIe (not NVLink) at more than 2 ranks
    (DeepEP's own ``check_nvlink_connections``). Ranks sharing GPUs need neither. ``probe``: what
    answers for the GPUs (:func:`probe_peer_links` by default)."""
    if placement.shared or placement.ranks < 2:
        return
    devices = tuple(sorted({placement.device_index(r) for r in range(placement.ranks)}))
    for (a, b), link in sorted((probe or probe_peer_links)(devices).items()):
        if not link.access:
            raise InfeasibleError(
                f"GPUs {a} and {b} have no peer access (cudaDeviceCanAccessPeer): DeepEP's intranode "
                f"buffer maps every peer's memory; run the {placement.ranks} ranks on GPUs that reach "
                "each other (CUDA_VISIBLE_DEVICES; 'nvidia-smi topo -m' shows the links)"
            )
        if link.nvlink is False and placement.ranks > 2:
            raise InfeasibleError(
                f"GPUs {a} and {b} are joined by PCIe, not NVLink: DeepEP intranode runs at most 2 "
                f"ranks over PCIe, {placement.ranks} asked; run on NVLink-joined GPUs "
                "(CUDA_VISIBLE_DEVICES; 'nvidia-smi topo -m' shows the links) or at EP 2"
            )


def gpu_placement(ranks: int, gpus: Optional[int] = None) -> RankPlacement:
    """``ranks`` placed over the ``gpus`` visible (counted here by default), with the peer links
    between their GPUs checked (once per process and set of GPUs)."""
    if gpus is None:
        placement = visible_placement(ranks)
    else:
        placement = RankPlacement(ranks, gpus)
    check_peer_links(placement)
    return placement
