"""``tune --overlap``: choose DeepEP's SM share when communication overlaps the expert GEMMs.

For every candidate split (communication SMs ``c``; the GEMM gets the rest through a green context)
and token bucket, the live bench starts dispatch + combine and an expert-sized GEMM together and
times the pair (medians of repeats, with the spread). vLLM's split (20 communication SMs) is always
measured in the same run for comparison. The split with the lowest weighted overlapped time wins;
then DeepEP's send chunks are searched at that split.
"""

from __future__ import annotations

from typing import Any

from moepolicy.cli._output import note
from moepolicy.measure.overlap import GemmShape
from moepolicy.tuning.bench import TrialFailed, TunePoint, Workload

VLLM_DBO_COMM_SMS = 20
CHUNK_CANDIDATES = {"dispatch": (16, 24, 32), "combine": (8, 10, 12)}


def gemm_shape(plan, workload: Workload, tokens: int) -> GemmShape:
    first = plan.model.moe_layers[0]
    intermediate = first.moe_intermediate_size or 2048
    return GemmShape(rows=tokens * workload.top_k, hidden=workload.hidden, out=2 * intermediate)


def search_overlap(plan, bench, workload: Workload, buckets: list[tuple[int, float]], grid: list[int],
                   default: tuple) -> dict[str, Any]:
    splits = sorted(set(grid) | {VLLM_DBO_COMM_SMS})
    table: dict[int, dict[int, dict]] = {}
    for c in splits:
        for tokens, _ in buckets:
            try:
                r = bench.measure_overlap(workload, TunePoint(c, tokens, *default), gemm_shape(plan, workload, tokens))
            except TrialFailed as exc:
                note(f"  overlap c={c} T={tokens}: FAIL ({exc})")
                continue
            table.setdefault(c, {})[tokens] = r
            note(f"  overlap c={c:3} T={tokens:5}: overlapped {r['overlapped']['median_us']:8.1f} us "
                 f"(comm {r['comm']['median_us']:.1f}, GEMM {r['gemm']['median_us']:.1f} on {r['gemm_sms']} SMs, "
                 f"serial {r['serial']['median_us']:.1f})")
    complete = {c: rows for c, rows in table.items() if len(rows) == len(buckets)}
    if not complete:
        raise TrialFailed("no split produced a measurement for every bucket")
    weight = dict(buckets)

    def weighted(c):
        return sum(weight[t] * complete[c][t]["overlapped"]["median_us"] for t in complete[c])

    best = min(complete, key=weighted)
    chunks = {}
    for tokens, _ in buckets:
        chosen, chosen_us = default, complete[best][tokens]["overlapped"]["median_us"]
        for d in CHUNK_CANDIDATES["dispatch"]:
            for cc in CHUNK_CANDIDATES["combine"]:
                cand = ((d, default[0][1], *default[0][2:]), (cc, default[1][1], *default[1][2:]))
                if cand == default:
                    continue
                try:
                    r = bench.measure_overlap(workload, TunePoint(best, tokens, *cand), gemm_shape(plan, workload, tokens))
                except TrialFailed:
                    continue
                if r["overlapped"]["median_us"] < chosen_us:
                    chosen, chosen_us = cand, r["overlapped"]["median_us"]
                    complete[best][tokens] = r
        chunks[tokens] = chosen
    per_bucket = {}
    for tokens, _ in buckets:
        mine, vllm = complete[best][tokens], complete.get(VLLM_DBO_COMM_SMS, {}).get(tokens)
        per_bucket[tokens] = {
            "overlapped_us": round(mine["overlapped"]["median_us"], 1),
            "overlapped_spread_us": [round(mine["overlapped"]["min_us"], 1), round(mine["overlapped"]["max_us"], 1)],
            "serial_us": round(mine["serial"]["median_us"], 1), "floor_us": round(mine["floor_us"], 1),
            "comm_us": round(mine["comm"]["median_us"], 1), "gemm_us": round(mine["gemm"]["median_us"], 1),
            "vllm_split_overlapped_us": round(vllm["overlapped"]["median_us"], 1) if vllm else None,
            "vs_vllm_split": round(mine["overlapped"]["median_us"] / vllm["overlapped"]["median_us"], 3) if vllm else None,
            "vs_floor": round(mine["overlapped"]["median_us"] / mine["floor_us"], 3),
        }
    return {"comm_sms": best, "gemm_sms": complete[best][buckets[0][0]]["gemm_sms"], "chunks": chunks,
            "per_bucket": per_bucket, "gemm": "fp8 torch._scaled_mm" if complete[best][buckets[0][0]]["gemm_fp8"] else "bf16 matmul",
            "splits_us": {c: round(weighted(c), 1) for c in complete},
            "why": f"lowest weighted overlapped time over {len(complete)} splits measured together with vLLM's "
                   f"{VLLM_DBO_COMM_SMS}-SM split"}
