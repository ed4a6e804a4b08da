"""Run the preflight's ranks and watch them: each step has a deadline; a rank's error or death, or a
step past its deadline, ends the run with a line naming the rank and the step."""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from moepolicy.measure.placement import RankPlacement
from moepolicy.preflight.plan import PreflightPlan, PreflightReport

STEP_TIMEOUT_S = 120.0
START_TIMEOUT_S = (
    300.0  # spawning, importing torch and DeepEP, joining the group: slow on a loaded host
)


def run_preflight(
    plans: Sequence[PreflightPlan],
    placement: RankPlacement,
    step_timeout_s: float = STEP_TIMEOUT_S,
    link=None,
    on_report: Optional[Callable[[PreflightReport], None]] = None,
) -> list[PreflightReport]:
    """Run every plan (one EP size) on ``placement.ranks`` spawned ranks, one after the other in the
    same group, each step under ``step_timeout_s``; ``link`` is how a rank reaches the others
    (``preflight.rank.DeepEPLink`` by default); ``on_report`` sees each plan's report as soon as
    every rank is done with it (progress on long runs)."""
    import tempfile

    import torch.multiprocessing as mp

    from moepolicy.preflight.rank import rank_main

    if {plan.ep_size for plan in plans} != {placement.ranks}:
        raise ValueError(
            f"every plan must be for EP {placement.ranks}: {[plan.ep_size for plan in plans]}"
        )
    reports = [PreflightReport(plan, placement) for plan in plans]
    ctx = mp.get_context("spawn")
    events = ctx.Queue()
    rendezvous = tempfile.mktemp(prefix="moepolicy-preflight-")
    procs = [
        ctx.Process(
            target=rank_main,
            args=(r, tuple(plans), placement, rendezvous, events, link),
            daemon=True,
        )
        for r in range(placement.ranks)
    ]
    for p in procs:
        p.start()
    try:
        _Watch(reports, procs, events, step_timeout_s, on_report).run()
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(timeout=10)
    return reports


@dataclass
class _Watch:
    """The supervisor's state: each rank's current step and finished policies."""

    reports: list[PreflightReport]
    procs: list
    events: object
    step_timeout_s: float
    on_report: Optional[Callable[[PreflightReport], None]] = None
    steps: dict = field(default_factory=dict)
    finished: dict = field(default_factory=dict)  # rank -> policies done
    done: set = field(default_factory=set)

    def run(self) -> None:
        ranks = range(len(self.procs))
        self.steps = {r: "starting" for r in ranks}
        self.finished = {r: 0 for r in ranks}
        last_event = time.monotonic()
        while len(self.done) < len(self.procs):
            try:
                kind, rank, payload = self.events.get(timeout=1.0)
            except queue.Empty:
                problem = self._stalled(last_event)
                if problem:
                    return self._fail(*problem)
                continue
            last_event = time.monotonic()
            if kind == "error":
                return self._fail(rank, f"rank {rank} at {self.steps[rank]}: {payload}")
            self._note(kind, rank, payload)

    def _note(self, kind: str, rank: int, payload) -> None:
        if kind == "step":
            self.steps[rank] = payload
        elif kind == "row":
            index, row = payload
            self.reports[index].rows.append(row)
        elif kind == "plan-done":
            self.finished[rank] = payload + 1
            if self.on_report and min(self.finished.values()) == payload + 1:
                self.on_report(self.reports[payload])
        elif kind == "done":
            self.done.add(rank)

    def _stalled(self, last_event: float):
        """Why the run cannot go on (a rank died, or no rank progressed in time), or None. Starting
        (spawn, imports, joining the group) has its own, longer deadline."""
        dead = [
            r
            for r, p in enumerate(self.procs)
            if p.exitcode not in (None, 0) and r not in self.done
        ]
        if dead:
            r = dead[0]
            return r, f"rank {r} died (exit {self.procs[r].exitcode}) at: {self.steps[r]}"
        starting = any(
            step == "starting" or step.startswith("joining") for step in self.steps.values()
        )
        limit = max(START_TIMEOUT_S, self.step_timeout_s) if starting else self.step_timeout_s
        if time.monotonic() - last_event > limit:
            r = min(set(self.steps) - self.done)
            return (
                r,
                f"no progress within {limit:.0f} s: rank {r} at: {self.steps[r]} (a hung collective?)",
            )
        return None

    def _fail(self, rank: int, message: str) -> None:
        """The policy ``rank`` was running failed; the ones after it were not run."""
        index = min(self.finished.get(rank, 0), len(self.reports) - 1)
        self.reports[index].error = message
        for later in self.reports[index + 1 :]:
            later.error = "not run: an earlier policy's run failed"
