"""The per-rank expert stage on one GPU, per model shape, EP size and token bucket (GPU).

For DeepSeek-V3 and Qwen3-30B-A3B(-FP8) shapes at each EP size, one rank's received rows as the
router spreads them (``moepolicy.measure.routing``), through DeepGEMM's grouped fp8 GEMMs
(``moepolicy.measure.expert_stage``): the rank's own compute per order (quantize its sent tokens
then the stage on fp8 rows, or quantize its received bf16 rows then the stage), and the two
quantizations alone, in rounds rotating over the four after a dropped warm-up pass. Writes the
per-round medians as JSON (what ``moepolicy/data/tuning/calibration/h200-expert-stage.yaml`` is
fitted from) and prints one line per cell. Nothing here times communication.

    python benchmarks/expert_stage.py --out expert_stage.json [--ep 2 4 8] [--tokens 128 1024 4096]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODES = {"host": "synced", "gpu": "queued"}


def shape_for(name: str, ep: int):
    from moepolicy.checkpoint.reader import read_model
    from moepolicy.measure.routing import ExpertShape
    from moepolicy.measure.shapes import BENCH_MODELS

    facts = read_model(BENCH_MODELS[name])
    layer = facts.moe_layers[0]
    return ExpertShape(
        layer.hidden_size,
        layer.moe_intermediate_size,
        layer.num_experts,
        layer.top_k,
        ep,
        facts.expert_groups,
    )


def main() -> int:
    import torch

    from moepolicy.measure import expert_stage as es
    from moepolicy.measure.routing import rank_view

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", nargs="+", default=["deepseek-v3", "qwen3-30b-a3b"])
    ap.add_argument("--ep", nargs="+", type=int, default=[2, 4, 8])
    ap.add_argument("--tokens", nargs="+", type=int, default=[128, 512, 1024, 2048, 4096])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--regimes", nargs="+", default=["host", "gpu"], choices=sorted(MODES))
    ap.add_argument(
        "--null",
        action="store_true",
        help="an A/A run: quantizing first timed as two arms (the test's false claims, measured)",
    )
    args = ap.parse_args()

    dg, where = es.find_deep_gemm()
    if dg is None:
        print(f"expert_stage: {where}", file=sys.stderr)
        return 9
    device = torch.device("cuda", 0)
    out = {
        "what": "one rank's expert-stage compute per order (quantization + DeepGEMM grouped GEMMs + moepolicy glue), "
        "per-round medians in microseconds; no communication",
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "deep_gemm": where,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "rounds": args.rounds,
        "reps": args.reps,
        "cells": [],
        "checks": [],
    }
    for name in args.models:
        for ep in args.ep:
            shape = shape_for(name, ep)
            started = time.perf_counter()
            experts = es.DeepGemmExperts(shape, device)
            small = experts.inputs(rank_view(shape, 64, seed=1), seed=1)
            diff = es.closeness_diff(
                experts.run(small.rows_fp8, small.rows_scale, small).float(),
                es.reference_stage(experts, small),
            )
            torch.cuda.synchronize()
            out["checks"].append(
                {
                    "model": name,
                    "ep": ep,
                    "diff": diff,
                    "first_call_s": round(time.perf_counter() - started, 1),
                }
            )
            print(
                f"{name} EP{ep}: {shape.label()}; DeepGEMM vs float32 torch diff {diff:.2e}",
                flush=True,
            )
            for tokens in args.tokens:
                view = rank_view(shape, tokens, seed=tokens)
                inp = experts.inputs(view, seed=tokens)
                fns = dict(es.step_arms(experts, inp))
                if args.null:  # the same work under two names
                    fns = {"a": fns["quant_then_dispatch"], "b": fns["quant_then_dispatch"]}
                else:
                    fns["quant_sent"] = lambda inp=inp: es._quant(inp.sent)
                    fns["quant_received"] = lambda inp=inp: es._quant(inp.rows_bf16)
                for regime in args.regimes:
                    times = es.time_arms(fns, args.rounds, args.reps, MODES[regime], device)
                    cell = {
                        "model": name,
                        "ep": ep,
                        "tokens": tokens,
                        "regime": regime,
                        "rows": view.rows,
                        "pairs": view.pairs,
                        "shape": shape.label(),
                        "us": {k: [round(x, 2) for x in v] for k, v in times.items()},
                    }
                    out["cells"].append(cell)
                    Path(args.out).write_text(
                        json.dumps(out, indent=1)
                    )  # what was measured so far
                    med = {k: statistics.median(v) for k, v in times.items()}
                    print(
                        f"  {name} EP{ep} T={tokens} {regime}: rows {view.rows}, pairs {view.pairs}; "
                        + ", ".join(f"{k} {v:.1f}" for k, v in med.items())
                        + " us",
                        flush=True,
                    )
            del experts
            torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
