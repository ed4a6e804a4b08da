"""Where a tune's measurements come from: which bench (live or model) and how it is built.

The CLI asks a :class:`BenchSource` which bench to use and builds it; tests pass another source
(``moepolicy.testing.fakes.FakeBenchSource``) instead of setting environment variables.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from moepolicy.errors import TuningError
from moepolicy.tuning.bench import Bench


# Test-only: lets the live bench run EP ranks that share a GPU, to check its plumbing end to end on
# one GPU. What such ranks time is not communication, so the policy is marked not for serving.
SHARED_RANKS_ENV = "MOEPOLICY_FUNCTIONAL_SHARED_RANKS"
SHARED_REFUSAL = (
    "ranks that share a GPU cannot measure communication (they share its SMs and memory and "
    "cross no NVLink); tune with --bench model here, or check a policy's DeepEP settings on this "
    "GPU with 'moepolicy validate POLICY --live'"
)
# What ranks sharing a GPU time measures nothing, so a functional run times each point with few
# repetitions: eight ranks time-slicing one GPU take ~60 ms a dispatch, and the protocol's rounds at
# the usual 20 repetitions ran past 8 minutes at EP 8 (2026-12-03, 1 x H200).
FUNCTIONAL_REPS = 3


@dataclass(frozen=True)
class BenchChoice:
    kind: str  # live | model
    why: str
    ranks: int  # ranks (live) the bench measures with; GPUs visible otherwise (0 when none)
    shared: bool = False  # live ranks share GPUs: a functional run, never a deployable policy
    # where the expert stage's times come from: live (this process's GPU, the real expert GEMMs) or
    # model (the recorded H200 campaign that ships with the package)
    experts: str = "model"


class BenchSource:
    """Live DeepEP on the visible GPUs when deep_ep imports, else the calibrated model bench."""

    def choose(self, asked: Optional[str], ep_size: Optional[int] = None) -> BenchChoice:
        # a bench's module loads only when that bench is chosen (here and below)
        from moepolicy.tuning.live_bench import deep_ep_importable, visible_gpus

        if asked == "model":
            return BenchChoice("model", "asked for the model bench", 0)
        gpus = visible_gpus()
        missing = deep_ep_importable()
        stage = self.expert_stage_problem() if gpus >= 1 else "no CUDA GPU visible"
        experts = "model" if stage else "live"
        per_rank = self.gpu_per_rank(gpus, ep_size)
        if asked == "live":
            if gpus < 1:
                raise TuningError("the live bench needs CUDA GPUs (none visible)")
            if per_rank and not missing:
                return BenchChoice("live", "asked for the live bench", per_rank, experts=experts)
            if os.environ.get(SHARED_RANKS_ENV) == "1" and not missing:
                return self._shared(gpus, ep_size)
            if stage is None:  # one GPU: the expert stage is measured, DeepEP's half is modelled
                return self.stage_only(gpus, ep_size, missing)
            if missing:
                raise TuningError(f"the live bench needs DeepEP: {missing}")
            return self._shared(gpus, ep_size)
        if per_rank and not missing:
            return BenchChoice(
                "live", f"deep_ep imports and {gpus} GPUs are visible", per_rank, experts=experts
            )
        why = missing if gpus >= 2 and missing else f"{gpus} CUDA GPU(s) visible"
        why += f" for EP {ep_size}" if ep_size and not missing else ""
        return BenchChoice(
            "model", f"{why}: using the calibrated model bench", gpus, experts=experts
        )

    @staticmethod
    def gpu_per_rank(gpus: int, ep_size: Optional[int]) -> int:
        """The ranks of a live bench with a GPU each: ``ep_size`` on the first of the ``gpus``
        visible (every visible GPU without one), 0 where that is not at least 2 GPUs."""
        ranks = gpus if ep_size is None else ep_size
        return ranks if 2 <= ranks <= gpus else 0

    @staticmethod
    def stage_only(gpus: int, ep_size: Optional[int], missing: Optional[str]) -> BenchChoice:
        """Too few GPUs (or no DeepEP) to measure communication: the expert stage is measured on
        this GPU and DeepEP's settings and communication come from the model bench."""
        needs = (
            f"DeepEP's settings need DeepEP ({missing})"
            if missing
            else f"DeepEP's settings need one GPU per EP rank ({ep_size or 'at least 2'}; "
            f"{gpus} visible)"
        )
        return BenchChoice(
            "model",
            f"{needs}, so they and the communication are modelled; the expert stage is measured "
            "live on this GPU",
            gpus,
            experts="live",
        )

    @staticmethod
    def expert_stage_problem() -> Optional[str]:
        """Why the expert stage cannot be timed in this process (None when it can)."""
        from moepolicy.tuning.expert_bench import live_stage_problem

        return live_stage_problem()

    def build_experts(self, choice: BenchChoice, gpu: str, regime: str):
        """The expert-stage bench ``choice`` names (``tuning.expert_bench``)."""
        from moepolicy.tuning.expert_bench import LiveExpertBench, RecordedExpertBench

        if choice.experts == "live":
            return LiveExpertBench(regime)
        return RecordedExpertBench(gpu, regime)

    @staticmethod
    def _shared(gpus: int, ep_size: Optional[int]) -> BenchChoice:
        """EP ranks on fewer GPUs: refused, except as the test-only functional run."""
        if os.environ.get(SHARED_RANKS_ENV) != "1" or not ep_size or ep_size <= gpus:
            asked = f" for EP {ep_size}" if ep_size else ""
            raise TuningError(
                f"{gpus} GPU(s) visible{asked}: the live bench needs one GPU per EP rank, at least 2; "
                f"{SHARED_REFUSAL}"
            )
        return BenchChoice(
            "live",
            f"{ep_size} ranks on {gpus} GPU(s) ({SHARED_RANKS_ENV}=1): a functional run, "
            f"not for serving; {FUNCTIONAL_REPS} repetitions per timing",
            ep_size,
            shared=True,
        )

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

            return ModelBench(gpu)
        from moepolicy.tuning.live_bench import LiveBench

        self.check_links(choice)
        if choice.shared:
            reps = min(reps, FUNCTIONAL_REPS)
        return LiveBench(
            choice.ranks, max_buffer_bytes, trial_timeout_s=trial_timeout_s, reps=reps
        )

    @staticmethod
    def check_links(choice: BenchChoice) -> None:
        """Before any worker starts: the peer links between the live ranks' GPUs, refused in one
        line where DeepEP intranode cannot run on them (``measure.ranks.check_peer_links``)."""
        from moepolicy.measure.ranks import gpu_placement
        from moepolicy.tuning.live_bench import visible_gpus

        gpu_placement(choice.ranks, visible_gpus())

    @staticmethod
    def torchrun_placement(local_ranks: int):
        """This node's ``local_ranks`` torchrun ranks over its GPUs: one each (their peer links
        checked), or sharing them only as the test-only functional run (``SHARED_RANKS_ENV``)."""
        from moepolicy.measure.ranks import gpu_placement
        from moepolicy.tuning.live_bench import visible_gpus

        gpus = visible_gpus()
        if gpus < 1:
            raise TuningError("the live bench needs CUDA GPUs (none visible)")
        if local_ranks > gpus and os.environ.get(SHARED_RANKS_ENV) != "1":
            raise TuningError(
                f"{gpus} GPU(s) visible for {local_ranks} ranks on this node: the live bench needs "
                f"one GPU per rank; {SHARED_REFUSAL}"
            )
        return gpu_placement(local_ranks, gpus)

    def build_v2(self, choice: BenchChoice, trial_timeout_s: float, reps: int):
        """The live bench for DeepEP v2 on the visible GPUs (``tuning.v2_live``)."""
        from moepolicy.tuning.v2_live import V2LiveBench

        self.check_links(choice)
        if choice.shared:
            reps = min(reps, FUNCTIONAL_REPS)
        return V2LiveBench(choice.ranks, trial_timeout_s=trial_timeout_s, reps=reps)
