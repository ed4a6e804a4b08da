#!/usr/bin/env python3
"""Compare the Triton fp8 conversions with torch's, element by element (GPU)."""

import functools
import statistics

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
        assert torch.equal(s, s_ref), "scales differ"
    print(f"{mode:10} mismatched {bad}/{total} bytes; example (x/scale, triton, torch): {sample}")


# launch-shape sweep at 8192 x 7168 (bytes read + written against the device-to-device copy)
x = torch.randn(8192, 7168, device="cuda").to(torch.bfloat16)
y = torch.empty_like(x)


def median_us(fn, reps=30):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1000)
    return statistics.median(out)


copy_us = median_us(lambda: y.copy_(x))
copy_bw = 2 * x.numel() * 2 / copy_us
qbytes = x.numel() * 2 + x.numel() + x.numel() // 128 * 4
for mode in ("direct", "round_odd"):
    triton_kernels.CONVERSION["mode"] = mode
    for gpp in (4, 8, 16):
        for warps in (2, 4, 8):
            us = median_us(
                functools.partial(
                    triton_kernels.per_token_group, x, 128, groups_per_prog=gpp, num_warps=warps
                )
            )
            print(
                f"sweep {mode:9} gpp={gpp:2} warps={warps}: {us:6.1f} us {qbytes / us / 1e3:6.0f} GB/s "
                f"= {100 * (qbytes / us) / copy_bw:4.1f}% of copy ({copy_bw / 1e3:.0f} GB/s)"
            )
