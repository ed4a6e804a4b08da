#!/usr/bin/env python3
"""Time the experts' GEMM (the one `tune --overlap` runs beside DeepEP) alone on N SMs, for N across
the range: the persistent kernel launched on N programs (with the launch config picked for N, and the
runners-up), torch's grouped and cuBLAS's dense GEMM on a green context of N SMs; DeepSeek-V3 and
Qwen3-30B-A3B shapes, on one GPU. Shows how each kernel scales with the SMs it is given. Writes JSON
with provenance.

    python benchmarks/gemm_sm_sweep.py --out gemm_sm_sweep.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import functools
import statistics
import sys
from pathlib import Path

from moepolicy.measure.shapes import BENCH_MODELS, bench_shape, least_bytes


def rows_per_local_expert(
    tokens: int, experts: int, top_k: int, ep: int = 2, seed: int = 0
) -> list[int]:
    """Rank 0's share under uniform random top-k routing of ``tokens`` per rank on ``ep`` ranks."""
    import torch

    g = torch.Generator().manual_seed(seed)
    idx = torch.rand(tokens * ep, experts, generator=g).topk(top_k, dim=1).indices.flatten()
    counts = torch.bincount(idx, minlength=experts)
    return [int(n) for n in counts[: experts // ep]]


def copy_tbps(timer, gib: int = 4, reps: int = 10) -> float:
    """This GPU's memory bandwidth as a device-to-device copy of ``gib`` GiB sees it (read + write),
    median of ``reps`` (timed as the GEMM is: ``Timer.samples``, queued): the roof a memory-bound GEMM
    approaches."""
    import torch

    src = torch.empty(gib << 30, dtype=torch.uint8, device=timer.device)
    dst = torch.empty_like(src)
    copy = functools.partial(dst.copy_, src)
    us = statistics.median(timer.samples(copy, reps=reps, warmup=1, mode="queued"))
    del copy
    del src, dst
    return 2 * (gib << 30) / us / 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="gemm_sm_sweep.json")
    p.add_argument(
        "--sms", nargs="+", type=int, default=[132, 128, 124, 120, 116, 112, 108, 100, 84, 68]
    )
    p.add_argument("--tokens", nargs="+", type=int, default=[1024, 4096])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument(
        "--kinds",
        nargs="+",
        default=["persistent", "persistent-clustered", "grouped", "dense"],
        choices=["persistent", "persistent-clustered", "grouped", "dense"],
    )
    args = p.parse_args()
    import torch

    from moepolicy.measure.overlapped_step import ConfinedGemm, ExpertGemm, GemmShape
    from moepolicy.measure.timing import Timer

    if not torch.cuda.is_available():
        print("gemm_sm_sweep: needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda", 0)
    timer, weights, rows_out = Timer(device, collective=False), {}, []
    roof = copy_tbps(timer)
    print(f"device-to-device copy: {roof:.2f} TB/s (read + write; the memory roof)", flush=True)
    for shape_name in BENCH_MODELS:
        dims = bench_shape(shape_name)
        hidden, experts, top_k, inter = dims.hidden, dims.experts, dims.top_k, dims.intermediate
        for tokens in args.tokens:
            groups = rows_per_local_expert(tokens, experts, top_k)
            for kind in args.kinds:
                gemm = ExpertGemm(
                    GemmShape(sum(groups), hidden, 2 * inter, kind), device, groups, weights
                )
                times = {}
                for sms in args.sms:
                    # the persistent kernel is held by its grid (as serving runs it); the others only by a green context
                    confined = ConfinedGemm(
                        gemm, sms, "grid" if kind.startswith("persistent") else "green"
                    )
                    with torch.cuda.stream(confined.stream):
                        xs = timer.samples(confined.run, reps=args.reps, mode="queued")
                    times[sms] = statistics.median(xs)
                moved = least_bytes(groups, hidden, 2 * inter)
                row = {
                    "shape": shape_name,
                    "tokens": tokens,
                    "kind": gemm.kind,
                    "asked": kind,
                    "fallback": gemm.fallback_reason,
                    "tflop": gemm.flops / 1e12,
                    "us_by_sms": times,
                    "least_gb": moved / 1e9,
                    "tbps_by_sms": {sms: round(moved / us / 1e6, 2) for sms, us in times.items()},
                    "tflops_by_sms": {
                        sms: round(gemm.flops / us / 1e6, 1) for sms, us in times.items()
                    },
                }
                if kind.startswith(
                    "persistent"
                ):  # the launch config picked per SM count, and the runners-up
                    row["picked"] = {sms: gemm.launch_config.get(sms) for sms in args.sms}
                    row["candidates_us"] = {
                        sms: {
                            "x".join(map(str, cfg)): round(us, 1)
                            for cfg, us in sorted(
                                gemm.pick_timings.get(sms, {}).items(), key=lambda kv: kv[1]
                            )
                        }
                        for sms in args.sms
                    }
                    row["skipped_launches"] = {
                        "x".join(map(str, cfg)): why for cfg, why in gemm.skipped_launches.items()
                    }
                rows_out.append(row)
                print(
                    f"{shape_name:14} T={tokens:5} {kind:10} "
                    + " ".join(f"{s}:{t:.0f}" for s, t in times.items()),
                    flush=True,
                )
                print(
                    f"{'':20} moves >= {moved / 1e9:.2f} GB: "
                    + " ".join(
                        f"{s}:{row['tbps_by_sms'][s]}TB/s,{row['tflops_by_sms'][s]}TF/s"
                        for s in times
                    ),
                    flush=True,
                )
                if kind.startswith("persistent"):
                    for sms in (args.sms[0], args.sms[-1]):
                        top = list(row["candidates_us"][sms].items())[:4]
                        print(
                            f"{'':20} best at {sms} SMs: "
                            + ", ".join(f"{c} {t:.0f}" for c, t in top),
                            flush=True,
                        )
                    for cfg, why in row["skipped_launches"].items():
                        print(f"{'':20} skipped {cfg}: {why}", flush=True)
                del gemm
            weights.clear()
    prov = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "copy_tbps": round(roof, 2),
        "timing": "CUDA events on the GEMM's stream (persistent kernel: grid = SMs; others: all SMs), "
        "L2 flushed, queued launches, median",
    }
    Path(args.out).write_text(json.dumps({"provenance": prov, "rows": rows_out}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
