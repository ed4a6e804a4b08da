"""Torch reference quantizers (run on CPU in CI and on GPU as the ground truth)."""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
FP8_MAX_INV = float(torch.tensor(1.0 / 448.0, dtype=torch.float32))  # 1/448 rounded to float32
EPS = 1e-4  # the amax floor DeepEP's low-latency kernel uses (kFP8Margin)


def round_scale_ue8m0(scale: torch.Tensor) -> torch.Tensor:
    """Round positive float32 scales up to a power of two (exponent-only, UE8M0-representable)."""
    bits = scale.contiguous().view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    exponent = exponent + (mantissa != 0).to(torch.int32)
    return (exponent << 23).view(torch.float32)


def _ieee_div(a, b) -> torch.Tensor:
    """``a / b`` rounded once (IEEE). Dividing a CUDA tensor by a Python scalar multiplies by the
    reciprocal instead, which can differ in the last bit from the kernels' division."""
    a = torch.as_tensor(a, dtype=torch.float32)
    b = torch.as_tensor(b, dtype=torch.float32, device=a.device)
    return torch.div(*torch.broadcast_tensors(a, b))


def _scales(amax: torch.Tensor, ue8m0: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale written out, multiplier applied to x), as DeepEP's low-latency kernel computes them:
    ``scale = amax * (1/448)``, ``x * (448 / amax)``; power-of-two scales invert exactly."""
    amax = amax.clamp_min(EPS)
    if ue8m0:
        scale = round_scale_ue8m0(amax * torch.full_like(amax, FP8_MAX_INV))
        return scale, _ieee_div(torch.ones_like(scale), scale)
    return amax * torch.full_like(amax, FP8_MAX_INV), _ieee_div(
        torch.full_like(amax, FP8_MAX), amax
    )


def _quant(x32: torch.Tensor, multiplier: torch.Tensor) -> torch.Tensor:
    return torch.clamp(x32 * multiplier, -FP8_MAX, FP8_MAX).to(FP8)


def per_token_group(
    x: torch.Tensor, group: int = 128, ue8m0: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic 1×``group`` quantization: (fp8 [T, H], float32 scales [T, ceil(H/group)])."""
    tokens, hidden = x.shape
    groups = -(-hidden // group)
    x32 = x.to(torch.float32)
    padded = torch.nn.functional.pad(x32, (0, groups * group - hidden)).view(tokens, groups, group)
    scale, multiplier = _scales(padded.abs().amax(dim=-1), ue8m0)
    q = _quant(padded, multiplier.unsqueeze(-1)).view(tokens, groups * group)[:, :hidden]
    return q.contiguous(), scale.contiguous()


def per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token: one float32 scale per row, shape [T, 1]."""
    return per_token_group(x, group=x.shape[1])


def per_tensor_static(x: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """Static per-tensor with a known scale (bare fp8, no scales on the wire): ``x * (1/scale)``."""
    scale_t = torch.as_tensor(scale, dtype=torch.float32, device=x.device).reshape(1)
    return _quant(x.to(torch.float32), _ieee_div(torch.ones_like(scale_t), scale_t))


def per_tensor_dynamic(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-tensor: one scale over every row this rank holds."""
    scale, multiplier = _scales(x.to(torch.float32).abs().amax().reshape(1), False)
    return _quant(x.to(torch.float32), multiplier), scale


def global_static_scale(per_expert_scales: torch.Tensor) -> torch.Tensor:
    """The global-scale convention: one input scale, the maximum over the experts' scales."""
    return per_expert_scales.to(torch.float32).amax().reshape(1)


def pack_ue8m0(scale: torch.Tensor) -> torch.Tensor:
    """Pack power-of-two float32 scales [T, G] into int32 [T, ceil(G/4)] of exponent bytes."""
    tokens, groups = scale.shape
    exponents = ((scale.contiguous().view(torch.int32) >> 23) & 0xFF).to(torch.int32)
    padded = torch.nn.functional.pad(exponents, (0, (-groups) % 4))
    b = padded.view(tokens, -1, 4)
    return (b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)).contiguous()


def unpack_ue8m0(packed: torch.Tensor, groups: int) -> torch.Tensor:
    tokens = packed.shape[0]
    parts = [(packed >> (8 * i)) & 0xFF for i in range(4)]
    exponents = torch.stack(parts, dim=-1).view(tokens, -1)[:, :groups]
    return (exponents.to(torch.int32) << 23).view(torch.float32)


def to_col_major_tma(scale: torch.Tensor) -> torch.Tensor:
    """[T, G] scales as DeepGEMM's TMA loads want them: column-major, T padded to 4 (16 bytes)."""
    tokens, groups = scale.shape
    aligned = -(-tokens // 4) * 4
    out = torch.empty((groups, aligned), dtype=scale.dtype, device=scale.device)
    out[:, :tokens] = scale.t()
    return out.t()[:tokens]


def dequant(q: torch.Tensor, scale: torch.Tensor, group: int) -> torch.Tensor:
    tokens, hidden = q.shape
    expanded = scale.repeat_interleave(group, dim=1)[:, :hidden] if scale.shape[1] > 1 else scale
    return q.to(torch.float32) * expanded
