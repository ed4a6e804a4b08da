#!/usr/bin/env python3
"""Where the expert GEMM's programs run while DeepEP runs beside it, and what that costs.

For each split (``c`` communication SMs, the persistent GEMM's grid = 132 - ``c``) and each GEMM launch
config, on 2 GPUs with DeepEP: comm alone, GEMM alone, and the two started together (GEMM launched
first, as ``tune --overlap`` does, and comm first). The GEMM is traced (``persistent_gemm`` trace: SM id,
start and end of every program), so each row also says how many distinct SMs the GEMM's programs ran
on, how late its last program started (and, DeepEP enqueued first, when its first one did), and how
its programs' durations spread; with the compiled config's shared memory and registers, that tells
whether DeepEP's blocks (dispatch 768 threads and 192 KiB of shared memory, combine 768 threads and 96
KiB at DeepEP 29d31c0) can share an SM with a GEMM program. ``--region cached`` times DeepEP's dispatch
on a cached handle (no CPU wait for the receive counts), to tell what the host's wait costs the
comm-first pair from what the GPU's placement does; ``--region no-wait`` times the full call given
``num_worst_tokens``, which does not wait on the host either. Writes JSON with provenance.

    python benchmarks/diag_overlap_placement.py --out diag_overlap_placement.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from moepolicy.measure.shapes import BENCH_MODELS, bench_shape

DEFAULT_CONFIGS = [
    "64x256x8x4",
    "128x128x8x5",
    "64x256x8x4:tma",
    "128x128x8x4:tma",
    "128x256x8x3:tma",
]


def parse_config(text: str) -> tuple[int, int, int, int, str, str, int]:
    """``BMxBNxWARPSxSTAGES[:loads][:cN]`` -> (block_m, block_n, warps, stages, loads, tile order, cluster)."""
    dims, *rest = text.split(":")
    bm, bn, warps, stages = (int(x) for x in dims.split("x"))
    cluster = next((int(r[1:]) for r in rest if r.startswith("c")), 1)
    loads = next((r for r in rest if not r.startswith("c")), "pointer")
    return bm, bn, warps, stages, loads, "expert", cluster


def trace_summary(trace, t_start_ns: int | None = None) -> dict:
    """Distinct SMs, programs sharing an SM, last program's start after the first, program durations."""
    rows = trace.tolist()
    sms = [r[0] for r in rows]
    starts = [r[1] for r in rows]
    durations = [(r[2] - r[1]) / 1000 for r in rows]
    first = min(starts)
    return {
        "distinct_sms": len(set(sms)),
        "programs": len(rows),
        "programs_sharing_an_sm": sum(1 for s in sms if sms.count(s) > 1),
        "last_start_us": (max(starts) - first) / 1000,
        "program_us_median": statistics.median(durations),
        "program_us_max": max(durations),
        "span_us": (max(r[2] for r in rows) - first) / 1000,
    }


def worker(rank: int, world: int, args, rendezvous: str) -> None:
    import deep_ep
    import torch
    import torch.distributed as dist

    from moepolicy.measure import persistent_gemm as pg
    from moepolicy.measure.deepep_ops import DeepEPOps, join_rank, make_workload
    from moepolicy.measure.overlapped_step import ExpertGemm, GemmShape
    from moepolicy.measure.timing import Timer

    device, buffer = join_rank(rank, world, rendezvous, args.nvl_mb * 1024 * 1024)
    timer = Timer(device)
    sm_count = torch.cuda.get_device_properties(device).multi_processor_count
    dims = bench_shape(args.shape)
    hidden, experts, top_k, inter = dims.hidden, dims.experts, dims.top_k, dims.intermediate
    weights, rows_out = {}, []

    def event():
        return torch.cuda.Event(enable_timing=True)

    for tokens in args.tokens:
        work = make_workload(tokens, hidden, experts, top_k, rank, device)
        for c in args.sms:
            deep_ep.Buffer.set_num_sms(c)
            ops = DeepEPOps(
                buffer,
                work,
                deep_ep.Buffer.get_dispatch_config(world),
                deep_ep.Buffer.get_combine_config(world),
            )
            groups = ops.rows_per_local_expert
            gemm = weights.get(("gemm", tokens))
            if gemm is None:
                gemm = weights[("gemm", tokens)] = ExpertGemm(
                    GemmShape(sum(groups), hidden, 2 * inter), device, groups, weights
                )
            g = sm_count - c

            def comm(ops=ops):
                ops.dispatch_only("fp8", args.region)
                ops.combine()

            for text in args.configs:
                cfg = parse_config(text)
                tables = pg.tile_tables(
                    gemm.group_rows, cfg[0], cfg[1], gemm.c.shape[1], device, order=cfg[5]
                )
                descriptors = (
                    pg.tma_descriptors(gemm.a, gemm.b, cfg[0], cfg[1]) if cfg[4] == "tma" else None
                )
                trace = torch.zeros(
                    g // cfg[6], len(pg.TRACE_FIELDS), dtype=torch.int64, device=device
                )

                def run_gemm(
                    trace=trace, cfg=cfg, tables=tables, descriptors=descriptors, gemm=gemm, g=g
                ):
                    pg.grouped_block_fp8(
                        gemm.a,
                        gemm.a_scale,
                        gemm.b,
                        gemm.b_scale,
                        gemm.group_rows,
                        g,
                        *cfg[:4],
                        tables=tables,
                        out=gemm.c,
                        trace=trace,
                        loads=cfg[4],
                        descriptors=descriptors,
                        cluster=cfg[6],
                    )

                side = torch.cuda.Stream(device)
                main = torch.cuda.current_stream()
                for _ in range(3):
                    comm()
                    with torch.cuda.stream(side):
                        run_gemm()
                torch.cuda.synchronize()
                samples = {
                    k: []
                    for k in (
                        "comm",
                        "gemm",
                        "gemm_first",
                        "comm_first",
                        "gemm_first_comm_end",
                        "gemm_first_gemm_end",
                        "comm_first_comm_end",
                        "comm_first_gemm_end",
                        "comm_first_gemm_start",
                    )
                }
                traces = {"gemm": [], "gemm_first": [], "comm_first": []}

                def settle():
                    timer.quiesce()
                    if args.queued:
                        timer.head_start()

                for _ in range(args.reps):
                    settle()
                    s, e = event(), event()
                    s.record(main)
                    comm()
                    e.record(main)
                    e.synchronize()
                    samples["comm"].append(s.elapsed_time(e) * 1000)
                    settle()
                    s, e = event(), event()
                    s.record(main)
                    side.wait_event(s)
                    with torch.cuda.stream(side):
                        run_gemm()
                    e.record(side)
                    e.synchronize()
                    samples["gemm"].append(s.elapsed_time(e) * 1000)
                    traces["gemm"].append(trace_summary(trace))
                    for order in ("gemm_first", "comm_first"):
                        settle()
                        s, e_comm, e_gemm = event(), event(), event()
                        s.record(main)
                        side.wait_event(s)
                        if order == "comm_first":
                            comm()
                            e_comm.record(main)
                        with torch.cuda.stream(side):
                            run_gemm()
                        e_gemm.record(side)
                        if order == "gemm_first":
                            comm()
                            e_comm.record(main)
                        e_comm.synchronize()
                        e_gemm.synchronize()
                        ends = (s.elapsed_time(e_comm) * 1000, s.elapsed_time(e_gemm) * 1000)
                        samples[order].append(max(ends))
                        samples[f"{order}_comm_end"].append(ends[0])
                        samples[f"{order}_gemm_end"].append(ends[1])
                        traces[order].append(trace_summary(trace))
                        if (
                            order == "comm_first"
                        ):  # when its first program started: its end less its span
                            samples["comm_first_gemm_start"].append(
                                ends[1] - traces[order][-1]["span_us"]
                            )
                row = {
                    "rank": rank,
                    "tokens": tokens,
                    "comm_sms": c,
                    "gemm_sms": g,
                    "config": text,
                    "region": args.region,
                    "resources": pg.launch_resources(*cfg[:5], cluster=cfg[6]),
                    **{k: statistics.median(v) for k, v in samples.items()},
                    **{
                        f"{k}_trace": {f: statistics.median(t[f] for t in v) for f in v[0]}
                        for k, v in traces.items()
                    },
                }
                gathered = [None] * world
                dist.all_gather_object(gathered, row)
                rows_out.extend(gathered if rank == 0 else [])
                if rank == 0:
                    for r in gathered:
                        tg, tf = r["gemm_trace"], r["gemm_first_trace"]
                        print(
                            f"r{r['rank']} T={tokens:5} c={c:3} cfg {text:12} smem/regs {r['resources']}: "
                            f"comm {r['comm']:7.1f} gemm {r['gemm']:7.1f} | gemm-first {r['gemm_first']:7.1f} "
                            f"(comm end {r['gemm_first_comm_end']:7.1f}, gemm end {r['gemm_first_gemm_end']:7.1f}) "
                            f"comm-first {r['comm_first']:7.1f} | SMs alone {tg['distinct_sms']:.0f} "
                            f"overlap {tf['distinct_sms']:.0f} shared {tf['programs_sharing_an_sm']:.0f}, "
                            f"last start {tg['last_start_us']:.1f}/{tf['last_start_us']:.1f} us, "
                            f"program max {tg['program_us_max']:.0f}/{tf['program_us_max']:.0f} us "
                            f"(median {tg['program_us_median']:.0f}/{tf['program_us_median']:.0f})",
                            flush=True,
                        )
                        tc = r["comm_first_trace"]
                        print(
                            f"{'':8} comm-first: comm end {r['comm_first_comm_end']:7.1f}, GEMM first program "
                            f"at {r['comm_first_gemm_start']:7.1f}, last {tc['last_start_us']:.1f} us after it, "
                            f"GEMM end {r['comm_first_gemm_end']:7.1f}; SMs {tc['distinct_sms']:.0f}, "
                            f"program max {tc['program_us_max']:.0f} (median {tc['program_us_median']:.0f})",
                            flush=True,
                        )
            del ops
    if rank == 0:
        import torch as _t

        Path(args.out).write_text(
            json.dumps(
                {
                    "provenance": {
                        "command": "python benchmarks/diag_overlap_placement.py "
                        + " ".join(sys.argv[1:]),
                        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                        "gpu": _t.cuda.get_device_name(0),
                        "torch": _t.__version__,
                        "deepep_commit": args.deepep_commit,
                    },
                    "rows": rows_out,
                },
                indent=1,
            )
        )
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="diag_overlap_placement.json")
    p.add_argument("--shape", default="deepseek-v3", choices=list(BENCH_MODELS))
    p.add_argument("--tokens", nargs="+", type=int, default=[1024])
    p.add_argument("--sms", nargs="+", type=int, default=[8, 12, 16, 20, 24, 32, 48])
    p.add_argument(
        "--configs", nargs="+", default=DEFAULT_CONFIGS, help="BMxBNxWARPSxSTAGES[:tma]"
    )
    p.add_argument("--reps", type=int, default=10)
    p.add_argument(
        "--queued",
        action="store_true",
        help="the GPU spins while the host enqueues each timed pair (timing.py's queued mode)",
    )
    p.add_argument(
        "--region",
        default="full",
        choices=["full", "no-wait", "cached"],
        help="full: layout + dispatch with its CPU wait for the receive counts (as serving calls it); "
        "no-wait: the same with num_worst_tokens (no CPU wait; receive buffers sized for the "
        "worst case); cached: dispatch on a cached handle (the kernel only, no CPU wait)",
    )
    p.add_argument("--nvl-mb", type=float, default=1024)
    p.add_argument("--deepep-commit", default=os.environ.get("MOEPOLICY_DEEPEP_COMMIT", "unknown"))
    args = p.parse_args()
    import torch

    from moepolicy.measure.ranks import gpu_placement, run_ranks

    world = 2
    if torch.cuda.device_count() < world:
        print(
            f"diag_overlap_placement: needs {world} GPUs, found {torch.cuda.device_count()}",
            file=sys.stderr,
        )
        return 2
    gpu_placement(world)
    run_ranks(worker, (world, args, tempfile.mktemp(prefix="moepolicy-rdzv-")), world, 3600.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
