"""The DeepEP operations that are timed: both orders, the timed regions, and combine.

Timed regions:
- ``full``: what serving calls: ``get_dispatch_layout`` + dispatch without a cached handle (notify,
  the CPU wait for receive counts, the kernel);
- ``no-wait``: the same call with ``num_worst_tokens`` (the most rows a rank can receive: every
  token of every rank), so the host does not wait for the receive counts; the receive buffers are
  sized for that worst case (DeepEP 29d31c0, intranode only; ``buffer.py`` dispatch docstring). This
  is the call a CUDA-graph-captured or run-ahead serving host makes;
- ``cached``: dispatch reusing a cached handle (the kernel only), as DeepEP's own sweep times it.
A handle is bound to the SM count it was made with (measured on 2 x H200), so each config gets fresh handles.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from moepolicy.measure.placement import RankPlacement
from moepolicy.measure.ranks import join_group
from moepolicy.quant import triton_kernels

REGIONS = ("full", "no-wait", "cached")


def join_rank(
    rank: int,
    world: int,
    rendezvous: str,
    nvl_bytes: int,
    placement: Optional[RankPlacement] = None,
):
    """This process's GPU in its group and an intranode DeepEP buffer of ``nvl_bytes`` (rounded
    down to 128): what every legacy DeepEP worker process starts with."""
    import deep_ep
    import torch.distributed as dist

    device = join_group(rank, world, rendezvous, placement)
    return device, deep_ep.Buffer(dist.group.WORLD, int(nvl_bytes) // 128 * 128, 0)


@dataclass
class Workload:
    x: torch.Tensor
    topk_idx: torch.Tensor
    topk_weights: torch.Tensor
    num_experts: int


def make_workload(
    tokens: int,
    hidden: int,
    num_experts: int,
    top_k: int,
    rank: int,
    device,
    routing: str = "uniform",
    skew: float = 1.2,
) -> Workload:
    g = torch.Generator(device="cpu").manual_seed(7919 * (rank + 1) + tokens)
    x = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16).to(device)
    scores = torch.rand(tokens, num_experts, generator=g)
    if routing == "skewed":  # Zipf-like popularity over experts
        popularity = 1.0 / torch.arange(1, num_experts + 1, dtype=torch.float32) ** skew
        scores = scores * popularity[torch.randperm(num_experts, generator=g)]
    topk_idx = scores.topk(top_k, dim=1).indices.to(torch.int64).to(device)
    topk_w = torch.rand(tokens, top_k, generator=g).to(device)
    return Workload(x, topk_idx, topk_w, num_experts)


class DeepEPOps:
    """Callables over one buffer and workload for a given (dispatch, combine) config pair."""

    def __init__(self, buffer, work: Workload, dispatch_config, combine_config, group: int = 128):
        self.buffer, self.work = buffer, work
        self.dcfg, self.ccfg = dispatch_config, combine_config
        self.group = group
        self.layout = buffer.get_dispatch_layout(work.topk_idx, work.num_experts)
        q, s = triton_kernels.per_token_group(work.x, group)
        self._fp8 = (q, s)
        self.handle_bf16, self.recv_bf16, counts = self._dispatch(work.x, None)
        self.handle_fp8, _, _ = self._dispatch(self._fp8, None)
        # rows each local expert receives, as DeepEP counts them: the groups of the expert GEMM
        self.rows_per_local_expert = [int(n) for n in counts]

    @property
    def worst_tokens(self) -> int:
        """The most rows this rank can receive: every token of every rank (a token goes to a rank at
        most once)."""
        return int(self.work.topk_idx.shape[0]) * int(self.buffer.group_size)

    def _dispatch(self, payload, handle, layout: Optional[tuple] = None, worst: int = 0):
        w = self.work
        if handle is not None:
            recv, _, _, _, _, _ = self.buffer.dispatch(payload, handle=handle, config=self.dcfg)
            return handle, recv, None
        per_rank, per_rdma, per_expert, in_rank, _ = layout or self.layout
        recv, _, _, per_local_expert, handle, _ = self.buffer.dispatch(
            payload,
            topk_idx=w.topk_idx,
            topk_weights=w.topk_weights,
            num_tokens_per_rank=per_rank,
            num_tokens_per_rdma_rank=per_rdma,
            is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert,
            num_worst_tokens=worst,
            config=self.dcfg,
        )
        return handle, recv, per_local_expert

    def _full(self, payload, region: str = "full"):
        """``get_dispatch_layout`` + dispatch without a handle; ``no-wait``: with ``num_worst_tokens``."""
        if region not in REGIONS:
            raise ValueError(f"timed region must be one of {REGIONS}, got {region!r}")
        layout = self.buffer.get_dispatch_layout(self.work.topk_idx, self.work.num_experts)
        return self._dispatch(
            payload, None, layout, self.worst_tokens if region == "no-wait" else 0
        )[1]

    # --- the timed operations ---------------------------------------------------------------
    def quant_then_dispatch(self, region: str):
        payload = triton_kernels.per_token_group(self.work.x, self.group)
        if region == "cached":
            return self._dispatch(payload, self.handle_fp8)[1]
        return self._full(payload, region)

    def dispatch_then_quant(self, region: str):
        # ``no-wait``: the receiver quantizes every row of the worst-case buffer, as a host that does
        # not know the receive count must
        recv = (
            self._dispatch(self.work.x, self.handle_bf16)[1]
            if region == "cached"
            else self._full(self.work.x, region)
        )
        return triton_kernels.per_token_group(recv, self.group)

    def dispatch_only(self, payload_kind: str, region: str):
        payload = self.work.x if payload_kind == "bf16" else self._fp8
        handle = self.handle_bf16 if payload_kind == "bf16" else self.handle_fp8
        return (
            self._dispatch(payload, handle)[1]
            if region == "cached"
            else self._full(payload, region)
        )

    def quant_only(self, which: str):
        """The quantization alone: of the T tokens this rank sends, or of the rows it received."""
        return triton_kernels.per_token_group(
            self.work.x if which == "sent" else self.recv_bf16, self.group
        )

    def combine(self):
        out, _, _ = self.buffer.combine(self.recv_bf16, self.handle_bf16, config=self.ccfg)
        return out

    @property
    def received_rows(self) -> int:
        return int(self.recv_bf16.shape[0])
