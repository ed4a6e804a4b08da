"""A persistent grouped GEMM with DeepSeek-style block-128 fp8 scaling, launched on a given number of
SMs: the experts' first GEMM (gate and up) as block-fp8 checkpoints run it, for the overlap objective.

Like DeepGEMM (which serving engines tell how many SMs to use while DeepEP holds the rest), the
kernel is persistent: its grid is exactly the SM count it is given, and each program walks the tile
list with that stride, so its time follows the SMs it gets instead of falling off a wave cliff.
Activations arrive as DeepEP delivers them: fp8 rows grouped by local expert with row-major float32
scales ``[rows, K/128]``; weights are ``[experts, N, K]`` fp8 with ``[experts, N/128, K/128]`` scales.
Rows of each expert are contiguous; tiles never straddle two experts.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

SCALE_BLOCK = 128


@triton.jit
def _grouped_block_fp8_kernel(a_ptr, a_scale_ptr, b_ptr, b_scale_ptr, c_ptr,
                              tile_expert_ptr, tile_row_ptr, expert_end_ptr, order_m_ptr, order_n_ptr,
                              total, N, K,
                              stride_am, stride_asm, stride_be, stride_bn, stride_bse, stride_bsn, stride_cm,
                              BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    k_blocks = tl.cdiv(K, BK)
    for t in range(tl.program_id(0), total, tl.num_programs(0)):
        mt = tl.load(order_m_ptr + t)
        nt = tl.load(order_n_ptr + t)
        expert = tl.load(tile_expert_ptr + mt).to(tl.int64)
        row0 = tl.load(tile_row_ptr + mt)
        row_end = tl.load(expert_end_ptr + expert)
        rows = row0 + tl.arange(0, BM)
        row_ok = rows < row_end
        cols = nt * BN + tl.arange(0, BN)
        col_ok = cols < N
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for kb in range(0, k_blocks):
            ks = kb * BK + tl.arange(0, BK)
            k_ok = ks < K
            a = tl.load(a_ptr + rows[:, None] * stride_am + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(b_ptr + expert * stride_be + cols[None, :] * stride_bn + ks[:, None],
                        mask=k_ok[:, None] & col_ok[None, :], other=0.0)
            a_s = tl.load(a_scale_ptr + rows * stride_asm + kb, mask=row_ok, other=0.0)
            b_s = tl.load(b_scale_ptr + expert * stride_bse + (cols // 128) * stride_bsn + kb, mask=col_ok, other=0.0)
            acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
        tl.store(c_ptr + rows[:, None] * stride_cm + cols[None, :], acc.to(c_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & col_ok[None, :])


TILE_ORDERS = ("expert", "rows")


def tile_tables(group_rows: list[int], block_m: int, block_n: int, n: int, device,
                order: str = "expert") -> tuple[torch.Tensor, ...]:
    """Per m-tile its expert and first row; per expert its end row (rows packed, no padding); and the
    order the tiles are walked in. ``expert``: expert by expert, then n-tile, then the expert's
    m-tiles (the programs running at one time share one expert's weights); ``rows``: m-tile by
    m-tile, all n-tiles of one before the next (they share the rows)."""
    if order not in TILE_ORDERS:
        raise ValueError(f"tile order must be one of {TILE_ORDERS}, got {order!r}")
    experts, starts, ends, order_m, order_n, start = [], [], [], [], [], 0
    n_tiles = -(-n // block_n)
    for e, rows in enumerate(group_rows):
        first = len(starts)
        for r in range(start, start + int(rows), block_m):
            experts.append(e)
            starts.append(r)
        if order == "expert":
            for nt in range(n_tiles):
                order_m.extend(range(first, len(starts)))
                order_n.extend([nt] * (len(starts) - first))
        else:
            for mt in range(first, len(starts)):
                order_m.extend([mt] * n_tiles)
                order_n.extend(range(n_tiles))
        start += int(rows)
        ends.append(start)
    as_i32 = dict(dtype=torch.int32, device=device)
    return tuple(torch.tensor(v, **as_i32) for v in (experts, starts, ends, order_m, order_n))


def grouped_block_fp8(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
                      group_rows: list[int], num_sms: int, block_m: int = 64, block_n: int = 128,
                      num_warps: int = 4, num_stages: int = 4, tables=None, out: torch.Tensor | None = None
                      ) -> torch.Tensor:
    """``out[rows of e] = (a * a_scale) @ (b[e] * b_scale[e]).T`` in bf16, on ``num_sms`` programs."""
    rows, K = a.shape
    E, N, _ = b.shape
    if len(group_rows) != E or sum(group_rows) != rows:
        raise ValueError(f"group rows {len(group_rows)} experts / {sum(group_rows)} rows do not match "
                         f"a {tuple(a.shape)} and b {tuple(b.shape)}")
    tile_expert, tile_row, expert_end, order_m, order_n = tables or tile_tables(group_rows, block_m, block_n, N, a.device)
    c = out if out is not None else torch.empty((rows, N), dtype=torch.bfloat16, device=a.device)
    if order_m.numel() == 0:
        return c
    _grouped_block_fp8_kernel[(num_sms,)](
        a, a_scale, b, b_scale, c, tile_expert, tile_row, expert_end, order_m, order_n, order_m.numel(), N, K,
        a.stride(0), a_scale.stride(0), b.stride(0), b.stride(1), b_scale.stride(0), b_scale.stride(1), c.stride(0),
        BM=block_m, BN=block_n, BK=SCALE_BLOCK, num_warps=num_warps, num_stages=num_stages)
    return c


def grouped_block_fp8_reference(a, a_scale, b, b_scale, group_rows: list[int]) -> torch.Tensor:
    """The same product in float32 torch, expert by expert (for tests)."""
    K = a.shape[1]
    a32 = a.float() * a_scale.float().repeat_interleave(SCALE_BLOCK, dim=1)[:, :K]
    out, start = [], 0
    for e, n in enumerate(group_rows):
        w = b[e].float() * b_scale[e].float().repeat_interleave(SCALE_BLOCK, 0).repeat_interleave(SCALE_BLOCK, 1)[
            : b.shape[1], :K]
        out.append(a32[start:start + n] @ w.T)
        start += n
    return torch.cat(out).to(torch.bfloat16)
