"""The DeepEP section of a policy, rendered for ``audit``: SM count, where the numbers came from, and
per bucket what was measured (for ``tune --overlap``: the split against vLLM's, its floor, and the
lowest floor of the grid). Only renders what the document records; ``tune --overlap`` prints the same
lines."""

from __future__ import annotations


# what the comm-first pair includes besides the GPU's sharing (BENCHMARKS.md, fifth session, run 45)
COMM_FIRST_NOTE = "; the GEMM launches only after the dispatch's host wait for its receive counts"
COMM_FIRST_NO_WAIT_NOTE = " (dispatch given num_worst_tokens, receive buffers sized for the worst case)"


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


def _bucket_name(max_tokens, previous) -> str:
    if max_tokens is None:
        return f"> {previous} tokens" if previous else "all token counts"
    return f"<= {max_tokens} tokens"


def deepep_lines(deepep) -> list[str]:
    prov = deepep.provenance
    extra = prov.model_extra or {}
    where = ", ".join(str(extra[k]) for k in ("bench", "date") if extra.get(k))
    lines = [f"DeepEP: {deepep.num_sms} SMs, NVLink buffer {_mib(deepep.num_nvl_bytes)}, RDMA buffer "
             f"{_mib(deepep.num_rdma_bytes)}; {prov.source}" + (f" ({where})" if where else "")]
    if prov.note:
        lines.append(f"  {prov.note}")
    overlap = deepep.overlap or {}
    if overlap:
        lines.append(f"  overlap split: {overlap.get('comm_sms')} communication SMs, expert GEMM on "
                     f"{overlap.get('gemm_sms')}, chosen for the {overlap.get('order', 'gemm-first')} launch order")
        lines.append(f"  GEMM stand-in: {overlap.get('gemm')}")
    previous = None
    for bucket in deepep.buckets:
        name = _bucket_name(bucket.max_tokens, previous)
        previous = bucket.max_tokens
        lines.extend(_bucket_lines(name, bucket))
    return lines


def _bucket_lines(name: str, bucket) -> list[str]:
    chunks = (f"send chunks {bucket.dispatch.num_max_nvl_chunked_send_tokens}/"
              f"{bucket.combine.num_max_nvl_chunked_send_tokens}")
    m = bucket.measured or {}
    if "overlapped_us" not in m:
        timed = ", ".join(f"{k[:-3]} {m[k]} us" for k in ("dispatch_us", "combine_us") if k in m)
        return [f"  {name}: {chunks}" + (f"; {timed}" if timed else "")]
    return [f"  {name}: {chunks}", *overlap_lines(m)]


def overlap_lines(m: dict) -> list[str]:
    """One bucket of ``tune --overlap`` (its ``measured`` row): what ``tune`` prints and ``audit`` shows."""
    from moepolicy.tuning.overlap import VLLM_DBO_COMM_SMS

    rounds = m.get("rounds", "?")
    out = [f"    overlapped {m['overlapped_us']} us {m.get('overlapped_spread_us', '')}, medians of {rounds} "
           f"rounds ({m.get('objective', 'gemm-first')} launch order)"]
    comm = "comm alone without the host wait" if m.get("comm_region") == "no-wait" else "comm alone"
    if m.get("vs_vllm_split") is not None:
        parts = (f"; {comm} {m['vllm_split_comm_us']} us, GEMM alone {m['vllm_split_gemm_us']} us"
                 if m.get("vllm_split_gemm_us") is not None else "")
        out.append(f"    vs vLLM's split ({VLLM_DBO_COMM_SMS} SMs): {m['vllm_split_overlapped_us']} us "
                   f"{m.get('vllm_split_spread_us', '')}{parts}: x{m['vs_vllm_split']}")
    out.append(f"    vs its floor max({comm}, GEMM alone) = {m['floor_us']} us: x{m['vs_floor']}; "
               f"serial {m.get('serial_us')} us")
    for order, label, tail in (("gemm_first", "gemm-first", ""), ("comm_first", "comm-first", COMM_FIRST_NOTE),
                               ("comm_first_no_wait", "comm-first, no host wait", COMM_FIRST_NO_WAIT_NOTE)):
        if m.get(f"vs_vllm_split_{order}") is not None:
            out.append(f"    {label}: {m[f'{order}_overlapped_us']} us vs vLLM's split "
                       f"{m[f'vllm_split_{order}_overlapped_us']} us (x{m[f'vs_vllm_split_{order}']}){tail}")
    if m.get("gemm_alone_vs_vllm_split") is not None:
        out.append(f"    GEMM alone on {m['gemm_sms']} SMs: x{m['gemm_alone_vs_vllm_split']} of its time on vLLM's "
                   f"{m['vllm_split_gemm_sms']} (x{m['gemm_sm_ratio_vs_vllm_split']} if its time followed its SMs)")
    if m.get("best_floor_vs_vllm_split") is not None:
        out.append(f"    bound: the grid's lowest floor is x{m['best_floor_vs_vllm_split']} of vLLM's split "
                   f"({m['best_floor_us']} us at c={m['best_floor_split']}, the {m['best_floor_bound_by']} alone); "
                   f"no split overlaps below its floor beyond the spread")
    waited = m.get("vllm_split_deepep_waited_for_gemm_rounds")
    if waited:
        out.append(f"    at vLLM's split DeepEP waited for the GEMM in {waited} of {rounds} rounds (enqueued "
                   f"after it, its cluster launch found no room beside the GEMM's programs)")
    return out
