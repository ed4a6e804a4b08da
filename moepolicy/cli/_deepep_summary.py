"""The DeepEP section of a policy, rendered for ``audit``: SM count, where the numbers came from, and
per bucket what was measured (for ``tune --overlap``: the split against vLLM's, its floor, and the
lowest floor of the grid). Only renders what the document records; ``tune --overlap`` prints the same
lines."""

from __future__ import annotations

from moepolicy.deepep.engines import VLLM_DBO_COMM_SMS
from moepolicy.tuning.overlap_report import OverlapBucketRow


# what the comm-first pair includes besides the GPU's sharing (docs/BENCHMARKS.md, "Overlap": the launch order is the host's wait)
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
    lines.append(f"  chosen for the {deepep.schedule} schedule, timed in the {deepep.regime} regime")
    if deepep.partial is not None:
        lines.append(f"  PARTIAL: {deepep.partial.reason}; load_policy uses DeepEP's defaults for it")
    overlap = deepep.overlap or {}
    if overlap:
        lines.append(f"  overlap split: {overlap.get('comm_sms')} communication SMs, expert GEMM on "
                     f"{overlap.get('gemm_sms')}, chosen for the {overlap.get('order', 'gemm-first')} launch order")
        lines.append(f"  GEMM stand-in: {overlap.get('gemm')}")
    if deepep.low_latency:  # low-latency mode: no chunk settings, sized by tokens per rank
        ll = deepep.low_latency
        lines.append("  low-latency: " + ", ".join(f"{k} {v}" for k, v in ll.items())
                     + " (its kernels have no chunk settings)")
        return lines
    previous = None
    for bucket in deepep.buckets:
        name = _bucket_name(bucket.max_tokens, previous)
        previous = bucket.max_tokens
        lines.extend(_bucket_lines(name, bucket))
    return lines


# what a hand-edited (free-form) ``measured`` can raise while it is rendered
_MALFORMED = (KeyError, TypeError, ValueError, IndexError, AttributeError, ZeroDivisionError, OverflowError)


def _bucket_lines(name: str, bucket) -> list[str]:
    """A bucket's chunks and what was measured for it; ``measured`` is free-form in the schema, so one
    not in the form ``tune`` writes is said to be so instead of rendered."""
    try:
        return _measured_lines(name, bucket)
    except _MALFORMED as exc:
        chunks = (f"send chunks {bucket.dispatch.num_max_nvl_chunked_send_tokens}/"
                  f"{bucket.combine.num_max_nvl_chunked_send_tokens}")
        return [f"  {name}: {chunks}; measured: not in the form tune writes, not shown ({type(exc).__name__}: "
                f"{' '.join(str(exc).split())[:80]})"]


def _measured_lines(name: str, bucket) -> list[str]:
    chunks = (f"send chunks {bucket.dispatch.num_max_nvl_chunked_send_tokens}/"
              f"{bucket.combine.num_max_nvl_chunked_send_tokens}")
    m = bucket.measured or {}
    if "overlapped_us" not in m:
        timed = ", ".join(f"{k[:-3]} {m[k]} us" for k in ("dispatch_us", "combine_us") if k in m)
        lines = [f"  {name}: {chunks}" + (f"; search samples: {timed}" if timed else "")]
        return lines + confirm_lines(m.get("confirm"))
    return [f"  {name}: {chunks}", *overlap_lines(OverlapBucketRow.from_doc(m))]


def confirm_lines(confirm) -> list[str]:
    """A bucket's re-measurement (``tuning.confirm.Confirmed.to_doc``): what was kept and each claim."""
    if not confirm:
        return []
    out = [f"    kept {confirm['kept']}: {confirm['selection']}"]
    for key in ("vs_engine", "vs_default"):
        r = confirm[key]
        low, high = r["ci95"]
        spread = f"95% CI {low}-{high}, {r['rounds']} rounds" if r["rounds"] > 1 else "one noise-free round"
        verdict = f"x{r['speedup']}" if r["beyond_noise"] else f"no gain beyond noise (x{r['speedup']})"
        out.append(f"    vs {r['baseline']}: {verdict} ({spread})")
    return out


def _us(x: float) -> str:
    return str(round(x, 1))


def _x(ratio: float) -> str:
    return str(round(ratio, 3))


def _spread(spread: tuple[float, float]) -> str:
    return f"[{_us(spread[0])}, {_us(spread[1])}]"


def overlap_lines(row: OverlapBucketRow) -> list[str]:
    """One bucket of ``tune --overlap``: what ``tune`` prints and ``audit`` shows."""
    c, v = row.chosen, row.vllm
    out = [f"    overlapped {_us(c.overlapped_us)} us {_spread(c.spread_us)}, medians of {row.rounds} "
           f"rounds ({row.objective} launch order)"]
    comm = "comm alone without the host wait" if row.comm_region == "no-wait" else "comm alone"
    if v is not None:
        parts = f"; {comm} {_us(v.comm_us)} us, GEMM alone {_us(v.gemm_us)} us" if v.gemm_us else ""
        out.append(f"    vs vLLM's split ({VLLM_DBO_COMM_SMS} SMs): {_us(v.overlapped_us)} us "
                   f"{_spread(v.spread_us)}{parts}: x{_x(row.vs_vllm_split)}")
    out.append(f"    vs its floor max({comm}, GEMM alone) = {_us(row.floor_us)} us: x{_x(row.vs_floor)}; "
               f"serial {_us(row.serial_us)} us")
    for order, label, tail in (("gemm_first", "gemm-first", ""), ("comm_first", "comm-first", COMM_FIRST_NOTE),
                               ("comm_first_no_wait", "comm-first, no host wait", COMM_FIRST_NO_WAIT_NOTE)):
        ratio = row.vs_vllm_split_in(order)
        if ratio is not None:
            out.append(f"    {label}: {_us(c.by_order[order])} us vs vLLM's split "
                       f"{_us(v.by_order[order])} us (x{_x(ratio)}){tail}")
    if row.gemm_alone_vs_vllm_split is not None:
        out.append(f"    GEMM alone on {c.gemm_sms} SMs: x{_x(row.gemm_alone_vs_vllm_split)} of its time on vLLM's "
                   f"{v.gemm_sms} (x{_x(row.gemm_sm_ratio_vs_vllm_split)} if its time followed its SMs)")
    if row.best_floor_vs_vllm_split is not None:
        b = row.bound
        out.append(f"    bound: the grid's lowest floor is x{_x(row.best_floor_vs_vllm_split)} of vLLM's split "
                   f"({_us(b.floor_us)} us at c={b.split}, the {b.bound_by} alone); "
                   f"no split overlaps below its floor beyond the spread")
    waited = v.deepep_waited_rounds if v is not None else None
    if waited:
        out.append(f"    at vLLM's split DeepEP waited for the GEMM in {waited} of {row.rounds} rounds (enqueued "
                   f"after it, its cluster launch found no room beside the GEMM's programs)")
    return out
