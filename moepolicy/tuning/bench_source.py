"""Where a tune's measurements come from: which bench (live or model) and how it is built.

The CLI asks a :class:`BenchSource` which bench to use and builds it; tests pass another source
(``moepolicy.testing.fakes.FakeBenchSource``) instead of setting environment variables.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from moepolicy.errors import TuningError
from moepolicy.tuning.bench import Bench


@dataclass(frozen=True)
class BenchChoice:
    kind: str  # live | model
    why: str
    ranks: int  # GPUs (live) the bench measures on; 0 when none are visible


class BenchSource:
    """Live DeepEP on the visible GPUs when deep_ep imports, else the calibrated model bench."""

    def choose(self, asked: Optional[str]) -> BenchChoice:
        from moepolicy.tuning.live_bench import deep_ep_importable, visible_gpus

        if asked == "model":
            return BenchChoice("model", "asked for the model bench", 0)
        gpus = visible_gpus()
        missing = deep_ep_importable()
        if asked == "live":
            if gpus < 2:
                raise TuningError(f"the live bench needs at least 2 CUDA GPUs (visible: {gpus})")
            if missing:
                raise TuningError(f"the live bench needs DeepEP: {missing}")
            return BenchChoice("live", "asked for the live bench", gpus)
        if gpus >= 2 and not missing:
            return BenchChoice("live", f"deep_ep imports and {gpus} GPUs are visible", gpus)
        why = f"{gpus} CUDA GPU(s) visible" if gpus < 2 else missing
        return BenchChoice("model", f"{why}: using the calibrated model bench", gpus)

    def build(self, choice: BenchChoice, gpu: str, max_buffer_bytes: int, trial_timeout_s: float,
              reps: int) -> Bench:
        if choice.kind == "model":
            from moepolicy.tuning.model_bench import ModelBench

            return ModelBench(gpu)
        from moepolicy.tuning.live_bench import LiveBench

        return LiveBench(choice.ranks, max_buffer_bytes, trial_timeout_s=trial_timeout_s, reps=reps)

    def build_v2(self, choice: BenchChoice, trial_timeout_s: float, reps: int):
        """The live bench for DeepEP v2 on the visible GPUs (``tuning.v2_live``)."""
        from moepolicy.tuning.v2_live import V2LiveBench

        return V2LiveBench(choice.ranks, trial_timeout_s=trial_timeout_s, reps=reps)
