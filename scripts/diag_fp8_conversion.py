#!/usr/bin/env python3
"""Compare the Triton fp8 conversions with torch's, element by element (GPU)."""

import torch

from moepolicy.quant import reference, triton_kernels

for mode in ("direct", "round_odd"):
    triton_kernels.CONVERSION["mode"] = mode
    bad = total = 0
    sample = None
    for seed in range(4):
        g = torch.Generator(device="cuda").manual_seed(seed)
        x = (torch.randn(2048, 7168, device="cuda", generator=g) * 5).to(torch.bfloat16)
        q_ref, s_ref = reference.per_token_group(x, 128)
        q, s = triton_kernels.per_token_group(x, 128)
        diff = q.view(torch.uint8) != q_ref.view(torch.uint8)
        bad += int(diff.sum())
        total += diff.numel()
        if sample is None and diff.any():
            i = torch.nonzero(diff)[0]
            v = (x[i[0], i[1]].float() / s_ref[i[0], i[1] // 128]).item()
            sample = (v, q[i[0], i[1]].float().item(), q_ref[i[0], i[1]].float().item())
        assert torch.equal(s, s_ref)
    print(f"{mode:10} mismatched {bad}/{total} bytes; example (x/scale, triton, torch): {sample}")
