"""Where the ranks of a live DeepEP group run: N ranks over the G GPUs visible, round robin.

Where G >= N each rank has a GPU of its own and the group is NCCL. Where G < N several ranks share a
GPU: NCCL refuses two ranks on one device, so the group is gloo; DeepEP's intranode ``Buffer`` still
runs (its IPC handles open across the processes on one device; DeepEP 29d31c0, 2, 4 and 8 ranks on
one H200). Such ranks share SMs and HBM and cross no NVLink: what they do is checked for function
(buffers fit, configs accepted, bytes arrive), and anything they time is not a measurement of
communication — never a tuning objective, a benchmark number or a deployable policy.
"""

from __future__ import annotations

from dataclasses import dataclass

SHARED_LABEL = "ranks share a GPU: functional only"


@dataclass(frozen=True)
class RankPlacement:
    """``ranks`` processes placed over ``gpus`` visible GPUs."""

    ranks: int
    gpus: int

    def __post_init__(self) -> None:
        if self.ranks < 1:
            raise ValueError(f"a group needs at least one rank, got {self.ranks}")
        if self.gpus < 1:
            raise ValueError(f"ranks need a CUDA GPU to run on, {self.gpus} visible")

    def device_index(self, rank: int) -> int:
        """The GPU of ``rank``: round robin over the visible GPUs."""
        return rank % self.gpus

    @property
    def shared(self) -> bool:
        """Do some ranks share a GPU (then nothing they time measures communication)."""
        return self.ranks > self.gpus

    @property
    def backend(self) -> str:
        """The process group's backend: NCCL refuses two ranks on one device."""
        return "gloo" if self.shared else "nccl"

    def describe(self) -> str:
        if not self.shared:
            return f"{self.ranks} ranks, one GPU each"
        per_gpu = -(-self.ranks // self.gpus)
        return (
            f"{self.ranks} ranks on {self.gpus} GPU(s), up to {per_gpu} per GPU ({SHARED_LABEL})"
        )


def visible_placement(ranks: int) -> RankPlacement:
    """``ranks`` placed over the CUDA GPUs this process sees (imports torch)."""
    import torch

    return RankPlacement(ranks, torch.cuda.device_count() if torch.cuda.is_available() else 0)
