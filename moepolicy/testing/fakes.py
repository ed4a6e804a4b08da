"""Bench sources for tests: the model bench slowed down, or fake DeepEP workers on CPUs."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping, Optional

from moepolicy.tuning.bench import Bench
from moepolicy.tuning.bench_source import SHARED_RANKS_ENV, BenchChoice, BenchSource
from moepolicy.tuning.expert_bench import ExpertBench


@dataclass
class FakeBenchSource(BenchSource):
    """``fake_ranks``: the live bench runs that many fake DeepEP workers (no GPU, ``faults`` injected);
    ``model_delay_s``: the model bench pauses that long per measurement."""

    fake_ranks: int = 0
    model_delay_s: float = 0.0
    faults: Mapping[int, str] = field(default_factory=dict)
    # known expert-stage times (``KnownExpertBench``): a 'live' expert stage on CPUs
    expert_us: Optional[Mapping] = None
    expert_runs: tuple[str, ...] = ("deepgemm",)

    def choose(self, asked: Optional[str], ep_size: Optional[int] = None) -> BenchChoice:
        import dataclasses

        if self.fake_ranks and asked == "live" and os.environ.get(SHARED_RANKS_ENV) == "1":
            # the test-only switch, as on a GPU machine: the fake ranks count as sharing one GPU
            choice = self._shared(1, self.fake_ranks)
        elif self.fake_ranks and asked == "live":
            choice = BenchChoice(
                "live", "fake DeepEP workers (moepolicy.testing)", self.fake_ranks
            )
        else:
            choice = super().choose(asked, ep_size)
        if self.expert_us is not None:
            choice = dataclasses.replace(choice, experts="live")
        return choice

    def build_experts(self, choice: BenchChoice, gpu: str, regime: str):
        if self.expert_us is not None:
            return KnownExpertBench(self.expert_us, sigma=0.02, runs=self.expert_runs)
        return super().build_experts(choice, gpu, regime)

    def build(
        self,
        choice: BenchChoice,
        gpu: str,
        max_buffer_bytes: int,
        trial_timeout_s: float,
        reps: int,
    ) -> Bench:
        if choice.kind == "model":
            from moepolicy.tuning.model_bench import ModelBench

            return ModelBench(gpu, delay_s=self.model_delay_s)
        from moepolicy.testing.fake_deepep import FakeWorker
        from moepolicy.tuning.live_bench import LiveBench

        return LiveBench(
            choice.ranks,
            max_buffer_bytes,
            trial_timeout_s=trial_timeout_s,
            reps=reps,
            worker=FakeWorker(self.faults),
        )

    def build_v2(self, choice: BenchChoice, trial_timeout_s: float, reps: int):
        from moepolicy.testing.fake_deepep import FakeWorker
        from moepolicy.tuning.v2_live import V2LiveBench

        return V2LiveBench(
            choice.ranks,
            trial_timeout_s=trial_timeout_s,
            reps=reps,
            worker=FakeWorker(self.faults),
        )


class NoisyBench(Bench):
    """Known true times per point, times log-normal noise of ``sigma``, times a drift that grows with
    every measurement (the whole machine slowing down), as a shared GPU does: the re-measurement
    protocol is checked against it (``tests/tuning/test_confirm.py``, ``benchmarks/protocol_false_claims.py``)."""

    name = "noisy"

    def __init__(self, true_us: Mapping, sigma: float, seed: int, drift_per_call: float = 0.0):
        import random

        self.true_us, self.sigma, self.drift = true_us, sigma, drift_per_call
        self.rng, self.calls, self.starts = random.Random(seed), 0, 0

    def restart(self) -> None:
        self.starts += 1

    def measure(self, workload, point):
        import math

        from moepolicy.tuning.bench import Measurement

        self.calls += 1
        us = (
            self.true_us[point]
            * math.exp(self.rng.gauss(0.0, self.sigma))
            * (1 + self.drift * self.calls)
        )
        return Measurement(us, us * 0.8, 100.0, "measured")


class KnownExpertBench(ExpertBench):
    """Expert-stage arms with known true compute times (us, per arm ``kernel/order`` and token
    count), times log-normal noise of ``sigma`` and a drift shared by every arm of a round (the
    machine slowing down), for the expert-kernel choice's tests. ``runs``: the kernels it can time;
    the others are listed as not measured."""

    name = "known-times expert bench"
    source = "measured"

    def __init__(
        self,
        true_us: Mapping[tuple[str, int], float],
        sigma: float = 0.05,
        seed: int = 0,
        runs: tuple[str, ...] = ("deepgemm",),
        drift_per_round: float = 0.0,
    ):
        import random

        self.true_us, self.sigma, self.runs = dict(true_us), sigma, runs
        self.drift, self.rng = drift_per_round, random.Random(seed)

    def kernels(self, names):
        from moepolicy.schema.measured import KernelStatus

        return tuple(
            KernelStatus(
                n, n in self.runs, "known times" if n in self.runs else "not in this fake"
            )
            for n in names
        )

    def times(self, shape, tokens, arms, rounds):
        import math

        from moepolicy.tuning.expert_bench import StageTimes

        out = {a: [] for a in arms}
        for r in range(rounds):
            shared = (1 + self.drift * r) * math.exp(self.rng.gauss(0.0, self.sigma / 2))
            for a in arms:
                noise = math.exp(self.rng.gauss(0.0, self.sigma))
                out[a].append(self.true_us[(a, tokens)] * shared * noise)
        return StageTimes(out)
