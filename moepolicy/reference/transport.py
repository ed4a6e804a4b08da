"""All-to-all transports behind one small interface: DeepEP's normal kernels, and an emulation in
plain torch.distributed (gloo on CPU) with the same semantics, so the prepare/finalize code and its
correctness tests run in CI without GPUs.

Semantics (DeepEP high-throughput, intranode): each token goes once to every rank that hosts at least
one of its top-k experts; a rank receives rows grouped by source rank (in rank order), each source's
rows in token order; received top-k indices are local expert ids, -1 where the expert lives elsewhere,
and their weights 0 there (DeepEP 29d31c0 intranode.cu:366-378); scales travel with their rows and
arrive row-major. Combine sends each row back and sums per token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Protocol

import torch


@dataclass
class Dispatched:
    x: torch.Tensor
    scales: Optional[torch.Tensor]
    topk_idx: torch.Tensor
    topk_weights: torch.Tensor
    tokens_per_expert: list[int]
    src_rank: Optional[torch.Tensor]  # [R] source rank of each received row (None: not asked)
    src_token: Optional[torch.Tensor]  # [R] token index within its source rank
    handle: Any


class Transport(Protocol):
    rank: int
    world: int
    num_experts: int

    def dispatch(
        self,
        x: torch.Tensor,
        scales: Optional[torch.Tensor],
        topk_idx: torch.Tensor,
        topk_weights: torch.Tensor,
    ) -> Dispatched: ...

    def combine(self, y: torch.Tensor, handle: Any) -> torch.Tensor: ...


def destination_mask(topk_idx: torch.Tensor, num_experts: int, world: int) -> torch.Tensor:
    """[T, world] bool: does token t go to rank r (it routes to one of r's experts)."""
    local = num_experts // world
    ranks = torch.where(topk_idx >= 0, topk_idx // local, torch.full_like(topk_idx, -1))
    mask = torch.zeros((topk_idx.shape[0], world), dtype=torch.bool, device=topk_idx.device)
    for r in range(world):
        mask[:, r] = (ranks == r).any(dim=1)
    return mask


def local_topk(topk_idx: torch.Tensor, rank: int, num_experts: int, world: int) -> torch.Tensor:
    local = num_experts // world
    lo = rank * local
    inside = (topk_idx >= lo) & (topk_idx < lo + local)
    return torch.where(inside, topk_idx - lo, torch.full_like(topk_idx, -1))


@dataclass(frozen=True)
class Sent:
    """What one rank hands to dispatch: rows, their scales (or None), top-k experts and weights."""

    x: torch.Tensor
    scales: Optional[torch.Tensor]
    topk_idx: torch.Tensor
    topk_weights: torch.Tensor


def receive(sent: list[Sent], rank: int, num_experts: int) -> Dispatched:
    """What ``rank`` receives when every rank ``s`` dispatches ``sent[s]`` (the semantics above);
    the handle is the caller's."""
    world = len(sent)
    rows, srows, ridx, rwts, src_rank, src_tok = [], [], [], [], [], []
    for s, part in enumerate(sent):
        tokens = torch.nonzero(
            destination_mask(part.topk_idx, num_experts, world)[:, rank]
        ).flatten()
        rows.append(part.x[tokens])
        if part.scales is not None:
            srows.append(part.scales[tokens])
        local = local_topk(part.topk_idx[tokens], rank, num_experts, world)
        ridx.append(local)
        # 0 where the expert lives elsewhere, as DeepEP sends them
        weights = part.topk_weights[tokens]
        rwts.append(torch.where(local >= 0, weights, torch.zeros_like(weights)))
        src_rank.append(torch.full((tokens.numel(),), s, dtype=torch.int64))
        src_tok.append(tokens.to(torch.int64).cpu())
    recv_idx = torch.cat(ridx)
    per_expert = [int((recv_idx == e).sum().item()) for e in range(num_experts // world)]
    return Dispatched(
        torch.cat(rows),
        torch.cat(srows) if srows else None,
        recv_idx,
        torch.cat(rwts),
        per_expert,
        torch.cat(src_rank),
        torch.cat(src_tok),
        None,
    )


class GatherTransport:
    """Emulated all-to-all over a torch.distributed group (any backend with all_gather)."""

    def __init__(self, group=None, num_experts: int = 0):
        import torch.distributed as dist

        self.dist, self.group = dist, group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.num_experts = num_experts

    def _gather(self, t: torch.Tensor, counts: list[int]) -> list[torch.Tensor]:
        as_bytes = t.dtype == torch.float8_e4m3fn
        payload = t.view(torch.uint8) if as_bytes else t
        width = max(counts)
        padded = torch.zeros(
            (width, *payload.shape[1:]), dtype=payload.dtype, device=payload.device
        )
        padded[: payload.shape[0]] = payload
        out = [torch.empty_like(padded) for _ in range(self.world)]
        self.dist.all_gather(out, padded.contiguous(), group=self.group)
        parts = [o[:c] for o, c in zip(out, counts)]
        return [p.view(torch.float8_e4m3fn) for p in parts] if as_bytes else parts

    def dispatch(self, x, scales, topk_idx, topk_weights) -> Dispatched:
        count = torch.tensor([x.shape[0]], dtype=torch.int64, device=x.device)
        counts_t = [torch.empty_like(count) for _ in range(self.world)]
        self.dist.all_gather(counts_t, count, group=self.group)
        counts = [int(c.item()) for c in counts_t]
        sent = [
            Sent(*parts)
            for parts in zip(
                self._gather(x, counts),
                self._gather(scales.contiguous(), counts)
                if scales is not None
                else [None] * self.world,
                self._gather(topk_idx, counts),
                self._gather(topk_weights, counts),
            )
        ]
        got = receive(sent, self.rank, self.num_experts)
        got.handle = (got.src_rank, got.src_token, counts)
        return got

    def combine(self, y: torch.Tensor, handle: Any) -> torch.Tensor:
        src_rank, src_tok, counts = handle
        n = torch.tensor([y.shape[0]], dtype=torch.int64)
        ns = [torch.empty_like(n) for _ in range(self.world)]
        self.dist.all_gather(ns, n, group=self.group)
        sizes = [int(v.item()) for v in ns]
        ys = self._gather(y, sizes)
        ranks = self._gather(src_rank, sizes)
        toks = self._gather(src_tok, sizes)
        out = torch.zeros((counts[self.rank], y.shape[1]), dtype=torch.float32, device=y.device)
        for r in range(self.world):
            mine = ranks[r] == self.rank
            out.index_add_(0, toks[r][mine], ys[r][mine].to(torch.float32))
        return out.to(torch.bfloat16)


class DeepEPTransport:
    """DeepEP's normal (high-throughput) dispatch and combine on a ``deep_ep.Buffer``."""

    def __init__(
        self,
        buffer,
        num_experts: int,
        dispatch_config=None,
        combine_config=None,
        sources: bool = True,
    ):
        self.buffer = buffer
        self.rank, self.world = buffer.rank, buffer.group_size
        self.num_experts = num_experts
        self.dispatch_config, self.combine_config = dispatch_config, combine_config
        self.with_sources = sources  # read each received row's source (the host waits for the GPU)

    def dispatch(self, x, scales, topk_idx, topk_weights) -> Dispatched:
        layout = self.buffer.get_dispatch_layout(topk_idx, self.num_experts)
        per_rank, per_rdma, per_expert, in_rank, _ = layout
        payload = (x, scales) if scales is not None else x
        recv_x, recv_idx, recv_w, counts, handle, _ = self.buffer.dispatch(
            payload,
            topk_idx=topk_idx,
            topk_weights=topk_weights,
            num_tokens_per_rank=per_rank,
            num_tokens_per_rdma_rank=per_rdma,
            is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert,
            config=self.dispatch_config,
        )
        recv, recv_scales = recv_x if isinstance(recv_x, tuple) else (recv_x, None)
        src_rank, src_token = (
            self.sources(handle, recv.shape[0]) if self.with_sources else (None, None)
        )
        return Dispatched(
            recv, recv_scales, recv_idx, recv_w, list(counts), src_rank, src_token, handle
        )

    def sources(self, handle, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Source rank and token of each received row, from the intranode handle
        (rank_prefix_matrix, channel_prefix_matrix, recv_channel_prefix_matrix, recv_src_idx, ...)."""
        rank_prefix, recv_src_idx = handle[0], handle[3]
        ends = rank_prefix[:, self.rank].to(torch.int64).cpu()
        src_rank = torch.bucketize(torch.arange(rows), ends, right=True)
        return src_rank, recv_src_idx.to(torch.int64).cpu()

    def combine(self, y: torch.Tensor, handle: Any) -> torch.Tensor:
        combined, _, _ = self.buffer.combine(y, handle, config=self.combine_config)
        return combined
