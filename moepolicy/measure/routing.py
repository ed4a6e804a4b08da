"""What one EP rank receives after DeepEP's high-throughput dispatch, as a model's router spreads
tokens: the rows it receives, each row's local experts and the rows per local expert.

Every rank sends ``tokens`` tokens; each token picks ``top_k`` distinct experts, uniformly at random,
or, for a group-limited router (DeepSeek-V3's ``n_group``/``topk_group``), first ``topk_group`` of
the ``n_group`` contiguous expert groups, then ``top_k`` experts inside them. Rank 0 holds experts
``[0, experts / ep_size)``; a token reaches it once if any of its experts are there (DeepEP sends a
token to a rank once, with every local expert it picked), so a rank receives between ``tokens``
and ``min(top_k, ep_size) x tokens`` rows, and its experts see ``top_k x tokens`` (row, expert)
pairs on average. Plain Python (seeded), so the model bench and the GPU measurement see the same
counts. Under uniform routing every rank's view has the same distribution as rank 0's.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class ExpertShape:
    """A MoE layer's expert shapes at one EP size (what the expert stage of one rank runs)."""

    hidden: int
    intermediate: int  # one expert's intermediate size: w13 is [2 x intermediate, hidden]
    experts: int
    top_k: int
    ep_size: int
    groups: Optional[tuple[int, int]] = None  # (n_group, topk_group) of a group-limited router

    @property
    def local_experts(self) -> int:
        return self.experts // self.ep_size

    def label(self) -> str:
        routed = f", groups {self.groups[1]} of {self.groups[0]}" if self.groups else ""
        return (
            f"hidden {self.hidden}, intermediate {self.intermediate}, {self.experts} experts "
            f"top-{self.top_k}{routed}, EP {self.ep_size} ({self.local_experts} local)"
        )


@dataclass(frozen=True)
class RankView:
    """Rank 0's received rows: ``topk_local[r]`` lists row r's ``top_k`` picks as local expert ids
    (-1: an expert on another rank); ``per_expert[e]`` counts the rows local expert e received."""

    tokens: int  # tokens each rank sent
    topk_local: tuple[tuple[int, ...], ...]
    per_expert: tuple[int, ...]

    @property
    def rows(self) -> int:
        return len(self.topk_local)

    @property
    def pairs(self) -> int:
        return sum(self.per_expert)


def _picks(shape: ExpertShape, rng: random.Random) -> list[int]:
    if shape.groups is None:
        return rng.sample(range(shape.experts), shape.top_k)
    n_group, topk_group = shape.groups
    size = shape.experts // n_group
    chosen = rng.sample(range(n_group), topk_group)
    pool = [g * size + i for g in chosen for i in range(size)]
    return rng.sample(pool, shape.top_k)


def check_shape(shape: ExpertShape) -> Optional[str]:
    """Why ``shape`` cannot be routed (None when it can)."""
    if shape.ep_size < 1 or shape.experts % shape.ep_size:
        return f"{shape.experts} experts do not split over EP {shape.ep_size}"
    if not 1 <= shape.top_k <= shape.experts:
        return f"top_k {shape.top_k} is not between 1 and {shape.experts} experts"
    if shape.groups is not None:
        n_group, topk_group = shape.groups
        if n_group < 1 or shape.experts % n_group or not 1 <= topk_group <= n_group:
            return f"expert groups {shape.groups} do not fit {shape.experts} experts"
        if shape.top_k > topk_group * (shape.experts // n_group):
            return f"top_k {shape.top_k} exceeds the experts of {topk_group} groups"
    return None


def rank_view(shape: ExpertShape, tokens: int, seed: int = 0) -> RankView:
    """Rank 0's received rows when every one of ``shape.ep_size`` ranks sends ``tokens`` tokens."""
    problem = check_shape(shape)
    if problem:
        raise ValueError(problem)
    rng = random.Random(seed)
    local = shape.local_experts
    rows: list[tuple[int, ...]] = []
    per_expert = [0] * local
    for _ in range(tokens * shape.ep_size):
        picks = _picks(shape, rng)
        if not any(e < local for e in picks):
            continue
        rows.append(tuple(e if e < local else -1 for e in picks))
        for e in picks:
            if e < local:
                per_expert[e] += 1
    return RankView(tokens, tuple(rows), tuple(per_expert))
