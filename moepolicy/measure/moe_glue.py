"""Triton glue of the expert stage (GPU): the router-weighted sum of each received row's expert
outputs, read from the grouped GEMM's contiguous layout without atomics (what vLLM's ``ep_gather``
does after DeepGEMM's experts)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_H = 1024


@triton.jit
def _weighted_gather_kernel(
    y_ptr,
    pos_ptr,
    w_ptr,
    out_ptr,
    hidden,
    stride_y,
    stride_out,
    TOPK: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < hidden
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(TOPK):
        at = tl.load(pos_ptr + row * TOPK + j)
        if at >= 0:
            weight = tl.load(w_ptr + row * TOPK + j)
            v = tl.load(y_ptr + at * stride_y + offs, mask=mask, other=0.0)
            acc += v.to(tl.float32) * weight
    tl.store(out_ptr + row * stride_out + offs, acc.to(tl.bfloat16), mask=mask)


def weighted_gather(y: torch.Tensor, pos: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``out[r] = sum_j weights[r, j] * y[pos[r, j]]`` over the slots with ``pos >= 0``, summed in
    float32, bf16 out: [R, hidden] from the layout ``y`` [M, hidden] and ``pos``/``weights`` [R, k]."""
    rows, top_k = pos.shape
    hidden = y.shape[1]
    out = torch.empty((rows, hidden), dtype=torch.bfloat16, device=y.device)
    if rows:
        grid = (rows, triton.cdiv(hidden, BLOCK_H))
        _weighted_gather_kernel[grid](
            y,
            pos.contiguous(),
            weights.float().contiguous(),
            out,
            hidden,
            y.stride(0),
            out.stride(0),
            TOPK=top_k,
            BLOCK=BLOCK_H,
        )
    return out
