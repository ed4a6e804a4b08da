"""Overlapped execution: DeepEP dispatch + combine on ``c`` SMs beside the experts' GEMM given the
other SMs (by its grid, or also by a CUDA green context: ``GemmShape.confine``), started together.

Measured on H200: cuBLAS ignores torch's SM carveout but a green context confines it; DeepEP's normal
kernels occupy ``num_sms`` SMs by construction (one block per SM). The GEMM is the experts' first
GEMM for the bucket (gate and up: K = hidden, N = 2 × expert intermediate), grouped over the local
experts with the row counts DeepEP's dispatch delivers to each. Kinds (``GemmShape.kind``):

- ``persistent`` (default): block-128 fp8, a persistent Triton kernel whose grid is the GEMM's SM
  count — what DeepGEMM does when serving engines tell it the SMs DeepEP leaves (DeepGEMM itself does
  not run on this CUDA 13 stack);
- ``grouped``: torch's fp8 grouped GEMM (``torch._scaled_grouped_mm``, row-wise scales; SM90), groups
  padded to 16 rows; its grid does not follow the green context (measured: flat from 68 to 112 SMs);
- ``dense``: one ``torch._scaled_mm`` over all rows (cuBLAS), or bf16 where fp8 is missing;
- ``persistent-clustered``: the persistent kernel launched as 2-CTA clusters (Triton ``num_ctas=2``):
  it holds its SMs in pairs, as DeepGEMM's multicast launches do. DeepEP launches cooperatively in
  2-CTA clusters too; beside the unclustered kernel launched first it often finds no pair of free SMs
  and waits for the whole GEMM, beside the clustered one it never did (2026-11-30, docs/BENCHMARKS.md "Overlap").

A kind that cannot run falls back to the next (persistent → grouped → dense) and says why; the kind
used is recorded with every result.
"""

from __future__ import annotations

import functools
import statistics
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from moepolicy.measure.gemm_shape import GemmShape
from moepolicy.measure.timing import Timer, interleaved_rounds

if TYPE_CHECKING:
    from moepolicy.measure.timing import Timer

__all__ = ["ConfinedGemm", "ExpertGemm", "GemmShape", "measure_overlap"]

GROUP_ROW_ALIGN = 16


# Launch configs tried for the persistent kernel: (block_m, block_n, num_warps, num_stages, loads),
# each in both tile orders. Like DeepGEMM, which picks its config for the SM count it is given, the
# fastest is picked per GEMM SM count (measured on H200, 2026-11-30: 64x256, 8 warps, 4-5 stages, TMA loads won
# everywhere, 17-24 % faster than through pointers; the best at 132 SMs is not always the best at 100).
# Candidates that do not compile here (an older Triton, no TMA) are skipped and recorded.
PERSISTENT_LAUNCHES = (
    (64, 256, 8, 4, "pointer"),
    (128, 128, 8, 5, "pointer"),
    (64, 128, 4, 4, "pointer"),
    (64, 256, 8, 4, "tma"),
    (64, 256, 8, 5, "tma"),
    (64, 256, 8, 3, "tma-flat"),
    (64, 256, 8, 4, "tma-ws"),
)
# In 2-CTA clusters Triton splits each tile between the two CTAs, so the clustered candidates use
# twice the tile (or twice the stages) of the plain ones: each CTA then needs more than half an SM's
# shared memory, and no two fit on one SM, as with DeepGEMM (measured: with 99 KiB per CTA, two
# clusters shared SMs beside DeepEP and the GEMM slowed down up to 1.5x)
CLUSTERED_LAUNCHES = (
    (128, 256, 8, 4, "tma"),
    (128, 256, 8, 3, "tma"),
    (64, 256, 8, 8, "tma"),
    (128, 256, 8, 4, "pointer"),
)
# a launch config: (block_m, block_n, num_warps, num_stages, loads, tile order)
LaunchConfig = tuple[int, int, int, int, str, str]
PERSISTENT_CONFIGS: tuple[LaunchConfig, ...] = tuple(
    (*cfg, order) for cfg in PERSISTENT_LAUNCHES for order in ("expert", "rows")
)
CLUSTERED_CONFIGS: tuple[LaunchConfig, ...] = tuple(
    (*cfg, order) for cfg in CLUSTERED_LAUNCHES for order in ("expert", "rows")
)
# launches per timing of a candidate, each after an L2 flush (their median counts)
PICK_LAUNCHES = 3
# interleaved timings per candidate; the median decides (timing.interleaved_rounds)
PICK_ROUNDS = 5


def _green_context(sms: int, device_index: int):
    from torch.cuda.green_contexts import GreenContext

    try:  # torch >= 2.12 takes keywords only
        return GreenContext.create(num_sms=sms, device_id=device_index)
    except TypeError:
        # torch < 2.12 takes them positionally; the stubs checked are a later torch's
        return GreenContext.create(sms, device_index)  # type: ignore[call-arg, arg-type]


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

    def __init__(
        self,
        shape: GemmShape,
        device: torch.device,
        group_rows: Optional[list[int]] = None,
        weights: Optional[dict] = None,
    ):
        self.shape, self.device = shape, device
        self.kind, self.fallback_reason = "", None
        self.launch_config: dict[int, dict[str, Any]] = {}
        # the persistent kernel's launch configs that ran
        self._launches: dict[LaunchConfig, Callable[..., Any]] = {}
        self._weights = weights if weights is not None else {}
        self._gen = torch.Generator(device=device).manual_seed(11)
        sm90 = torch.cuda.get_device_capability(device) == (9, 0)
        if shape.kind == "dense":
            group_rows = None
        if group_rows and shape.kind.startswith("persistent"):
            try:
                self._persistent(
                    group_rows, cluster=2 if shape.kind == "persistent-clustered" else 1
                )
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
                self.fallback_reason = "; ".join(
                    filter(
                        None,
                        [
                            self.fallback_reason,
                            f"grouped fp8 GEMM did not run: {type(exc).__name__}: {str(exc)[:160]}",
                        ],
                    )
                )
        elif group_rows:
            self.fallback_reason = "; ".join(
                filter(
                    None,
                    [
                        self.fallback_reason,
                        "no fp8 grouped GEMM on this GPU/torch (needs SM90 and torch._scaled_grouped_mm)",
                    ],
                )
            )
        self._dense()

    def _random(self, *size, dtype) -> torch.Tensor:
        return torch.randn(
            *size, device=self.device, generator=self._gen, dtype=torch.bfloat16
        ).to(dtype)

    def _expert_weights(self, experts: int) -> torch.Tensor:
        """fp8 ``[experts, N, K]``, shared by every GEMM of the same shape (one expert at a time: no
        float temporary of the whole stack, which is GBs at DeepSeek-V3's size)."""
        key = ("fp8", experts, self.shape.out, self.shape.hidden)
        if key not in self._weights:
            w = torch.empty(
                experts,
                self.shape.out,
                self.shape.hidden,
                dtype=torch.float8_e4m3fn,
                device=self.device,
            )
            for i in range(experts):
                w[i] = self._random(self.shape.out, self.shape.hidden, dtype=torch.float8_e4m3fn)
            self._weights[key] = w
        return self._weights[key]

    def _grouped(self, group_rows: list[int]) -> None:
        ends = padded_offsets(group_rows)
        fp8, out, hidden = torch.float8_e4m3fn, self.shape.out, self.shape.hidden
        self.a = self._random(ends[-1], hidden, dtype=fp8)
        # [G, K, N], column-major per expert
        self.b = self._expert_weights(len(ends)).transpose(-2, -1)
        self.scale_a = torch.ones(ends[-1], device=self.device)
        self.scale_b = torch.ones(len(ends), out, device=self.device)
        self.offs = torch.tensor(ends, dtype=torch.int32, device=self.device)
        self.rows = ends[-1]
        self.kind = (
            f"fp8 grouped GEMM (torch._scaled_grouped_mm, row-wise scales), {len(ends)} local experts, "
            f"{self.rows} rows (groups padded to {GROUP_ROW_ALIGN})"
        )
        self._fn = lambda: torch._scaled_grouped_mm(
            self.a, self.b, self.scale_a, self.scale_b, offs=self.offs, out_dtype=torch.bfloat16
        )

    def _persistent(self, group_rows: list[int], cluster: int = 1) -> None:
        # Triton: a GPU run only
        from moepolicy.measure import persistent_gemm as pg

        rows, (out, hidden) = sum(group_rows), (self.shape.out, self.shape.hidden)
        fp8, block = torch.float8_e4m3fn, pg.SCALE_BLOCK
        self.b = self._expert_weights(len(group_rows))
        self.b_scale = (
            torch.rand(
                len(group_rows),
                -(-out // block),
                -(-hidden // block),
                device=self.device,
                generator=self._gen,
            )
            + 0.5
        )
        self.a = self._random(rows, hidden, dtype=fp8)
        self.a_scale = (
            torch.rand(rows, -(-hidden // block), device=self.device, generator=self._gen) + 0.5
        )
        self.c = torch.empty(rows, out, dtype=torch.bfloat16, device=self.device)
        self.rows, self.group_rows, self.cluster = rows, list(group_rows), cluster
        sm_count = torch.cuda.get_device_properties(self.device).multi_processor_count
        self._launches, self.launch_config = {}, {}
        self.skipped_launches: dict[LaunchConfig, str] = {}
        self.pick_timings: dict[int, dict[LaunchConfig, float]] = {}
        # a Timer (with its L2-flush buffer), made at the first pick
        self._pick_timer: Optional[Timer] = None
        for cfg in CLUSTERED_CONFIGS if cluster > 1 else PERSISTENT_CONFIGS:
            # compile and check each, once per bucket
            try:
                tables = pg.tile_tables(
                    self.group_rows, cfg[0], cfg[1], out, self.device, order=cfg[5]
                )
                descriptors = (
                    pg.tma_descriptors(self.a, self.b, cfg[0], cfg[1])
                    if cfg[4] != "pointer"
                    else None
                )
                launch = self._launcher(cfg, tables, descriptors)
                launch(sm_count)
                torch.cuda.synchronize(self.device)
            except Exception as exc:  # noqa: BLE001 (an old Triton without TMA descriptors, a compile error)
                self.skipped_launches[cfg] = f"{type(exc).__name__}: {str(exc)[:120]}"
                continue
            self._launches[cfg] = launch
        if not self._launches:
            raise RuntimeError(
                f"no launch config ran: {next(iter(self.skipped_launches.values()))}"
            )
        self._best: dict[int, LaunchConfig] = {}
        clustered = f", in {cluster}-CTA clusters" if cluster > 1 else ""
        self.kind = (
            f"fp8 block-128 persistent grouped GEMM (Triton; grid = the GEMM's SMs{clustered}; launch "
            f"config picked per SM count), {len(group_rows)} local experts, {rows} rows"
        )
        self._sms_fn = lambda sms, trace=None: self._launches[self.pick(sms)](sms, trace)
        self._fn = lambda: self._sms_fn(sm_count)

    def _launcher(self, cfg: LaunchConfig, tables, descriptors):
        # Triton: a GPU run only
        from moepolicy.measure import persistent_gemm as pg

        def launch(sms: int, trace=None):
            return pg.grouped_block_fp8(
                self.a,
                self.a_scale,
                self.b,
                self.b_scale,
                self.group_rows,
                sms,
                *cfg[:4],
                tables=tables,
                out=self.c,
                trace=trace,
                loads=cfg[4],
                descriptors=descriptors,
                cluster=self.cluster,
            )

        return launch

    def pick(self, sms: int) -> LaunchConfig:
        """The fastest launch config on ``sms`` programs: every candidate launched once (compiled),
        then timed in ``PICK_ROUNDS`` interleaved rounds (``timing.interleaved_rounds``), each the
        median of ``PICK_LAUNCHES`` launches timed as the overlap measurement times the GEMM alone (L2
        flushed, queued), on an otherwise idle GPU; the lowest median over the rounds wins. Call it
        before anything runs beside the GEMM; :class:`ConfinedGemm` does."""
        # Triton: a GPU run only
        from moepolicy.measure import persistent_gemm as pg

        if sms not in self._best:
            for launch in self._launches.values():
                launch(sms)
            torch.cuda.synchronize(self.device)
            if self._pick_timer is None:
                self._pick_timer = Timer(self.device, collective=False)
            fns = {cfg: functools.partial(launch, sms) for cfg, launch in self._launches.items()}
            rounds = interleaved_rounds(
                self._pick_timer, fns, PICK_ROUNDS, PICK_LAUNCHES, mode="queued", warmup=0
            )
            timings = {cfg: statistics.median(xs) for cfg, xs in rounds.items()}
            best = min(timings, key=timings.__getitem__)
            self._best[sms], self.pick_timings[sms] = best, timings
            shared, _ = pg.launch_resources(*best[:5], cluster=self.cluster)
            self.launch_config[sms] = {
                "tile": f"{best[0]}x{best[1]}",
                "warps": best[2],
                "stages": best[3],
                "loads": best[4],
                "order": best[5],
                "us_alone": round(timings[best], 1),
                "candidates": len(timings),
                "pick_rounds": PICK_ROUNDS,
                "shared_kib_per_cta": shared // 1024,
            }
        return self._best[sms]

    def prepare(self, sms: int) -> None:
        """Ready the launch on ``sms`` SMs before anything runs beside it: the persistent kernel
        picks its launch config for that SM count; the other kinds have nothing to pick."""
        if self._launches:
            self.pick(sms)

    def describe(self, sms: Optional[int] = None) -> str:
        """The kind, with the launch config picked for ``sms`` where there is one."""
        cfg = self.launch_config.get(sms) if sms is not None else None
        if not cfg:
            return self.kind
        return (
            f"{self.kind}, on {sms} SMs: tile {cfg['tile']}, {cfg['warps']} warps, {cfg['stages']} stages, "
            f"{cfg['loads']} loads, {cfg['order']}-major tile order, {cfg['shared_kib_per_cta']} KiB shared "
            f"memory per CTA"
        )

    def _dense(self) -> None:
        self.rows = self.shape.rows
        if hasattr(torch, "_scaled_mm") and torch.cuda.get_device_capability(self.device)[0] >= 9:
            fp8 = torch.float8_e4m3fn
            self.a = self._random(self.rows, self.shape.hidden, dtype=fp8)
            self.b = self._random(self.shape.out, self.shape.hidden, dtype=fp8).t()
            one = torch.ones((), device=self.device)
            self.kind = f"fp8 dense GEMM (torch._scaled_mm), {self.rows} rows"
            self._fn = lambda: torch._scaled_mm(
                self.a, self.b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16
            )
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

    def run(self, sms: Optional[int] = None, trace=None):
        """One launch; a persistent kernel is launched on ``sms`` programs (default: all SMs), traced
        into ``trace`` when given (``persistent_gemm.TRACE_FIELDS``)."""
        if sms is not None and getattr(self, "_sms_fn", None) is not None:
            return self._sms_fn(sms, trace)
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
        with torch.cuda.stream(self.stream):
            # on an idle GPU, on the stream (and context) it will run on
            gemm.prepare(sms)
        how = "green context" if confine == "green" else "grid only, no green context"
        self.kind = f"{gemm.describe(sms)}; confined by {how}"
        self.fallback_reason, self.fp8 = gemm.fallback_reason, gemm.fp8

    @property
    def flops(self) -> int:
        return self.gemm.flops

    def run(self, trace=None):
        return self.gemm.run(self.sms, trace)


def spread(xs: list[float]) -> dict:
    return {
        "median_us": statistics.median(xs),
        "min_us": min(xs),
        "max_us": max(xs),
        "reps": len(xs),
    }


# DeepEP's comm "waited for the GEMM" when, inside the GEMM-first pair, it ended more than this
# fraction of its time alone after the GEMM, and took over 1.5x its time alone: it ran (mostly)
# after the GEMM, not beside it (a comm that is merely longer than the GEMM ends late too, but on time)
WAITED_FRACTION = 0.5
WAITED_STRETCH = 1.5


def deepep_waited(comm_alone_us: float, comm_end_us: float, gemm_end_us: float) -> bool:
    """Whether DeepEP, enqueued after the GEMM, ran after it instead of beside it."""
    return (
        comm_end_us - gemm_end_us > WAITED_FRACTION * comm_alone_us
        and comm_end_us > WAITED_STRETCH * comm_alone_us
    )


def measure_overlap(
    comm, gemm: ConfinedGemm, reps: int, timer, queued: bool = True, comm_no_wait=None
) -> dict:
    """``comm()`` runs dispatch + combine (DeepEP picks its own stream); the GEMM runs on its own
    stream. Returns comm alone, GEMM alone (confined), their serial sum, and the two started
    together in each launch order, each with when each side ended. ``timer``
    (``timing.Timer``) flushes L2 and meets the other ranks before every timing; ``queued``, the GPU
    spins while the host enqueues, so that the times are the GPU's (a serving host runs ahead of its
    GPU) rather than including the host's launch of the first kernel (``timing.py``). Every rank's
    timings are reduced to the slowest rank's in each repetition before the medians are taken
    (``Timer.slowest_rank_per_rep``): an expert-parallel step ends when its last rank does.

    - ``overlapped`` (GEMM first; the objective): the GEMM is enqueued first, so it already holds its
      SMs when DeepEP's kernels launch. DeepEP launches cooperatively in clusters of 2 blocks
      (29d31c0 ``launch.cuh``), so whether they find room beside the GEMM depends on where the GEMM's
      programs landed; on H200 DeepEP often waited for the whole unclustered GEMM, at split sizes that
      change with the launch timing, and never for the clustered one (``deepep_waited_for_gemm``);
    - ``overlapped_comm_first``: DeepEP's kernels are enqueued first (the full dispatch's CPU wait for
      the receive counts then delays the GEMM's launch as well);
    - ``overlapped_comm_first_no_wait`` (when ``comm_no_wait`` is given: the same communication with
      a dispatch that does not wait on the host, ``num_worst_tokens``): DeepEP enqueued first, as
      vLLM's DBO and SGLang's TBO order it, without the host wait; ``comm_no_wait`` alone is timed too."""
    clock = _PairClock(gemm, timer, queued)
    # the communications timed alone, and the pairs (prefix, communication, DeepEP enqueued first)
    comms = (
        {"comm": comm} if comm_no_wait is None else {"comm": comm, "comm_no_wait": comm_no_wait}
    )
    pairs = [("overlapped", comm, False), ("comm_first", comm, True)]
    if comm_no_wait is not None:
        pairs.append(("comm_first_no_wait", comm_no_wait, True))
    for _ in range(3):  # warm-up
        for fn in comms.values():
            fn()
        with torch.cuda.stream(gemm.stream):
            gemm.run()
    torch.cuda.synchronize()
    xs: dict[str, list[float]] = {k: [] for k in (*comms, "gemm")}
    xs.update({f"{prefix}_{side}_end": [] for prefix, _, _ in pairs for side in ("comm", "gemm")})
    for _ in range(reps):
        for name, fn in comms.items():
            xs[name].append(clock.alone(fn, clock.stream))
        xs["gemm"].append(clock.alone(gemm.run, gemm.stream))
        for prefix, comm_fn, comm_first in pairs:
            end_comm, end_gemm = clock.pair(comm_fn, comm_first)
            xs[f"{prefix}_comm_end"].append(end_comm)
            xs[f"{prefix}_gemm_end"].append(end_gemm)
    return _summary(
        timer.slowest_rank_per_rep(xs), [prefix for prefix, _, _ in pairs], gemm, queued
    )


class _PairClock:
    """Times a side alone, or the communication and the GEMM started together from one recorded
    start; the start waits for a quiet GPU and (``queued``) gives the host a head start."""

    def __init__(self, gemm: ConfinedGemm, timer, queued: bool):
        self.gemm, self.timer, self.queued = gemm, timer, queued
        self.stream = torch.cuda.current_stream()

    @staticmethod
    def _event():
        return torch.cuda.Event(enable_timing=True)

    def _started(self):
        self.timer.quiesce()
        if self.queued:
            self.timer.head_start()
        start = self._event()
        start.record(self.stream)
        return start

    def alone(self, fn, stream) -> float:
        start, end = self._started(), self._event()
        stream.wait_event(start)
        with torch.cuda.stream(stream):
            fn()
        end.record(stream)
        end.synchronize()
        return start.elapsed_time(end) * 1000

    def pair(self, comm_fn, comm_first: bool) -> tuple[float, float]:
        """(us until the communication ended, us until the GEMM ended), both from the same start."""
        gemm = self.gemm
        start, end_comm, end_gemm = self._started(), self._event(), self._event()
        gemm.stream.wait_event(start)
        if comm_first:
            comm_fn()
            end_comm.record(self.stream)
        with torch.cuda.stream(gemm.stream):
            gemm.run()
        end_gemm.record(gemm.stream)
        if not comm_first:
            comm_fn()
            end_comm.record(self.stream)
        end_comm.synchronize()
        end_gemm.synchronize()
        return start.elapsed_time(end_comm) * 1000, start.elapsed_time(end_gemm) * 1000


def _summary(
    xs: dict[str, list[float]], prefixes: list[str], gemm: ConfinedGemm, queued: bool
) -> dict:
    """Each series' spread, the serial sum, each pair until its later side ends, and the labels."""
    out: dict[str, Any] = {k: spread(v) for k, v in xs.items()}
    out["serial"] = spread([a + b for a, b in zip(xs["comm"], xs["gemm"])])
    for prefix in prefixes:  # a pair takes until its later side ends
        name = prefix if prefix == "overlapped" else f"overlapped_{prefix}"
        out[name] = spread(
            [max(a, b) for a, b in zip(xs[f"{prefix}_comm_end"], xs[f"{prefix}_gemm_end"])]
        )
    out["deepep_waited_for_gemm"] = deepep_waited(
        out["comm"]["median_us"],
        out["overlapped_comm_end"]["median_us"],
        out["overlapped_gemm_end"]["median_us"],
    )
    out["gemm_kind"] = gemm.kind
    out["timing"] = (
        "queued (GPU time)" if queued else "synced (host launch counts)"
    ) + ", slowest rank per repetition"
    if gemm.fallback_reason:
        out["gemm_fallback"] = gemm.fallback_reason
    out["floor_us"] = max(out["comm"]["median_us"], out["gemm"]["median_us"])
    return out
