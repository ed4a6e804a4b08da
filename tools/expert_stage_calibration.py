"""Write the recorded expert-stage data the model bench replays (moepolicy/data/tuning/expert_stage)
from a raw campaign file of benchmarks/expert_stage.py (benchmarks/raw/*-expert-stage-*.json).

    python tools/expert_stage_calibration.py benchmarks/raw/2026-12-04-1xh200-expert-stage-deepgemm.json

Only the arms' per-round times and the shapes are kept; the raw file stays the source."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OUT = ROOT / "moepolicy" / "data" / "tuning" / "expert_stage" / "h200-deepgemm.yaml"


def main(raw_path: str) -> int:
    from benchmarks.expert_stage import shape_for

    raw = json.loads(Path(raw_path).read_text())
    rel = Path(raw_path).resolve().relative_to(ROOT)
    lines = [
        "# The per-rank expert stage (quantization + DeepGEMM grouped GEMMs + moepolicy's glue), recorded",
        f"# on one {raw['gpu']} ({raw['torch']}, {raw['deep_gemm']}), {raw['date']}; written by",
        f"# tools/expert_stage_calibration.py from {rel}. Per-round medians (us) of each order,",
        "# rounds rotating over the orders; no communication. The model bench replays these",
        "# (moepolicy/tuning/expert_bench.RecordedExpertBench): modelled, only at these shapes.",
        "schema: moepolicy/expert-stage@1",
        "provenance:",
        "  gpu: h200",
        f"  recorded_on: {json.dumps('1 x ' + raw['gpu'])}",
        "  kernel: deepgemm",
        f"  date: {json.dumps(raw['date'])}",
        f"  source: {json.dumps(str(rel))}",
        f"  rounds: {raw['rounds']}",
        f"  reps: {raw['reps']}",
        "cells:",
    ]
    for c in raw["cells"]:
        s = shape_for(c["model"], c["ep"])
        groups = f"[{s.groups[0]}, {s.groups[1]}]" if s.groups else "null"
        us = ", ".join(
            f"{order}: [{', '.join(f'{v:.2f}' for v in c['us'][order])}]"
            for order in ("quant_then_dispatch", "dispatch_then_quant")
        )
        lines.append(
            f"  - {{model: {c['model']}, hidden: {s.hidden}, intermediate: {s.intermediate}, "
            f"experts: {s.experts}, top_k: {s.top_k}, groups: {groups}, ep: {c['ep']}, "
            f"regime: {c['regime']}, tokens: {c['tokens']}, rows: {c['rows']}, us: {{{us}}}}}"
        )
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)} ({len(raw['cells'])} cells)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
