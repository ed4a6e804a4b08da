#!/usr/bin/env python3
"""Time the experts' GEMM (the one `tune --overlap` runs beside DeepEP) alone on N SMs, for N across
the range: the persistent kernel launched on N programs (with the launch config picked for N, and the
runners-up), torch's grouped and cuBLAS's dense GEMM on a green context of N SMs; DeepSeek-V3 and
Qwen3-30B-A3B shapes, on one GPU. Shows how each kernel scales with the SMs it is given. Writes JSON
with provenance.

    python scripts/gemm_sm_sweep.py --out gemm_sm_sweep.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
from pathlib import Path

# hidden, experts, top-k, expert intermediate
SHAPES = {"deepseek-v3": (7168, 256, 8, 2048), "qwen3-30b-a3b": (2048, 128, 8, 768)}


def rows_per_local_expert(tokens: int, experts: int, top_k: int, ep: int = 2, seed: int = 0) -> list[int]:
    """Rank 0's share under uniform random top-k routing of ``tokens`` per rank on ``ep`` ranks."""
    import torch

    g = torch.Generator().manual_seed(seed)
    idx = torch.rand(tokens * ep, experts, generator=g).topk(top_k, dim=1).indices.flatten()
    counts = torch.bincount(idx, minlength=experts)
    return [int(n) for n in counts[: experts // ep]]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="gemm_sm_sweep.json")
    p.add_argument("--sms", nargs="+", type=int, default=[132, 128, 124, 120, 116, 112, 108, 100, 84, 68])
    p.add_argument("--tokens", nargs="+", type=int, default=[1024, 4096])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--kinds", nargs="+", default=["persistent", "persistent-clustered", "grouped", "dense"],
                   choices=["persistent", "persistent-clustered", "grouped", "dense"])
    args = p.parse_args()
    import torch

    from moepolicy.measure.overlap import ConfinedGemm, ExpertGemm, GemmShape
    from moepolicy.measure.timing import Timer

    if not torch.cuda.is_available():
        print("gemm_sm_sweep: needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda", 0)
    timer, weights, rows_out = Timer(device, collective=False), {}, []
    for shape_name, (hidden, experts, top_k, inter) in SHAPES.items():
        for tokens in args.tokens:
            groups = rows_per_local_expert(tokens, experts, top_k)
            for kind in args.kinds:
                gemm = ExpertGemm(GemmShape(sum(groups), hidden, 2 * inter, kind), device, groups, weights)
                times = {}
                for sms in args.sms:
                    # the persistent kernel is held by its grid (as serving runs it); the others only by a green context
                    confined = ConfinedGemm(gemm, sms, "grid" if kind.startswith("persistent") else "green")
                    with torch.cuda.stream(confined.stream):
                        xs = timer.samples(confined.run, reps=args.reps, mode="queued")
                    times[sms] = statistics.median(xs)
                row = {"shape": shape_name, "tokens": tokens, "kind": gemm.kind, "asked": kind,
                       "fallback": gemm.fallback_reason, "tflop": gemm.flops / 1e12, "us_by_sms": times}
                if kind.startswith("persistent"):  # the launch config picked per SM count, and the runners-up
                    row["picked"] = {sms: gemm.launch_config.get(sms) for sms in args.sms}
                    row["candidates_us"] = {sms: {"x".join(map(str, cfg)): round(us, 1) for cfg, us in
                                                  sorted(gemm.pick_timings.get(sms, {}).items(), key=lambda kv: kv[1])}
                                            for sms in args.sms}
                    row["skipped_launches"] = {"x".join(map(str, cfg)): why for cfg, why in gemm.skipped_launches.items()}
                rows_out.append(row)
                print(f"{shape_name:14} T={tokens:5} {kind:10} " + " ".join(f"{s}:{t:.0f}" for s, t in times.items()),
                      flush=True)
                if kind.startswith("persistent"):
                    for sms in (args.sms[0], args.sms[-1]):
                        top = list(row["candidates_us"][sms].items())[:4]
                        print(f"{'':20} best at {sms} SMs: " + ", ".join(f"{c} {t:.0f}" for c, t in top), flush=True)
                    for cfg, why in row["skipped_launches"].items():
                        print(f"{'':20} skipped {cfg}: {why}", flush=True)
                del gemm
            weights.clear()
    prov = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
            "timing": "CUDA events on the GEMM's stream (persistent kernel: grid = SMs; others: all SMs), "
                      "L2 flushed, queued launches, median"}
    Path(args.out).write_text(json.dumps({"provenance": prov, "rows": rows_out}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
