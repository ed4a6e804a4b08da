#!/usr/bin/env python3
"""Benchmark quant + dispatch in both orders, and combine, on the visible GPUs with DeepEP.

For each shape and tokens-per-rank: quant_then_dispatch and dispatch_then_quant under both timed
regions (``cached``: the kernel with a cached handle; ``full``: layout + dispatch as serving calls it),
combine, the fused quantization kernel alone, and the device-to-device copy bandwidth it is judged
against. Writes raw JSON with provenance and prints a table.

    python scripts/bench_dispatch.py --out bench.json --deepep-commit 29d31c0
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

SHAPES = {"deepseek-v3": (7168, 256, 8), "qwen3-30b-a3b": (2048, 128, 8)}


def provenance(args) -> dict:
    import torch

    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=20).stdout.split("\n")[0].strip()
    except (OSError, subprocess.SubprocessError):
        driver = "unknown"
    return {"gpu": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count(), "driver": driver,
            "cuda": torch.version.cuda, "torch": torch.__version__, "python": platform.python_version(),
            "deepep_commit": args.deepep_commit, "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "num_sms": args.num_sms,
            "reps": args.reps, "timing": "CUDA events, L2 flushed, median per rank, slowest rank"}


def copy_and_quant(timer, device) -> dict:
    import torch

    from moepolicy.quant import triton_kernels

    tokens, hidden = 8192, 7168
    x = torch.randn(tokens, hidden, device=device).to(torch.bfloat16)
    y = torch.empty_like(x)
    copy = timer.samples(lambda: y.copy_(x), reps=50)
    quant = timer.samples(lambda: triton_kernels.per_token_group(x, 128), reps=50)
    colmajor_s = triton_kernels.per_token_group(x, 128)[1]
    from moepolicy.quant.reference import to_col_major_tma

    tma = timer.samples(lambda: to_col_major_tma(colmajor_s), reps=50)
    import statistics

    copy_us, quant_us, tma_us = (statistics.median(v) for v in (copy, quant, tma))
    copy_bytes = 2 * x.numel() * 2
    quant_bytes = x.numel() * 2 + x.numel() + colmajor_s.numel() * 4
    return {"tokens": tokens, "hidden": hidden, "copy_us": copy_us, "copy_GBps": copy_bytes / copy_us / 1e3,
            "quant_us": quant_us, "quant_GBps": quant_bytes / quant_us / 1e3,
            "quant_fraction_of_copy_bw": (quant_bytes / quant_us) / (copy_bytes / copy_us),
            "col_major_tma_us": tma_us, "quant_bytes": quant_bytes, "copy_bytes": copy_bytes}


def worker(rank: int, world: int, args, rendezvous: str, out_path: str) -> None:
    import deep_ep
    import torch
    import torch.distributed as dist

    from moepolicy.measure.deepep_ops import DeepEPOps, make_workload
    from moepolicy.measure.timing import Timer

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, init_method=f"file://{rendezvous}",
                            device_id=device)
    buffer = deep_ep.Buffer(dist.group.WORLD, int(args.nvl_mb * 1024 * 1024) // 128 * 128, 0)
    deep_ep.Buffer.set_num_sms(args.num_sms)
    dcfg = deep_ep.Buffer.get_dispatch_config(world)
    ccfg = deep_ep.Buffer.get_combine_config(world)
    timer = Timer(device)
    rows = []
    for shape in args.shapes:
        hidden, experts, top_k = SHAPES[shape]
        for tokens in args.tokens:
            work = make_workload(tokens, hidden, experts, top_k, rank, device)
            ops = DeepEPOps(buffer, work, dcfg, ccfg)
            row = {"shape": shape, "hidden": hidden, "experts": experts, "top_k": top_k, "tokens": tokens,
                   "received_rows": ops.received_rows}
            for region in ("cached", "full"):
                row[f"qtd_{region}"] = timer.median_max_over_ranks(lambda: ops.quant_then_dispatch(region), args.reps)
                row[f"dtq_{region}"] = timer.median_max_over_ranks(lambda: ops.dispatch_then_quant(region), args.reps)
            row["combine"] = timer.median_max_over_ranks(ops.combine, args.reps)
            for region in ("cached", "full"):
                row[f"speedup_{region}"] = row[f"dtq_{region}"]["median_us"] / row[f"qtd_{region}"]["median_us"]
            rows.append(row)
            if rank == 0:
                print(f"{shape:14} T={tokens:5} recv={row['received_rows']:6} "
                      f"qtd cached {row['qtd_cached']['median_us']:7.1f} full {row['qtd_full']['median_us']:7.1f} | "
                      f"dtq cached {row['dtq_cached']['median_us']:7.1f} full {row['dtq_full']['median_us']:7.1f} | "
                      f"combine {row['combine']['median_us']:7.1f} | dtq/qtd cached {row['speedup_cached']:.2f} "
                      f"full {row['speedup_full']:.2f}", flush=True)
    quant = copy_and_quant(Timer(device, collective=False), device) if rank == 0 else None
    if rank == 0:
        print(f"copy 8192x7168 bf16: {quant['copy_GBps']:.0f} GB/s; fused group quant: {quant['quant_GBps']:.0f} GB/s "
              f"= {100 * quant['quant_fraction_of_copy_bw']:.0f}% of copy; col-major TMA step {quant['col_major_tma_us']:.1f} us")
        Path(out_path).write_text(json.dumps({"provenance": provenance(args), "dispatch": rows, "quant": quant}, indent=2))
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench_dispatch.json")
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--tokens", nargs="+", type=int, default=[128, 512, 1024, 4096, 8192])
    p.add_argument("--num-sms", type=int, default=24)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--nvl-mb", type=float, default=1024)
    p.add_argument("--deepep-commit", default=os.environ.get("MOEPOLICY_DEEPEP_COMMIT", "unknown"))
    args = p.parse_args()
    import tempfile

    import torch
    import torch.multiprocessing as mp

    world = torch.cuda.device_count()
    if world < 2:
        print("bench_dispatch: needs at least 2 GPUs", file=sys.stderr)
        return 2
    rendezvous = tempfile.mktemp(prefix="moepolicy-bench-")
    mp.start_processes(worker, args=(world, args, rendezvous, args.out), nprocs=world, start_method="spawn")
    return 0


if __name__ == "__main__":
    sys.exit(main())
