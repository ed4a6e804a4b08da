"""The per-rank expert stage of a block-fp8 MoE layer after DeepEP's high-throughput dispatch, run
with the real expert GEMMs (GPU).

What a rank does with its received rows (``measure.routing.RankView``), as vLLM's DeepGEMM experts
(``TritonOrDeepGemmExperts``) do it: take fp8 rows with 1x128 float32 scales (the wire of
``quant_then_dispatch``) or bf16 rows it quantizes itself (``dispatch_then_quant``: one 1x128
quantization per received row), permute the (row, local expert) pairs into DeepGEMM's contiguous
layout (each expert's rows padded to its M alignment), run the w13 grouped GEMM, SiLU-and-mul, the
second 1x128 quantization, the w2 grouped GEMM, and the router-weighted sum back onto the received
rows. The GEMMs are DeepGEMM's ``m_grouped_fp8_gemm_nt_contiguous``, found the way vLLM finds it
(``deep_gemm``, then vLLM's vendored ``vllm.third_party.deep_gemm``). The glue between them is
moepolicy's (torch ops and its Triton 1x128 quantizer), not vLLM's fused Triton kernels: the same in
every arm, so it cancels in an order comparison; against another kernel it makes DeepGEMM's stage
an upper bound of vLLM's.

FlashInfer's CUTLASS MoE (vLLM's default experts for block fp8 on Hopper with EP) takes bf16 rows
and quantizes them itself; it is listed with why it is not measured where it cannot run here
(:func:`kernel_status`): no stand-in is ever timed in its place.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
from dataclasses import dataclass
from typing import Callable, Optional, Protocol, Sequence

import torch

from moepolicy.measure.routing import ExpertShape, RankView
from moepolicy.schema.measured import KernelStatus
from moepolicy.quant.reference import to_col_major_tma, dequant
from moepolicy.measure.timing import Timer
from moepolicy.measure.rounds import balanced_rounds

BLOCK = 128  # the 1x128 activation / 128x128 weight scale blocks of block-fp8 checkpoints
FP8 = torch.float8_e4m3fn
FLASHINFER_NOT_DRIVEN = (
    "flashinfer imports, but moepolicy drives no cutlass_fused_moe yet (none validated on a GPU)"
)
FLASHINFER_MISSING = (
    "flashinfer is not installed here; its SM90 MoE module (fused_moe_90) is JIT-built from 248 "
    "CUDA sources with nvcc >= 12.8 (measured: ~1.7 h with 16 jobs), and no prebuilt module exists"
)


def find_deep_gemm():
    """``(module, where)``: DeepGEMM as vLLM finds it, or ``(None, why)``."""
    for name in ("deep_gemm", "vllm.third_party.deep_gemm"):
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 (a broken build says why; the next place is tried)
            why = f"{name}: {type(exc).__name__}: {exc}"
            continue
        if not hasattr(module, "m_grouped_fp8_gemm_nt_contiguous"):
            why = f"{name} {getattr(module, '__version__', '?')} has no m_grouped_fp8_gemm_nt_contiguous"
            continue
        return module, f"{name} {getattr(module, '__version__', '?')}"
    return None, f"DeepGEMM does not import ({why})"


def kernel_status(kernels: Sequence[str]) -> tuple[KernelStatus, ...]:
    """For each expert kernel: whether this process can time its stage, with where or why not."""
    out = []
    for kernel in kernels:
        if kernel == "deepgemm":
            module, detail = find_deep_gemm()
            sm90 = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
            if module is not None and not sm90:
                module, detail = None, "the DeepGEMM stage here is for Hopper (sm90) GPUs"
            out.append(KernelStatus(kernel, module is not None, detail))
        elif kernel == "flashinfer_cutlass":
            present = importlib.util.find_spec("flashinfer") is not None
            out.append(
                KernelStatus(
                    kernel, False, FLASHINFER_NOT_DRIVEN if present else FLASHINFER_MISSING
                )
            )
        else:
            out.append(
                KernelStatus(kernel, False, f"moepolicy cannot run {kernel}'s expert stage")
            )
    return tuple(out)


def _quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from moepolicy.quant import triton_kernels

    return triton_kernels.per_token_group(x, BLOCK)


def _col_major(scale: torch.Tensor) -> torch.Tensor:
    return to_col_major_tma(scale)


@dataclass(frozen=True)
class ExpertLayout:
    """Where each local expert's rows sit in DeepGEMM's contiguous layout, from the rows each expert
    received (DeepEP's per-expert counts): each expert's rows padded to the M alignment."""

    per_expert: tuple[int, ...]
    layout_rows: int  # M_sum: the contiguous layout's rows
    expert_ends: torch.Tensor  # [local experts] int32: DeepGEMM's psum layout (start + rows)
    shift: torch.Tensor  # [local experts] int64: layout offset minus pair offset of each expert


class Routed(Protocol):
    """What the stage needs besides the rows: each row's local experts, their weights, the layout."""

    topk_local: torch.Tensor  # [R, top_k] int64, -1 for other ranks' experts
    topk_weights: torch.Tensor  # [R, top_k] float32
    layout: ExpertLayout


@dataclass
class ReceivedRouting:
    topk_local: torch.Tensor
    topk_weights: torch.Tensor
    layout: ExpertLayout


@dataclass
class StageInputs:
    """One bucket's received rows on the device, in both wire formats, and the sender's own tokens."""

    sent: torch.Tensor  # [tokens, hidden] bf16: what this rank quantizes before dispatch
    rows_bf16: torch.Tensor  # [R, hidden]
    rows_fp8: torch.Tensor  # [R, hidden] fp8 (what quantize-first delivers)
    rows_scale: torch.Tensor  # [R, hidden / 128] float32, row-major, as DeepEP delivers it
    topk_local: torch.Tensor  # [R, top_k] int64, -1 for other ranks' experts
    topk_weights: torch.Tensor  # [R, top_k] float32
    layout: ExpertLayout

    @property
    def per_expert(self) -> tuple[int, ...]:
        return self.layout.per_expert


def aligned_offsets(per_expert: Sequence[int], align: int) -> tuple[list[int], int]:
    """Each expert's first row in the contiguous layout (rows padded to ``align``) and the total."""
    offsets, at = [], 0
    for n in per_expert:
        offsets.append(at)
        at += -(-n // align) * align
    return offsets, at


def expert_layout(per_expert: Sequence[int], align: int, device) -> ExpertLayout:
    offsets, total = aligned_offsets(per_expert, align)
    starts = [sum(per_expert[:e]) for e in range(len(per_expert))]
    ends = [o + n for o, n in zip(offsets, per_expert)]
    shift = [o - s0 for o, s0 in zip(offsets, starts)]
    return ExpertLayout(
        tuple(per_expert),
        max(total, align),
        torch.tensor(ends, dtype=torch.int32, device=device),
        torch.tensor(shift, dtype=torch.int64, device=device),
    )


def stage_inputs(view: RankView, shape: ExpertShape, device, align: int, seed: int = 0):
    g = torch.Generator(device=device).manual_seed(seed)
    rows = max(view.rows, 1)
    rows_bf16 = torch.randn(rows, shape.hidden, generator=g, device=device).to(torch.bfloat16)
    sent = torch.randn(view.tokens, shape.hidden, generator=g, device=device).to(torch.bfloat16)
    topk = torch.tensor(view.topk_local or [[-1] * shape.top_k], dtype=torch.int64)
    weights = torch.rand(topk.shape, generator=g, device=device)
    q, s = _quant(rows_bf16)
    return StageInputs(
        sent,
        rows_bf16,
        q,
        s,
        topk.to(device),
        weights,
        expert_layout(view.per_expert, align, device),
    )


class DeepGemmExperts:
    """A rank's local experts with random block-fp8 weights, run through DeepGEMM's grouped GEMMs in
    the contiguous layout with per-expert row ends (``use_psum_layout``, as vLLM runs them on SM90)."""

    name = "deepgemm"

    def __init__(self, shape: ExpertShape, device, seed: int = 0, deep_gemm=None):
        self.dg = deep_gemm or find_deep_gemm()[0]
        if self.dg is None:
            raise RuntimeError(find_deep_gemm()[1])
        self.shape, self.device = shape, device
        self.align = int(self.dg.get_mk_alignment_for_contiguous_layout())
        g = torch.Generator(device=device).manual_seed(seed + 1)
        local, hidden, inter = shape.local_experts, shape.hidden, shape.intermediate
        self.w13, self.s13 = self._weights(local, 2 * inter, hidden, g)
        self.w2, self.s2 = self._weights(local, hidden, inter, g)

    def _weights(self, groups: int, n: int, k: int, g: torch.Generator):
        """fp8 weights [groups, n, k] with float32 128x128 block scales (values only need a scale)."""
        w = torch.empty((groups, n, k), dtype=FP8, device=self.device)
        for e in range(groups):  # one expert at a time: the bf16 draft of all of them can be GBs
            draft = torch.randn(n, k, generator=g, device=self.device, dtype=torch.bfloat16)
            w[e] = (draft * 0.25).to(FP8)
        scale = torch.full(
            (groups, -(-n // BLOCK), -(-k // BLOCK)), 1.0 / (4 * math.sqrt(k)), device=self.device
        )
        return w, scale

    def inputs(self, view: RankView, seed: int = 0) -> StageInputs:
        return stage_inputs(view, self.shape, self.device, self.align, seed)

    def _gemm(self, a, scale, w, w_scale, out, layout: ExpertLayout) -> None:
        self.dg.m_grouped_fp8_gemm_nt_contiguous(
            (a, _col_major(scale)), (w, w_scale), out, layout.expert_ends, use_psum_layout=True
        )

    def run(self, x: torch.Tensor, scale: torch.Tensor, routed: Routed) -> torch.Tensor:
        """The stage on fp8 rows ``x`` with row-major 1x128 scales: [R, hidden] bf16 out."""
        # Triton: a GPU run only
        from moepolicy.measure.moe_glue import weighted_gather

        layout = routed.layout
        flat = routed.topk_local.reshape(-1)
        pairs = sum(layout.per_expert)
        key = torch.where(flat >= 0, flat, torch.full_like(flat, self.shape.local_experts))
        order = torch.argsort(key, stable=True)[:pairs]  # the (row, expert) pairs by expert
        dest = torch.arange(pairs, device=x.device) + layout.shift[flat[order]]
        source = torch.zeros(layout.layout_rows, dtype=torch.int64, device=x.device)
        # padding rows read row 0: never computed
        source[dest] = order // routed.topk_local.shape[1]
        a = x.view(torch.uint8).index_select(0, source).view(FP8)
        h = torch.empty(
            (layout.layout_rows, self.w13.shape[1]), dtype=torch.bfloat16, device=x.device
        )
        self._gemm(a, scale.index_select(0, source), self.w13, self.s13, h, layout)
        inter = self.shape.intermediate
        a2, s2 = _quant(torch.nn.functional.silu(h[:, :inter]) * h[:, inter:])
        y = torch.empty(
            (layout.layout_rows, self.shape.hidden), dtype=torch.bfloat16, device=x.device
        )
        self._gemm(a2, s2, self.w2, self.s2, y, layout)
        pos = torch.full_like(flat, -1)
        pos[order] = dest
        return weighted_gather(y, pos.view_as(routed.topk_local), routed.topk_weights)


class ReceivedRowsStage:
    """DeepGEMM's expert stage on what DeepEP's dispatch delivered, called as ``moepolicy bench``
    calls its experts: fp8 rows with row-major 1x128 float32 scales (quantized before dispatch, or by
    the receiver after it), or bf16 rows (bf16 on the wire), which it quantizes 1x128 first, as
    vLLM's DeepGEMM experts do. The contiguous layout follows the per-expert counts dispatch handed
    the host, kept per count tuple (a bench feeds the same routing every repetition), so the stage
    never makes the host wait."""

    def __init__(self, experts: DeepGemmExperts):
        self.experts = experts
        self._layouts: dict[tuple[int, ...], ExpertLayout] = {}

    def __call__(
        self,
        x: torch.Tensor,
        scales: Optional[torch.Tensor],
        topk_idx: torch.Tensor,
        topk_weights: torch.Tensor,
        tokens_per_expert: Sequence[int],
    ) -> torch.Tensor:
        counts = tuple(int(n) for n in tokens_per_expert)
        if not sum(counts):  # nothing routed here: every received row's experts are elsewhere
            return torch.zeros(
                x.shape[0], self.experts.shape.hidden, dtype=torch.bfloat16, device=x.device
            )
        if x.dtype == torch.bfloat16 or scales is None:
            x, scales = _quant(x.to(torch.bfloat16))
        elif scales.dtype != torch.float32:
            raise ValueError(
                f"DeepGEMM's SM90 stage takes float32 1x128 scales, got {scales.dtype} (UE8M0 is SM100's)"
            )
        layout = self._layouts.get(counts)
        if layout is None:
            layout = self._layouts[counts] = expert_layout(counts, self.experts.align, x.device)
        routed = ReceivedRouting(topk_idx, topk_weights.float(), layout)
        return self.experts.run(x, scales, routed)


def step_arms(experts: DeepGemmExperts, inp: StageInputs) -> dict[str, Callable[[], object]]:
    """A rank's own compute in one MoE step, per order: ``quant_then_dispatch`` quantizes the tokens
    it sends and runs the stage on the fp8 rows it receives; ``dispatch_then_quant`` quantizes the
    bf16 rows it receives, then runs the stage (the dispatch between is not timed here)."""

    def quant_first():
        _quant(inp.sent)
        return experts.run(inp.rows_fp8, inp.rows_scale, inp)

    def dispatch_first():
        q, s = _quant(inp.rows_bf16)
        return experts.run(q, s, inp)

    return {"quant_then_dispatch": quant_first, "dispatch_then_quant": dispatch_first}


def reference_stage(experts: DeepGemmExperts, inp: StageInputs) -> torch.Tensor:
    """The same stage in float32 torch, expert by expert, from the same fp8 rows, weights and scales
    (the check the GPU test makes of :meth:`DeepGemmExperts.run`)."""
    x = dequant(inp.rows_fp8, inp.rows_scale, BLOCK)
    out = torch.zeros_like(x)
    inter = experts.shape.intermediate
    for e in range(experts.shape.local_experts):
        rows, slots = (inp.topk_local == e).nonzero(as_tuple=True)
        if rows.numel() == 0:
            continue
        w13 = (
            experts.w13[e].float()
            * experts.s13[e]
            .repeat_interleave(BLOCK, 0)
            .repeat_interleave(BLOCK, 1)[: experts.w13.shape[1], : experts.w13.shape[2]]
        )
        w2 = (
            experts.w2[e].float()
            * experts.s2[e]
            .repeat_interleave(BLOCK, 0)
            .repeat_interleave(BLOCK, 1)[: experts.w2.shape[1], : experts.w2.shape[2]]
        )
        h = x[rows] @ w13.t()
        act = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]
        y = act @ w2.t()
        out.index_add_(0, rows, y * inp.topk_weights[rows, slots].unsqueeze(1))
    return out


def time_arms(
    fns: dict[str, Callable[[], object]],
    rounds: int,
    reps: int,
    mode: str,
    device,
    warm_up: bool = True,
) -> dict[str, list[float]]:
    """Per-round medians (microseconds) of each arm, rounds rotating over the arms after a dropped
    warm-up pass (``measure.timing.interleaved_rounds`` on this one process)."""
    timer = Timer(device, collective=False)
    for fn in fns.values() if warm_up else ():
        fn()  # the first call of a shape JIT-compiles DeepGEMM's kernels
    torch.cuda.synchronize(device)

    def once(name):
        return timer.step_us(fns[name], reps, warmup=1, mode=mode)["median_us"]

    return balanced_rounds(list(fns), once, rounds, warm_up=warm_up)


def closeness_diff(got: torch.Tensor, want: torch.Tensor) -> float:
    """DeepGEMM's own closeness measure: 1 - cosine similarity of the flattened tensors."""
    got, want = got.double(), want.double()
    denominator = (got * got + want * want).sum()
    if float(denominator) == 0.0:
        return 0.0
    return float(1 - 2 * (got * want).sum() / denominator)


def stage_shape_ok(shape: ExpertShape) -> Optional[str]:
    """Why DeepGEMM's block-fp8 stage cannot take this shape (None when it can)."""
    for name, size in (("hidden", shape.hidden), ("intermediate", shape.intermediate)):
        if size % BLOCK:
            return f"{name} {size} is not a multiple of {BLOCK} (block-fp8 scales)"
    return None
