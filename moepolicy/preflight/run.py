"""Run the preflight's ranks and watch them: each step has a deadline; a rank's error or death, or a
step past its deadline, ends the run with a line naming the rank and the step."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from moepolicy.measure.placement import RankPlacement
from moepolicy.measure.ranks import (
    START_TIMEOUT_S,
    RankGroup,
    RanksFailed,
    context,
    rendezvous_file,
    spawn_ranks,
)
from moepolicy.preflight.plan import PreflightPlan, PreflightReport

STEP_TIMEOUT_S = 120.0


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
    # torch: the ranks' side
    from moepolicy.preflight.rank import rank_main

    if {plan.ep_size for plan in plans} != {placement.ranks}:
        raise ValueError(
            f"every plan must be for EP {placement.ranks}: {[plan.ep_size for plan in plans]}"
        )
    reports = [PreflightReport(plan, placement) for plan in plans]
    rendezvous, events = rendezvous_file("moepolicy-preflight-"), context().Queue()
    group = spawn_ranks(
        rank_main,
        [(tuple(plans), placement, rendezvous, events, link)] * placement.ranks,
        events=events,
    )
    try:
        _Watch(reports, group, step_timeout_s, on_report).run()
    finally:
        group.kill()
    return reports


@dataclass
class _Watch:
    """The supervisor's state: each rank's current step and finished policies."""

    reports: list[PreflightReport]
    group: RankGroup
    step_timeout_s: float
    on_report: Optional[Callable[[PreflightReport], None]] = None
    steps: dict = field(default_factory=dict)
    finished: dict = field(default_factory=dict)  # rank -> policies done
    done: set = field(default_factory=set)

    def run(self) -> None:
        ranks = range(len(self.group.procs))
        self.steps = {r: "starting" for r in ranks}
        self.finished = {r: 0 for r in ranks}
        last_event = time.monotonic()
        while len(self.done) < len(ranks):
            limit = self._limit()
            try:
                kind, rank, payload = self.group.next_event(
                    last_event + limit, "running the preflight", tuple(self.done)
                )
            except RanksFailed as exc:
                said = self._said(exc, limit)
                return self._fail(
                    min(set(self.steps) - self.done) if exc.rank is None else exc.rank, said
                )
            last_event = time.monotonic()
            if kind == "error":
                return self._fail(rank, f"rank {rank} at {self.steps[rank]}: {payload}")
            if kind == "exited":
                return self._fail(rank, f"rank {rank} ended at: {self.steps[rank]}")
            self._note(kind, rank, payload)

    def _limit(self) -> float:
        """How long the run may go without an event: starting (spawn, imports, joining the group)
        has its own, longer deadline."""
        starting = any(
            step == "starting" or step.startswith("joining") for step in self.steps.values()
        )
        return max(START_TIMEOUT_S, self.step_timeout_s) if starting else self.step_timeout_s

    def _said(self, failed: RanksFailed, limit: float) -> str:
        r = failed.rank if failed.rank is not None else min(set(self.steps) - self.done)
        if failed.hung:
            return f"no progress within {limit:.0f} s: rank {r} at: {self.steps[r]} (a hung collective?)"
        if failed.detail:
            return f"rank {r} at {self.steps[r]}: {failed.detail}"
        return f"rank {r} died (exit {failed.exitcode}) at: {self.steps[r]}"

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

    def _fail(self, rank: int, message: str) -> None:
        """The policy ``rank`` was running failed; the ones after it were not run."""
        index = min(self.finished.get(rank, 0), len(self.reports) - 1)
        self.reports[index].error = message
        for later in self.reports[index + 1 :]:
            later.error = "not run: an earlier policy's run failed"
