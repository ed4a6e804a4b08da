"""Fused Triton quantization kernels (GPU). Bit-identical to :mod:`moepolicy.quant.reference`."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from moepolicy.quant.reference import EPS, FP8, FP8_MAX, FP8_MAX_INV
from moepolicy.settings import triton_fast_launch

# Triton's Python launcher (argument binding, specialization, cache key) costs tens of microseconds
# per call, on the sender's critical path before dispatch. After the first launch of a given call
# shape the compiled kernel is launched directly with the same arguments' layout, and the host-side
# arithmetic (grid, constexprs) of each shape is computed once (benchmarks/diag_launch_cost.py measures
# the host cost per call). MOEPOLICY_TRITON_FAST_LAUNCH=0 turns the direct launch off.
FAST_LAUNCH = {"enabled": triton_fast_launch()}
_COMPILED: dict = {}


def _launch(fn, grid: tuple, args: tuple, constexprs: dict, num_warps: int, key: tuple) -> None:
    """``fn[grid](*args, **constexprs)``; repeat launches of one ``key`` skip Triton's binder.
    ``key`` must pin everything Triton specialises on except the first tensor's alignment (the
    outputs are fresh allocations, always aligned); the grid is not part of it, so one entry serves
    every token count."""
    first = args[0]
    aligned = first.data_ptr() % 16 == 0
    compiled = _COMPILED.get(key) if FAST_LAUNCH["enabled"] and aligned else None
    if compiled is None:
        kernel = fn[grid](*args, **constexprs, num_warps=num_warps)
        if FAST_LAUNCH["enabled"] and aligned:
            _COMPILED[key] = kernel
        return
    kernel, grid3 = compiled, (*grid, 1, 1)[:3]
    try:
        values = (*args, *constexprs.values())
        stream = torch._C._cuda_getCurrentRawStream(first.device.index)
        metadata = kernel.launch_metadata(grid3, stream, *values)
        kernel.run(
            grid3[0],
            grid3[1],
            grid3[2],
            stream,
            kernel.function,
            kernel.packed_metadata,
            metadata,
            _HOOKS.runtime.launch_enter_hook,
            _HOOKS.runtime.launch_exit_hook,
            *values,
        )
    except Exception:  # noqa: BLE001 (another Triton version: use its own launcher from now on)
        FAST_LAUNCH["enabled"] = False
        fn[grid](*args, **constexprs, num_warps=num_warps)


try:
    from triton import knobs as _HOOKS
except ImportError:  # older Triton: no direct launch
    FAST_LAUNCH["enabled"] = False
    _HOOKS = None


def _next_pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


@triton.jit
def _round_pow2(scale):
    bits = scale.to(tl.int32, bitcast=True)
    exponent = (bits >> 23) & 0xFF
    exponent = exponent + ((bits & 0x7FFFFF) != 0).to(tl.int32)
    return (exponent << 23).to(tl.float32, bitcast=True)


@triton.jit
def _to_fp8(v, dtype, ROUND_ODD: tl.constexpr):
    """fp32 -> fp8 e4m3 with round-to-nearest-even, bit-identical to torch's conversion.

    ROUND_ODD goes through fp16 with round-to-odd (exact for a later 3-bit rounding), for Triton
    builds whose direct fp32 -> fp8 conversion rounds twice."""
    if ROUND_ODD:
        h = v.to(tl.float16, fp_downcast_rounding="rtz")
        inexact = (h.to(tl.float32) != v).to(tl.int16)
        h = (h.to(tl.int16, bitcast=True) | inexact).to(tl.float16, bitcast=True)
        return h.to(dtype)
    return v.to(dtype, fp_downcast_rounding="rtne")


@triton.jit
def _group_quant_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    hidden,
    num_groups,
    x_stride,
    q_stride,
    s_stride,
    GROUP: tl.constexpr,
    GROUPS_PER_PROG: tl.constexpr,
    UE8M0: tl.constexpr,
    FMAX: tl.constexpr,
    FMAX_INV: tl.constexpr,
    EPSILON: tl.constexpr,
    ROUND_ODD: tl.constexpr,
):
    row = tl.program_id(0)
    g0 = tl.program_id(1) * GROUPS_PER_PROG
    groups = g0 + tl.arange(0, GROUPS_PER_PROG)
    cols = tl.arange(0, GROUP)
    offs = groups[:, None] * GROUP + cols[None, :]
    mask = (groups[:, None] < num_groups) & (offs < hidden)
    x = tl.load(x_ptr + row * x_stride + offs, mask=mask, other=0.0).to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(x), axis=1), EPSILON)
    scale = amax * FMAX_INV
    if UE8M0:
        scale = _round_pow2(scale)
        multiplier = tl.math.div_rn(scale * 0.0 + 1.0, scale)
    else:
        multiplier = tl.math.div_rn(amax * 0.0 + FMAX, amax)
    q = tl.minimum(tl.maximum(x * multiplier[:, None], -FMAX), FMAX)
    tl.store(
        q_ptr + row * q_stride + offs, _to_fp8(q, q_ptr.dtype.element_ty, ROUND_ODD), mask=mask
    )
    tl.store(s_ptr + row * s_stride + groups, scale, mask=groups < num_groups)


# How fp32 becomes fp8: 'direct' (one rtne conversion) or 'round_odd' (through fp16, round-to-odd).
CONVERSION = {
    "mode": "direct"
}  # both were bit-identical to torch on H200 (benchmarks/diag_fp8_conversion.py)


def _round_odd() -> bool:
    return CONVERSION["mode"] == "round_odd"


# Launch shape: groups per program and warps (tuned at 8192x7168 on H200 by benchmarks/bench_dispatch.py).
LAUNCH = {"groups_per_prog": 8, "num_warps": 4}


_GROUP_PLANS: dict = {}


def _group_plan(hidden: int, group: int, ue8m0: bool, groups_per_prog, num_warps) -> tuple:
    """Groups per row, grid columns, constexprs and warps of one row shape (computed once)."""
    if _next_pow2(group) != group:
        raise ValueError(f"group {group} must be a power of two for the fused kernel")
    num_groups = -(-hidden // group)
    per_prog = min(groups_per_prog or LAUNCH["groups_per_prog"], _next_pow2(num_groups))
    grid_cols = -(-num_groups // per_prog)
    constexprs = {
        "GROUP": group,
        "GROUPS_PER_PROG": per_prog,
        "UE8M0": ue8m0,
        "FMAX": FP8_MAX,
        "FMAX_INV": FP8_MAX_INV,
        "EPSILON": EPS,
        "ROUND_ODD": _round_odd(),
    }
    return num_groups, grid_cols, constexprs, num_warps or LAUNCH["num_warps"]


def per_token_group(
    x: torch.Tensor,
    group: int = 128,
    ue8m0: bool = False,
    groups_per_prog: int | None = None,
    num_warps: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused dynamic 1×``group`` quantization; row-major float32 scales [T, ceil(H/group)]."""
    assert x.is_cuda and x.dim() == 2 and x.stride(1) == 1
    tokens, hidden = x.shape
    key = (
        hidden,
        x.stride(0),
        x.dtype,
        x.device.index,
        group,
        ue8m0,
        groups_per_prog,
        num_warps,
        LAUNCH["groups_per_prog"],
        LAUNCH["num_warps"],
        CONVERSION["mode"],
    )
    plan = _GROUP_PLANS.get(key)
    if plan is None:
        plan = _GROUP_PLANS[key] = _group_plan(hidden, group, ue8m0, groups_per_prog, num_warps)
    num_groups, grid_cols, constexprs, warps = plan
    q = torch.empty((tokens, hidden), dtype=FP8, device=x.device)
    s = torch.empty((tokens, num_groups), dtype=torch.float32, device=x.device)
    if tokens == 0:
        return q, s
    _launch(
        _group_quant_kernel,
        (tokens, grid_cols),
        (x, q, s, hidden, num_groups, x.stride(0), q.stride(0), s.stride(0)),
        constexprs,
        warps,
        ("group",) + key,
    )
    return q, s


@triton.jit
def _token_quant_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    hidden,
    x_stride,
    q_stride,
    BLOCK: tl.constexpr,
    FMAX: tl.constexpr,
    FMAX_INV: tl.constexpr,
    EPSILON: tl.constexpr,
    ROUND_ODD: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(x), axis=0), EPSILON)
    scale = amax * FMAX_INV
    multiplier = tl.math.div_rn(amax * 0.0 + FMAX, amax)
    q = tl.minimum(tl.maximum(x * multiplier, -FMAX), FMAX)
    tl.store(
        q_ptr + row * q_stride + cols, _to_fp8(q, q_ptr.dtype.element_ty, ROUND_ODD), mask=mask
    )
    tl.store(s_ptr + row, scale)


def per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused dynamic per-token quantization; scales [T, 1]."""
    tokens, hidden = x.shape
    q = torch.empty((tokens, hidden), dtype=FP8, device=x.device)
    s = torch.empty((tokens, 1), dtype=torch.float32, device=x.device)
    if tokens:
        block = _next_pow2(hidden)
        _launch(
            _token_quant_kernel,
            (tokens,),
            (x, q, s, hidden, x.stride(0), q.stride(0)),
            {
                "BLOCK": block,
                "FMAX": FP8_MAX,
                "FMAX_INV": FP8_MAX_INV,
                "EPSILON": EPS,
                "ROUND_ODD": _round_odd(),
            },
            8 if block >= 4096 else 4,
            ("token", hidden, x.stride(0), x.dtype, x.device.index, CONVERSION["mode"]),
        )
    return q, s


@triton.jit
def _static_quant_kernel(
    x_ptr, q_ptr, scale_ptr, n, BLOCK: tl.constexpr, FMAX: tl.constexpr, ROUND_ODD: tl.constexpr
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    scale = tl.load(scale_ptr)
    multiplier = tl.math.div_rn(scale * 0.0 + 1.0, scale)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    q = tl.minimum(tl.maximum(x * multiplier, -FMAX), FMAX)
    tl.store(q_ptr + offs, _to_fp8(q, q_ptr.dtype.element_ty, ROUND_ODD), mask=mask)


def per_tensor_static(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Static per-tensor quantization with a device scalar scale (bare fp8)."""
    x = x.contiguous()
    q = torch.empty(x.shape, dtype=FP8, device=x.device)
    n = x.numel()
    if n:
        _static_quant_kernel[(triton.cdiv(n, 4096),)](
            x,
            q,
            scale.to(torch.float32).reshape(1),
            n,
            BLOCK=4096,
            FMAX=FP8_MAX,
            ROUND_ODD=_round_odd(),
            num_warps=8,
        )
    return q
