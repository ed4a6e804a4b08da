#!/usr/bin/env python3
"""Time the experts' GEMM (the one `tune --overlap` runs beside DeepEP) alone on a green context of
N SMs, for N across the range, grouped and dense, DeepSeek-V3 and Qwen3-30B-A3B shapes, on one GPU.
Shows how each kernel scales with the SMs it is given. Writes JSON with provenance.

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
            for kind in ("persistent", "grouped", "dense"):
                gemm = ExpertGemm(GemmShape(sum(groups), hidden, 2 * inter, kind), device, groups, weights)
                times = {}
                for sms in args.sms:
                    confined = ConfinedGemm(gemm, sms)
                    with torch.cuda.stream(confined.stream):
                        xs = timer.samples(confined.run, reps=args.reps, mode="queued")
                    times[sms] = statistics.median(xs)
                row = {"shape": shape_name, "tokens": tokens, "kind": gemm.kind, "asked": kind,
                       "fallback": gemm.fallback_reason, "tflop": gemm.flops / 1e12, "us_by_sms": times}
                rows_out.append(row)
                print(f"{shape_name:14} T={tokens:5} {kind:10} " + " ".join(f"{s}:{t:.0f}" for s, t in times.items()),
                      flush=True)
                del gemm
            weights.clear()
    prov = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
            "timing": "CUDA events on the green context's stream, L2 flushed, queued launches, median"}
    Path(args.out).write_text(json.dumps({"provenance": prov, "rows": rows_out}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
