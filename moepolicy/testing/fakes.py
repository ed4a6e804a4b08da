"""Bench sources for tests: the model bench slowed down, or fake DeepEP workers on CPUs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

from moepolicy.tuning.bench import Bench
from moepolicy.tuning.bench_source import BenchChoice, BenchSource


@dataclass
class FakeBenchSource(BenchSource):
    """``fake_ranks``: the live bench runs that many fake DeepEP workers (no GPU, ``faults`` injected);
    ``model_delay_s``: the model bench pauses that long per measurement."""

    fake_ranks: int = 0
    model_delay_s: float = 0.0
    faults: Mapping[int, str] = field(default_factory=dict)

    def choose(self, asked: Optional[str]) -> BenchChoice:
        if self.fake_ranks and asked == "live":
            return BenchChoice("live", "fake DeepEP workers (moepolicy.testing)", self.fake_ranks)
        return super().choose(asked)

    def build(self, choice: BenchChoice, gpu: str, max_buffer_bytes: int, trial_timeout_s: float,
              reps: int) -> Bench:
        if choice.kind == "model":
            from moepolicy.tuning.model_bench import ModelBench

            return ModelBench(gpu, delay_s=self.model_delay_s)
        from moepolicy.testing.fake_deepep import FakeWorker
        from moepolicy.tuning.live_bench import LiveBench

        return LiveBench(choice.ranks, max_buffer_bytes, trial_timeout_s=trial_timeout_s, reps=reps,
                         worker=FakeWorker(self.faults))
