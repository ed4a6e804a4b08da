"""Overlapped execution: DeepEP dispatch + combine on ``c`` SMs beside the experts' GEMM given the
other SMs (by its grid, or also by a CUDA green context: ``GemmShape.confine``), started together.

FACTS.md: cuBLAS ignores torch's SM carveout but a green context confines it; DeepEP's normal
kernels occupy ``num_sms`` SMs by construction (one block per SM). The GEMM is the experts' first
GEMM for the bucket (gate and up: K = hidden, N = 2 × expert intermediate), grouped over the local
experts with the row counts DeepEP's dispatch delivers to each. Kinds (``GemmShape.kind``):

- ``persistent`` (default): block-128 fp8, a persistent Triton kernel whose grid is the GEMM's SM
  count — what DeepGEMM does when serving engines tell it the SMs DeepEP leaves (DeepGEMM itself does
  not run on this CUDA 13 stack, FACTS.md);
- ``grouped``: torch's fp8 grouped GEMM (``torch._scaled_grouped_mm``, row-wise scales; SM90), groups
  padded to 16 rows; its grid does not follow the green context (measured: flat from 68 to 112 SMs);
- ``dense``: one ``torch._scaled_mm`` over all rows (cuBLAS), or bf16 where fp8 is missing.

A kind that cannot run falls back to the next (persistent → grouped → dense) and says why; the kind
used is recorded with every result.
"""

from __future__ import annotations

import statistics
from typing import Optional

import torch

from moepolicy.measure.gemm_shape import GemmShape

__all__ = ["ConfinedGemm", "ExpertGemm", "GemmShape", "measure_overlap"]

GROUP_ROW_ALIGN = 16


# (block_m, block_n, num_warps, num_stages, tile order) tried for the persistent kernel on all SMs;
# the fastest is kept (run 15/16 on H200: 128x128/8/3 and 64x256/8/3 won)
PERSISTENT_CONFIGS = tuple((*cfg, order) for cfg in ((64, 128, 4, 4), (128, 128, 8, 3), (128, 128, 4, 4),
                                                     (64, 256, 8, 3), (128, 256, 8, 3))
                           for order in ("expert", "rows"))


def _green_context(sms: int, device_index: int):
    from torch.cuda.green_contexts import GreenContext

    try:  # torch >= 2.12 takes keywords only
        return GreenContext.create(num_sms=sms, device_id=device_index)
    except TypeError:
        return GreenContext.create(sms, device_index)


def padded_offsets(group_rows: list[int], align: int = GROUP_ROW_ALIGN) -> list[int]:
    """Cumulative row ends of the groups, each group padded up to ``align`` rows."""
    ends, total = [], 0
    for n in group_rows:
        total += -(-int(n) // align) * align
        ends.append(total)
    return ends


class ExpertGemm:
    """The experts' GEMM for one bucket: operands and the kernel call, on no particular SMs.
    ``weights`` may be shared between instances of the same (experts, N, K) to save memory."""

    def __init__(self, shape: GemmShape, device: torch.device, group_rows: Optional[list[int]] = None,
                 weights: Optional[dict] = None):
        self.shape, self.device = shape, device
        self.kind, self.fallback_reason = "", None
        self._weights = weights if weights is not None else {}
        self._gen = torch.Generator(device=device).manual_seed(11)
        sm90 = torch.cuda.get_device_capability(device) == (9, 0)
        if shape.kind == "dense":
            group_rows = None
        if group_rows and shape.kind == "persistent":
            try:
                self._persistent(group_rows)
                return
            except Exception as exc:  # noqa: BLE001 (no Triton, no fp8 dot, a compile error: fall back, say why)
                self.fallback_reason = f"persistent block-fp8 GEMM did not run: {type(exc).__name__}: {str(exc)[:160]}"
        if group_rows and sm90 and hasattr(torch, "_scaled_grouped_mm"):
            try:
                self._grouped(group_rows)
                self.run()
                torch.cuda.synchronize(device)
                return
            except (RuntimeError, TypeError) as exc:
                self.fallback_reason = "; ".join(filter(None, [
                    self.fallback_reason, f"grouped fp8 GEMM did not run: {type(exc).__name__}: {str(exc)[:160]}"]))
        elif group_rows:
            self.fallback_reason = "; ".join(filter(None, [
                self.fallback_reason, "no fp8 grouped GEMM on this GPU/torch (needs SM90 and torch._scaled_grouped_mm)"]))
        self._dense()

    def _random(self, *size, dtype) -> torch.Tensor:
        return torch.randn(*size, device=self.device, generator=self._gen, dtype=torch.bfloat16).to(dtype)

    def _expert_weights(self, experts: int) -> torch.Tensor:
        """fp8 ``[experts, N, K]``, shared by every GEMM of the same shape (one expert at a time: no
        float temporary of the whole stack, which is GBs at DeepSeek-V3's size)."""
        key = ("fp8", experts, self.shape.out, self.shape.hidden)
        if key not in self._weights:
            w = torch.empty(experts, self.shape.out, self.shape.hidden, dtype=torch.float8_e4m3fn, device=self.device)
            for i in range(experts):
                w[i] = self._random(self.shape.out, self.shape.hidden, dtype=torch.float8_e4m3fn)
            self._weights[key] = w
        return self._weights[key]

    def _grouped(self, group_rows: list[int]) -> None:
        ends = padded_offsets(group_rows)
        fp8, out, hidden = torch.float8_e4m3fn, self.shape.out, self.shape.hidden
        self.a = self._random(ends[-1], hidden, dtype=fp8)
        self.b = self._expert_weights(len(ends)).transpose(-2, -1)  # [G, K, N], column-major per expert
        self.scale_a = torch.ones(ends[-1], device=self.device)
        self.scale_b = torch.ones(len(ends), out, device=self.device)
        self.offs = torch.tensor(ends, dtype=torch.int32, device=self.device)
        self.rows = ends[-1]
        self.kind = (f"fp8 grouped GEMM (torch._scaled_grouped_mm, row-wise scales), {len(ends)} local experts, "
                     f"{self.rows} rows (groups padded to {GROUP_ROW_ALIGN})")
        self._fn = lambda: torch._scaled_grouped_mm(self.a, self.b, self.scale_a, self.scale_b, offs=self.offs,
                                                    out_dtype=torch.bfloat16)

    def _persistent(self, group_rows: list[int]) -> None:
        from moepolicy.measure import persistent_gemm as pg

        rows, (out, hidden) = sum(group_rows), (self.shape.out, self.shape.hidden)
        fp8, block = torch.float8_e4m3fn, pg.SCALE_BLOCK
        self.b = self._expert_weights(len(group_rows))
        self.b_scale = torch.rand(len(group_rows), -(-out // block), -(-hidden // block), device=self.device,
                                  generator=self._gen) + 0.5
        self.a = self._random(rows, hidden, dtype=fp8)
        self.a_scale = torch.rand(rows, -(-hidden // block), device=self.device, generator=self._gen) + 0.5
        self.c = torch.empty(rows, out, dtype=torch.bfloat16, device=self.device)
        self.rows, self.group_rows = rows, list(group_rows)
        sm_count = torch.cuda.get_device_properties(self.device).multi_processor_count
        timings = {}
        for cfg in PERSISTENT_CONFIGS:  # pick the launch config on the whole GPU, once per bucket
            tables = pg.tile_tables(self.group_rows, cfg[0], cfg[1], out, self.device, order=cfg[4])

            def call(tables=tables, cfg=cfg, sms=sm_count):
                return pg.grouped_block_fp8(self.a, self.a_scale, self.b, self.b_scale, self.group_rows, sms,
                                            *cfg[:4], tables=tables, out=self.c)

            call()
            torch.cuda.synchronize(self.device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(5):
                call()
            end.record()
            end.synchronize()
            timings[cfg] = (start.elapsed_time(end) * 200.0, tables)
        cfg = min(timings, key=lambda c: timings[c][0])
        tables = timings[cfg][1]
        self.kind = (f"fp8 block-128 persistent grouped GEMM (Triton; grid = the GEMM's SMs), {len(group_rows)} "
                     f"local experts, {rows} rows, tile {cfg[0]}x{cfg[1]}, {cfg[2]} warps, {cfg[3]} stages, "
                     f"{cfg[4]}-major tile order")
        self.launch_config = {"config": cfg, "us_on_all_sms": round(timings[cfg][0], 1)}
        self._sms_fn = lambda sms: pg.grouped_block_fp8(self.a, self.a_scale, self.b, self.b_scale, self.group_rows,
                                                        sms, *cfg[:4], tables=tables, out=self.c)
        self._fn = lambda: self._sms_fn(sm_count)

    def _dense(self) -> None:
        self.rows = self.shape.rows
        if hasattr(torch, "_scaled_mm") and torch.cuda.get_device_capability(self.device)[0] >= 9:
            fp8 = torch.float8_e4m3fn
            self.a = self._random(self.rows, self.shape.hidden, dtype=fp8)
            self.b = self._random(self.shape.out, self.shape.hidden, dtype=fp8).t()
            one = torch.ones((), device=self.device)
            self.kind = f"fp8 dense GEMM (torch._scaled_mm), {self.rows} rows"
            self._fn = lambda: torch._scaled_mm(self.a, self.b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        else:
            self.a = self._random(self.rows, self.shape.hidden, dtype=torch.bfloat16)
            self.b = self._random(self.shape.out, self.shape.hidden, dtype=torch.bfloat16).t()
            self.kind = f"bf16 dense GEMM, {self.rows} rows"
            self._fn = lambda: self.a @ self.b

    @property
    def fp8(self) -> bool:
        return self.kind.startswith("fp8")

    @property
    def flops(self) -> int:
        return 2 * self.rows * self.shape.hidden * self.shape.out

    def run(self, sms: Optional[int] = None):
        """One launch; a persistent kernel is launched on ``sms`` programs (default: all SMs)."""
        if sms is not None and getattr(self, "_sms_fn", None) is not None:
            return self._sms_fn(sms)
        return self._fn()


class ConfinedGemm:
    """An :class:`ExpertGemm` given ``sms`` SMs: launched on a green context's stream of that many SMs
    (``confine="green"``), or on a plain stream with only a persistent kernel's grid set to ``sms``
    (``confine="grid"``; other kernels then are not confined at all)."""

    def __init__(self, gemm: ExpertGemm, sms: int, confine: str = "grid"):
        if confine not in ("green", "grid"):
            raise ValueError(f"confine must be 'green' or 'grid', got {confine!r}")
        self.gemm, self.sms, self.confine = gemm, sms, confine
        self.ctx = _green_context(sms, gemm.device.index) if confine == "green" else None
        self.stream = self.ctx.Stream() if self.ctx is not None else torch.cuda.Stream(gemm.device)
        how = "green context" if confine == "green" else "grid only, no green context"
        self.kind = f"{gemm.kind}; confined by {how}"
        self.fallback_reason, self.fp8 = gemm.fallback_reason, gemm.fp8

    @property
    def flops(self) -> int:
        return self.gemm.flops

    def run(self):
        return self.gemm.run(self.sms)


def spread(xs: list[float]) -> dict:
    return {"median_us": statistics.median(xs), "min_us": min(xs), "max_us": max(xs), "reps": len(xs)}


def measure_overlap(comm, gemm: ConfinedGemm, reps: int, flush) -> dict:
    """``comm()`` runs dispatch + combine (DeepEP picks its own stream); the GEMM runs on the green
    context's stream. Returns comm alone, GEMM alone (confined), their serial sum, the overlapped pair
    (start to the later end) and, inside the overlapped pair, when each side ended."""
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
    alone_comm, alone_gemm, overlapped, side_comm, side_gemm = [], [], [], [], []
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
        side_comm.append(start.elapsed_time(end_comm) * 1000)
        side_gemm.append(start.elapsed_time(end_gemm) * 1000)
        overlapped.append(max(side_comm[-1], side_gemm[-1]))
    serial = [a + b for a, b in zip(alone_comm, alone_gemm)]
    out = {"comm": spread(alone_comm), "gemm": spread(alone_gemm), "serial": spread(serial),
           "overlapped": spread(overlapped), "overlapped_comm_end": spread(side_comm),
           "overlapped_gemm_end": spread(side_gemm), "gemm_kind": gemm.kind}
    if gemm.fallback_reason:
        out["gemm_fallback"] = gemm.fallback_reason
    out["floor_us"] = max(out["comm"]["median_us"], out["gemm"]["median_us"])
    return out
