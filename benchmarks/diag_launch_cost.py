#!/usr/bin/env python3
"""Host cost of launching the quantization kernel (GPU kept busy so launches never wait): per call
microseconds of the pieces, and a profile of the fast path. One GPU.

    python benchmarks/diag_launch_cost.py
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time


def per_call_us(fn, n: int = 300) -> float:
    import torch

    torch.cuda._sleep(2_000_000_000 // 1000)  # keep the GPU busy: launches queue, never block
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn()
    dt = (time.perf_counter_ns() - t0) / n / 1000
    torch.cuda.synchronize()
    return dt


def main() -> int:
    import torch

    from moepolicy.quant import triton_kernels as tk

    if not torch.cuda.is_available():
        print("needs a GPU", file=sys.stderr)
        return 2
    x = torch.randn(4096, 7168, device="cuda").to(torch.bfloat16)
    y = torch.empty_like(x)
    tk.per_token_group(x, 128)
    torch.cuda.synchronize()
    rows = {
        "torch copy_": lambda: y.copy_(x),
        "two torch.empty": lambda: (
            torch.empty((4096, 7168), dtype=torch.float8_e4m3fn, device=x.device),
            torch.empty((4096, 56), dtype=torch.float32, device=x.device),
        ),
        "per_token_group (fast launch)": lambda: tk.per_token_group(x, 128),
    }
    for name, fn in rows.items():
        print(f"{name:32} {per_call_us(fn):7.1f} us per call", flush=True)
    tk.FAST_LAUNCH["enabled"] = False
    print(
        f"{'per_token_group (Triton launcher)':32} {per_call_us(lambda: tk.per_token_group(x, 128)):7.1f} us per call"
    )
    tk.FAST_LAUNCH["enabled"] = True
    torch.cuda._sleep(2_000_000_000 // 1000)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(300):
        tk.per_token_group(x, 128)
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(14)
    return 0


if __name__ == "__main__":
    sys.exit(main())
