#!/usr/bin/env python3
"""Benchmark quant + dispatch in both orders, and combine, on the visible GPUs with DeepEP.

For each shape and tokens-per-rank: quant_then_dispatch and dispatch_then_quant under both timed
regions (``cached``: the kernel with a cached handle; ``full``: layout + dispatch as serving calls it),
combine, the fused quantization kernel alone, and the device-to-device copy bandwidth it is judged
against. Writes raw JSON with provenance and prints a table.

    python benchmarks/bench_dispatch.py --out bench.json --deepep-commit 29d31c0
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from moepolicy.measure.shapes import BENCH_MODELS, bench_shape


def provenance(args) -> dict:
    import torch

    try:
        driver = (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            .stdout.split("\n")[0]
            .strip()
        )
    except (OSError, subprocess.SubprocessError):
        driver = "unknown"
    return {
        "gpu": torch.cuda.get_device_name(0),
        "gpus": torch.cuda.device_count(),
        "driver": driver,
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "deepep_commit": args.deepep_commit,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "num_sms": args.num_sms,
        "reps": args.reps,
        "rounds": args.rounds,
        "modes": args.modes,
        "timing": "CUDA events, L2 flushed, barrier before each; per round the median per rank, slowest "
        "rank; orders interleaved round by round; modes: synced = host synchronised before the "
        "start event, queued = launches queued behind a 500 us GPU spin",
    }


def copy_and_quant(timer, device) -> dict:
    """The fused group quantization of 8192 x 7168 against a device-to-device copy of the same
    tensor (bytes read plus written), in both launch modes; interleaved over 5 rounds."""
    import statistics

    import torch

    from moepolicy.measure.timing import interleaved_rounds
    from moepolicy.quant import triton_kernels
    from moepolicy.quant.reference import to_col_major_tma

    tokens, hidden = 8192, 7168
    x = torch.randn(tokens, hidden, device=device).to(torch.bfloat16)
    y = torch.empty_like(x)
    scales = triton_kernels.per_token_group(x, 128)[1]
    copy_bytes = 2 * x.numel() * 2
    quant_bytes = x.numel() * 2 + x.numel() + scales.numel() * 4
    out = {
        "tokens": tokens,
        "hidden": hidden,
        "quant_bytes": quant_bytes,
        "copy_bytes": copy_bytes,
    }
    for mode in ("synced", "queued"):
        got = interleaved_rounds(
            timer,
            {
                "copy": lambda: y.copy_(x),
                "quant": lambda: triton_kernels.per_token_group(x, 128),
                "tma": lambda: to_col_major_tma(scales),
            },
            5,
            20,
            mode,
        )
        fractions = [
            (quant_bytes / q) / (copy_bytes / c) for c, q in zip(got["copy"], got["quant"])
        ]
        copy_us, quant_us, tma_us = (statistics.median(got[k]) for k in ("copy", "quant", "tma"))
        out[mode] = {
            "copy_us": copy_us,
            "copy_GBps": copy_bytes / copy_us / 1e3,
            "quant_us": quant_us,
            "quant_GBps": quant_bytes / quant_us / 1e3,
            "col_major_tma_us": tma_us,
            "quant_fraction_of_copy_bw": statistics.median(fractions),
            "fraction_per_round": fractions,
            "rounds": got,
        }
    return out


def _summary(xs: list[float]) -> dict:
    import statistics

    return {"median_us": statistics.median(xs), "min_us": min(xs), "max_us": max(xs), "rounds": xs}


def order_rounds(timer, ops, region: str, mode: str, rounds: int, reps: int) -> dict:
    """Both orders, interleaved round by round; the ratio dtq/qtd is taken within each round."""
    from moepolicy.measure.timing import interleaved_rounds

    got = interleaved_rounds(
        timer,
        {
            "qtd": lambda: ops.quant_then_dispatch(region),
            "dtq": lambda: ops.dispatch_then_quant(region),
        },
        rounds,
        reps,
        mode,
    )
    ratios = [d / q for q, d in zip(got["qtd"], got["dtq"])]
    return {
        "qtd": _summary(got["qtd"]),
        "dtq": _summary(got["dtq"]),
        "dtq_over_qtd": _summary(ratios),
    }


def parts(timer, ops, mode: str, reps: int) -> dict:
    """What each order is made of, in the cached region: dispatch alone per payload, quant alone."""
    m = timer.step_us
    return {
        "dispatch_fp8": m(lambda: ops.dispatch_only("fp8", "cached"), reps, mode=mode)[
            "median_us"
        ],
        "dispatch_bf16": m(lambda: ops.dispatch_only("bf16", "cached"), reps, mode=mode)[
            "median_us"
        ],
        "quant_sent": m(lambda: ops.quant_only("sent"), reps, mode=mode)["median_us"],
        "quant_received": m(lambda: ops.quant_only("received"), reps, mode=mode)["median_us"],
    }


def worker(rank: int, world: int, args, rendezvous: str, out_path: str) -> None:
    import deep_ep
    import torch.distributed as dist

    from moepolicy.measure.deepep_ops import DeepEPOps, join_rank, make_workload
    from moepolicy.measure.timing import Timer

    device, buffer = join_rank(rank, world, rendezvous, args.nvl_mb * 1024 * 1024)
    timer = Timer(device)
    rows = []
    for num_sms in args.num_sms:
        deep_ep.Buffer.set_num_sms(num_sms)
        dcfg = deep_ep.Buffer.get_dispatch_config(world)
        ccfg = deep_ep.Buffer.get_combine_config(world)
        for shape in args.shapes:
            dims = bench_shape(shape)
            hidden, experts, top_k = dims.hidden, dims.experts, dims.top_k
            for tokens in args.tokens:
                work = make_workload(tokens, hidden, experts, top_k, rank, device)
                ops = DeepEPOps(buffer, work, dcfg, ccfg)
                row = {
                    "shape": shape,
                    "hidden": hidden,
                    "experts": experts,
                    "top_k": top_k,
                    "tokens": tokens,
                    "num_sms": num_sms,
                    "received_rows": ops.received_rows,
                }
                for mode in args.modes:
                    for region in ("cached", "full"):
                        row[f"{mode}_{region}"] = order_rounds(
                            timer, ops, region, mode, args.rounds, args.reps
                        )
                    row[f"{mode}_parts"] = parts(timer, ops, mode, args.reps)
                row["combine"] = timer.step_us(ops.combine, args.reps, mode="queued")
                rows.append(row)
                if rank == 0:
                    print(
                        f"{shape:14} sms={num_sms:3} T={tokens:5} recv={row['received_rows']:6} "
                        + " | ".join(
                            f"{mode} {region} qtd {row[f'{mode}_{region}']['qtd']['median_us']:6.1f} "
                            f"dtq {row[f'{mode}_{region}']['dtq']['median_us']:6.1f} "
                            f"x{row[f'{mode}_{region}']['dtq_over_qtd']['median_us']:.2f} "
                            f"[{row[f'{mode}_{region}']['dtq_over_qtd']['min_us']:.2f}-"
                            f"{row[f'{mode}_{region}']['dtq_over_qtd']['max_us']:.2f}]"
                            for mode in args.modes
                            for region in ("cached", "full")
                        ),
                        flush=True,
                    )
                    for mode in args.modes:
                        print(
                            f"{'':14} parts ({mode}): "
                            + ", ".join(f"{k} {v:.1f}" for k, v in row[f"{mode}_parts"].items()),
                            flush=True,
                        )
                del ops, work
    quant = (
        copy_and_quant(Timer(device, collective=False), device)
        if rank == 0 and not args.skip_quant
        else None
    )
    if rank == 0:
        for mode in ("synced", "queued") if quant else ():
            q = quant[mode]
            print(
                f"[{mode}] copy 8192x7168 bf16: {q['copy_GBps']:.0f} GB/s; fused group quant: {q['quant_GBps']:.0f} "
                f"GB/s = {100 * q['quant_fraction_of_copy_bw']:.0f}% of copy (rounds "
                f"{', '.join(f'{100 * f:.0f}' for f in q['fraction_per_round'])}); col-major TMA step "
                f"{q['col_major_tma_us']:.1f} us",
                flush=True,
            )
        Path(out_path).write_text(
            json.dumps(
                {"provenance": provenance(args), "dispatch": rows, "quant": quant}, indent=2
            )
        )
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench_dispatch.json")
    p.add_argument("--shapes", nargs="+", default=list(BENCH_MODELS), choices=list(BENCH_MODELS))
    p.add_argument("--tokens", nargs="+", type=int, default=[128, 512, 1024, 4096, 8192])
    p.add_argument("--num-sms", nargs="+", type=int, default=[24])
    p.add_argument(
        "--reps",
        type=int,
        default=10,
        help="timings per round (their median is the round's value)",
    )
    p.add_argument(
        "--rounds", type=int, default=7, help="rounds; both orders are timed in every round"
    )
    p.add_argument(
        "--modes",
        nargs="+",
        default=["synced", "queued"],
        choices=["synced", "queued"],
        help="launch modes (moepolicy/measure/timing.py): host synchronised before each timing, "
        "or launches queued behind a GPU head start",
    )
    p.add_argument(
        "--skip-quant", action="store_true", help="skip the quant-vs-copy bandwidth measurement"
    )
    p.add_argument("--nvl-mb", type=float, default=1024)
    p.add_argument("--deepep-commit", default=os.environ.get("MOEPOLICY_DEEPEP_COMMIT", "unknown"))
    args = p.parse_args()
    import torch

    from moepolicy.measure.ranks import gpu_placement, rendezvous_file, run_ranks

    world = torch.cuda.device_count()
    if world < 2:
        print("bench_dispatch: needs at least 2 GPUs", file=sys.stderr)
        return 2
    gpu_placement(world)  # peer access between every pair, before any rank starts
    run_ranks(  # the safe environment (NVLink multicast off) in every rank
        worker, (world, args, rendezvous_file("moepolicy-bench-"), args.out), world, 3600.0
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
