"""Overlapped execution: DeepEP dispatch + combine on ``c`` SMs beside an expert-sized GEMM confined
to the other SMs with a CUDA green context, started together.

FACTS.md: cuBLAS ignores torch's SM carveout but a green context confines it; DeepEP's normal
kernels occupy ``num_sms`` SMs by construction (one block per SM). The GEMM is the expert
computation's size for the bucket: rows = tokens × top-k (per rank, on average), K = hidden,
N = 2 × expert intermediate (gate and up); fp8 via ``torch._scaled_mm`` where the GPU has it (a
dense stand-in for the grouped kernel: DeepGEMM does not run on this CUDA 13 stack).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GemmShape:
    rows: int
    hidden: int
    out: int


class ConfinedGemm:
    def __init__(self, shape: GemmShape, sms: int, device: torch.device):
        from torch.cuda.green_contexts import GreenContext

        self.ctx = GreenContext.create(sms, device.index)
        self.stream = self.ctx.Stream()
        g = torch.Generator(device=device).manual_seed(11)
        a = torch.randn(shape.rows, shape.hidden, device=device, generator=g)
        b = torch.randn(shape.out, shape.hidden, device=device, generator=g)
        self.fp8 = hasattr(torch, "_scaled_mm") and torch.cuda.get_device_capability(device)[0] >= 9
        if self.fp8:
            self.a = a.to(torch.float8_e4m3fn)
            self.b = b.to(torch.float8_e4m3fn).t()  # column-major second operand
            self.one = torch.ones((), device=device)
        else:
            self.a, self.b = a.to(torch.bfloat16), b.to(torch.bfloat16).t()
        self.flops = 2 * shape.rows * shape.hidden * shape.out

    def run(self):
        if self.fp8:
            return torch._scaled_mm(self.a, self.b, scale_a=self.one, scale_b=self.one, out_dtype=torch.bfloat16)
        return self.a @ self.b


def _spread(xs):
    return {"median_us": statistics.median(xs), "min_us": min(xs), "max_us": max(xs), "reps": len(xs)}


def measure_overlap(comm, gemm: ConfinedGemm, reps: int, flush) -> dict:
    """``comm()`` runs dispatch + combine (DeepEP picks its own stream); the GEMM runs on the green
    context's stream. Returns comm alone, GEMM alone (confined), serial sum and overlapped times."""
    device_stream = torch.cuda.current_stream()

    def timed(fn, stream):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        with torch.cuda.stream(stream):
            fn()
        end.record(stream)
        end.synchronize()
        return start.elapsed_time(end) * 1000

    for _ in range(3):
        comm()
        with torch.cuda.stream(gemm.stream):
            gemm.run()
    torch.cuda.synchronize()
    alone_comm, alone_gemm, overlapped = [], [], []
    for _ in range(reps):
        flush()
        alone_comm.append(timed(comm, device_stream))
        flush()
        alone_gemm.append(timed(gemm.run, gemm.stream))
        flush()
        start = torch.cuda.Event(enable_timing=True)
        end_comm, end_gemm = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(device_stream)
        gemm.stream.wait_event(start)
        with torch.cuda.stream(gemm.stream):
            gemm.run()
        end_gemm.record(gemm.stream)
        comm()
        end_comm.record(device_stream)
        end_comm.synchronize()
        end_gemm.synchronize()
        overlapped.append(max(start.elapsed_time(end_comm), start.elapsed_time(end_gemm)) * 1000)
    serial = [a + b for a, b in zip(alone_comm, alone_gemm)]
    out = {"comm": _spread(alone_comm), "gemm": _spread(alone_gemm), "serial": _spread(serial),
           "overlapped": _spread(overlapped)}
    out["floor_us"] = max(out["comm"]["median_us"], out["gemm"]["median_us"])
    return out
