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
TRACE_FIELDS = ("sm", "start_ns", "end_ns", "tiles")
# (shared memory bytes, registers per thread) of each compiled launch config, filled as they compile;
# read it with launch_resources()
LAUNCH_RESOURCES: dict[tuple, tuple[int, int]] = {}


def launch_resources(
    block_m: int,
    block_n: int,
    num_warps: int,
    num_stages: int,
    loads: str = "pointer",
    cluster: int = 1,
) -> tuple[int, int]:
    """(shared memory bytes per CTA, registers per thread) of a launch config that has run; (0, 0)
    before it has."""
    return LAUNCH_RESOURCES.get(
        _resource_key(block_m, block_n, num_warps, num_stages, loads, cluster), (0, 0)
    )


def _resource_key(block_m, block_n, num_warps, num_stages, loads, cluster) -> tuple:
    return (block_m, block_n, num_warps, num_stages, loads, cluster)


@triton.jit
def _sm_id():
    return tl.inline_asm_elementwise(
        "mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def _global_ns():
    return tl.inline_asm_elementwise(
        "mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1
    )


@triton.jit
def _tile_at(t, order_m_ptr, order_n_ptr, tile_expert_ptr, tile_row_ptr, expert_end_ptr):
    """The ``t``-th tile of the walk: its expert, first row, the expert's end row, and its n-tile."""
    mt = tl.load(order_m_ptr + t)
    expert = tl.load(tile_expert_ptr + mt).to(tl.int64)
    return (
        expert,
        tl.load(tile_row_ptr + mt),
        tl.load(expert_end_ptr + expert),
        tl.load(order_n_ptr + t),
    )


@triton.jit
def _write_trace(trace_ptr, t0, total):
    """Where and when this program ran: its SM, first and last nanosecond, tiles done."""
    pid = tl.program_id(0)
    row = trace_ptr + pid.to(tl.int64) * 4
    tl.store(row, _sm_id().to(tl.int64))
    tl.store(row + 1, t0)
    tl.store(row + 2, _global_ns())
    tl.store(row + 3, tl.cdiv(total - pid, tl.num_programs(0)).to(tl.int64))


@triton.jit
def _grouped_block_fp8_kernel(
    a_ptr,
    a_scale_ptr,
    b_ptr,
    b_scale_ptr,
    c_ptr,
    tile_expert_ptr,
    tile_row_ptr,
    expert_end_ptr,
    order_m_ptr,
    order_n_ptr,
    total,
    N,
    K,
    stride_am,
    stride_asm,
    stride_be,
    stride_bn,
    stride_bse,
    stride_bsn,
    stride_cm,
    trace_ptr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    TRACE: tl.constexpr,
):
    """Operands loaded through pointers (any GPU Triton runs on)."""
    if TRACE:
        t0 = _global_ns()
    k_blocks = tl.cdiv(K, BK)
    for t in range(tl.program_id(0), total, tl.num_programs(0)):
        expert, row0, row_end, nt = _tile_at(
            t, order_m_ptr, order_n_ptr, tile_expert_ptr, tile_row_ptr, expert_end_ptr
        )
        rows = row0 + tl.arange(0, BM)
        row_ok = rows < row_end
        cols = nt * BN + tl.arange(0, BN)
        col_ok = cols < N
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for kb in range(0, k_blocks):
            ks = kb * BK + tl.arange(0, BK)
            k_ok = ks < K
            a = tl.load(
                a_ptr + rows[:, None] * stride_am + ks[None, :],
                mask=row_ok[:, None] & k_ok[None, :],
                other=0.0,
            )
            b = tl.load(
                b_ptr + expert * stride_be + cols[None, :] * stride_bn + ks[:, None],
                mask=k_ok[:, None] & col_ok[None, :],
                other=0.0,
            )
            a_s = tl.load(a_scale_ptr + rows * stride_asm + kb, mask=row_ok, other=0.0)
            b_s = tl.load(
                b_scale_ptr + expert * stride_bse + (cols // 128) * stride_bsn + kb,
                mask=col_ok,
                other=0.0,
            )
            acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
        tl.store(
            c_ptr + rows[:, None] * stride_cm + cols[None, :],
            acc.to(c_ptr.dtype.element_ty),
            mask=row_ok[:, None] & col_ok[None, :],
        )
    if TRACE:
        _write_trace(trace_ptr, t0, total)


@triton.jit
def _tma_k_step(
    a_desc,
    b_desc,
    a_scale_ptr,
    b_scale_ptr,
    acc,
    kb,
    row0,
    b_row0,
    rows,
    row_ok,
    cols,
    col_ok,
    expert,
    stride_asm,
    stride_bse,
    stride_bsn,
    BK: tl.constexpr,
):
    a = a_desc.load([row0, kb * BK])
    b = b_desc.load([b_row0, kb * BK])
    a_s = tl.load(a_scale_ptr + rows * stride_asm + kb, mask=row_ok, other=0.0)
    b_s = tl.load(
        b_scale_ptr + expert * stride_bse + (cols // 128) * stride_bsn + kb, mask=col_ok, other=0.0
    )
    return acc + tl.dot(a, b.T) * a_s[:, None] * b_s[None, :]


@triton.jit
def _tma_tile(
    t,
    a_desc,
    a_scale_ptr,
    b_desc,
    b_scale_ptr,
    c_ptr,
    tile_expert_ptr,
    tile_row_ptr,
    expert_end_ptr,
    order_m_ptr,
    order_n_ptr,
    N,
    K,
    stride_asm,
    stride_bse,
    stride_bsn,
    stride_cm,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
):
    expert, row0, row_end, nt = _tile_at(
        t, order_m_ptr, order_n_ptr, tile_expert_ptr, tile_row_ptr, expert_end_ptr
    )
    rows = row0 + tl.arange(0, BM)
    row_ok = rows < row_end
    cols = nt * BN + tl.arange(0, BN)
    col_ok = cols < N
    b_row0 = (expert * N + nt * BN).to(tl.int32)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    if WARP_SPECIALIZE:
        for kb in tl.range(0, tl.cdiv(K, BK), warp_specialize=True):
            acc = _tma_k_step(
                a_desc,
                b_desc,
                a_scale_ptr,
                b_scale_ptr,
                acc,
                kb,
                row0,
                b_row0,
                rows,
                row_ok,
                cols,
                col_ok,
                expert,
                stride_asm,
                stride_bse,
                stride_bsn,
                BK,
            )
    else:
        for kb in range(0, tl.cdiv(K, BK)):
            acc = _tma_k_step(
                a_desc,
                b_desc,
                a_scale_ptr,
                b_scale_ptr,
                acc,
                kb,
                row0,
                b_row0,
                rows,
                row_ok,
                cols,
                col_ok,
                expert,
                stride_asm,
                stride_bse,
                stride_bsn,
                BK,
            )
    tl.store(
        c_ptr + rows[:, None] * stride_cm + cols[None, :],
        acc.to(c_ptr.dtype.element_ty),
        mask=row_ok[:, None] & col_ok[None, :],
    )


@triton.jit
def _grouped_block_fp8_tma_kernel(
    a_desc,
    a_scale_ptr,
    b_desc,
    b_scale_ptr,
    c_ptr,
    tile_expert_ptr,
    tile_row_ptr,
    expert_end_ptr,
    order_m_ptr,
    order_n_ptr,
    total,
    N,
    K,
    stride_asm,
    stride_bse,
    stride_bsn,
    stride_cm,
    trace_ptr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    TRACE: tl.constexpr,
    FLATTEN: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
):
    """Operand tiles loaded by TMA (SM90+): A as ``[rows, K]``, B as the ``[experts * N, K]`` stack. A
    tile may read rows of the next expert or past the end (zero-filled); they are never stored.
    ``FLATTEN`` pipelines the tile loop with the K loop (the next tile's loads start before this
    tile's epilogue); ``WARP_SPECIALIZE`` gives loads and MMAs their own warps."""
    if TRACE:
        t0 = _global_ns()
    if FLATTEN:
        for t in tl.range(tl.program_id(0), total, tl.num_programs(0), flatten=True):
            _tma_tile(
                t,
                a_desc,
                a_scale_ptr,
                b_desc,
                b_scale_ptr,
                c_ptr,
                tile_expert_ptr,
                tile_row_ptr,
                expert_end_ptr,
                order_m_ptr,
                order_n_ptr,
                N,
                K,
                stride_asm,
                stride_bse,
                stride_bsn,
                stride_cm,
                BM,
                BN,
                BK,
                WARP_SPECIALIZE,
            )
    else:
        for t in range(tl.program_id(0), total, tl.num_programs(0)):
            _tma_tile(
                t,
                a_desc,
                a_scale_ptr,
                b_desc,
                b_scale_ptr,
                c_ptr,
                tile_expert_ptr,
                tile_row_ptr,
                expert_end_ptr,
                order_m_ptr,
                order_n_ptr,
                N,
                K,
                stride_asm,
                stride_bse,
                stride_bsn,
                stride_cm,
                BM,
                BN,
                BK,
                WARP_SPECIALIZE,
            )
    if TRACE:
        _write_trace(trace_ptr, t0, total)


TILE_ORDERS = ("expert", "rows")


def tile_tables(
    group_rows: list[int], block_m: int, block_n: int, n: int, device, order: str = "expert"
) -> tuple[torch.Tensor, ...]:
    """Per m-tile its expert and first row; per expert its end row (rows packed, no padding); and the
    order the tiles are walked in. ``expert``: expert by expert, then n-tile, then the expert's
    m-tiles (the programs running at one time share one expert's weights); ``rows``: m-tile by
    m-tile, all n-tiles of one before the next (they share the rows)."""
    if order not in TILE_ORDERS:
        raise ValueError(f"tile order must be one of {TILE_ORDERS}, got {order!r}")
    experts: list[int] = []
    starts: list[int] = []
    ends: list[int] = []
    order_m: list[int] = []
    order_n: list[int] = []
    start = 0
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


# operand loads: through pointers; by TMA; by TMA with the tile loop flattened into the K loop; by
# TMA with warp-specialised K loop
LOADS = ("pointer", "tma", "tma-flat", "tma-ws")


def tma_descriptors(a: torch.Tensor, b: torch.Tensor, block_m: int, block_n: int) -> tuple:
    """Host TMA descriptors of A ``[rows, K]`` and the weight stack viewed as ``[experts * N, K]``."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    E, N, K = b.shape
    return (
        TensorDescriptor.from_tensor(a, [block_m, SCALE_BLOCK]),
        TensorDescriptor.from_tensor(b.reshape(E * N, K), [block_n, SCALE_BLOCK]),
    )


def grouped_block_fp8(
    a: torch.Tensor,
    a_scale: torch.Tensor,
    b: torch.Tensor,
    b_scale: torch.Tensor,
    group_rows: list[int],
    num_sms: int,
    block_m: int = 64,
    block_n: int = 128,
    num_warps: int = 4,
    num_stages: int = 4,
    tables=None,
    out: torch.Tensor | None = None,
    trace: torch.Tensor | None = None,
    loads: str = "pointer",
    descriptors=None,
    cluster: int = 1,
) -> torch.Tensor:
    """``out[rows of e] = (a * a_scale) @ (b[e] * b_scale[e]).T`` in bf16, on ``num_sms`` programs.
    ``loads``: one of :data:`LOADS` (the ``tma`` ones need SM90+; ``descriptors`` from :func:`tma_descriptors` may be
    passed to save building them per call). ``trace`` (int64 ``[num_sms, 4]``, optional) receives per
    program: its SM, its start and end on the GPU's global nanosecond timer, and the tiles it computed
    (:data:`TRACE_FIELDS`). ``cluster`` > 1 launches ``num_sms / cluster`` programs as thread-block
    clusters of that many CTAs (Triton ``num_ctas``; SM90+), so the GEMM holds its SMs in groups, as
    DeepGEMM's multicast launches do; ``trace`` then has one row per program."""
    rows, K = a.shape
    E, N, _ = b.shape
    if len(group_rows) != E or sum(group_rows) != rows:
        raise ValueError(
            f"group rows {len(group_rows)} experts / {sum(group_rows)} rows do not match "
            f"a {tuple(a.shape)} and b {tuple(b.shape)}"
        )
    if loads not in LOADS:
        raise ValueError(f"loads must be one of {LOADS}, got {loads!r}")
    tile_expert, tile_row, expert_end, order_m, order_n = tables or tile_tables(
        group_rows, block_m, block_n, N, a.device
    )
    c = out if out is not None else torch.empty((rows, N), dtype=torch.bfloat16, device=a.device)
    if order_m.numel() == 0:
        return c
    if cluster < 1 or num_sms % cluster:
        raise ValueError(f"num_sms {num_sms} must be a multiple of the cluster size {cluster}")
    programs = num_sms // cluster
    if trace is not None and tuple(trace.shape) != (programs, len(TRACE_FIELDS)):
        raise ValueError(
            f"trace must be [{programs}, {len(TRACE_FIELDS)}], got {tuple(trace.shape)}"
        )
    tables_and_sizes = (tile_expert, tile_row, expert_end, order_m, order_n, order_m.numel(), N, K)
    meta = dict(
        BM=block_m,
        BN=block_n,
        BK=SCALE_BLOCK,
        TRACE=trace is not None,
        num_warps=num_warps,
        num_stages=num_stages,
        **({"num_ctas": cluster} if cluster > 1 else {}),
    )
    trace_arg = trace if trace is not None else c
    if loads.startswith("tma"):
        a_desc, b_desc = descriptors or tma_descriptors(a, b, block_m, block_n)
        compiled = _grouped_block_fp8_tma_kernel[(programs,)](
            a_desc,
            a_scale,
            b_desc,
            b_scale,
            c,
            *tables_and_sizes,
            a_scale.stride(0),
            b_scale.stride(0),
            b_scale.stride(1),
            c.stride(0),
            trace_arg,
            FLATTEN=loads == "tma-flat",
            WARP_SPECIALIZE=loads == "tma-ws",
            **meta,
        )
    else:
        compiled = _grouped_block_fp8_kernel[(programs,)](
            a,
            a_scale,
            b,
            b_scale,
            c,
            *tables_and_sizes,
            a.stride(0),
            a_scale.stride(0),
            b.stride(0),
            b.stride(1),
            b_scale.stride(0),
            b_scale.stride(1),
            c.stride(0),
            trace_arg,
            **meta,
        )
    key = _resource_key(block_m, block_n, num_warps, num_stages, loads, cluster)
    if key not in LAUNCH_RESOURCES and compiled is not None:
        LAUNCH_RESOURCES[key] = (
            int(getattr(getattr(compiled, "metadata", None), "shared", 0) or 0),
            int(getattr(compiled, "n_regs", 0) or 0),
        )
    return c


def grouped_block_fp8_reference(a, a_scale, b, b_scale, group_rows: list[int]) -> torch.Tensor:
    """The same product in float32 torch, expert by expert (for tests)."""
    K = a.shape[1]
    a32 = a.float() * a_scale.float().repeat_interleave(SCALE_BLOCK, dim=1)[:, :K]
    out, start = [], 0
    for e, n in enumerate(group_rows):
        w = (
            b[e].float()
            * b_scale[e]
            .float()
            .repeat_interleave(SCALE_BLOCK, 0)
            .repeat_interleave(SCALE_BLOCK, 1)[: b.shape[1], :K]
        )
        out.append(a32[start : start + n] @ w.T)
        start += n
    return torch.cat(out).to(torch.bfloat16)
