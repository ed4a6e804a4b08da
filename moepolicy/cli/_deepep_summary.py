"""The DeepEP section of a policy, rendered for ``audit``: SM count, where the numbers came from, and
per bucket what backs it (for ``tune --overlap``: the split against vLLM's, its floor, and the lowest
floor of the grid). Only renders what the document records; ``tune --overlap`` prints the same lines.

One convention for every speed-up (``measure.rounds.speedup_words``): ``x1.035 faster`` or
``x1.051 slower``. Modelled figures say so and carry no interval; the search's selected minima are
labelled as such; figures a schema 2.1 tune wrote from the rounds that also decided say that too.
"""

from __future__ import annotations

from typing import Any, Optional

from moepolicy.deepep.engines import VLLM_DBO_COMM_SMS
from moepolicy.deepep.settings import source_words
from moepolicy.measure.rounds import interval_words, speedup_words
from moepolicy.tuning.overlap_report import OverlapBucketRow


# what the comm-first pair includes besides the GPU's sharing (docs/BENCHMARKS.md, "Overlap": the launch order is the host's wait)
COMM_FIRST_NOTE = "; the GEMM launches only after the dispatch's host wait for its receive counts"
COMM_FIRST_NO_WAIT_NOTE = (
    " (dispatch given num_worst_tokens, receive buffers sized for the worst case)"
)


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
    lines = [
        f"DeepEP: {deepep.num_sms} SMs, NVLink buffer {_mib(deepep.num_nvl_bytes)}, RDMA buffer "
        f"{_mib(deepep.num_rdma_bytes)}; {source_words(prov.source)}"
        + (f" ({where})" if where else "")
    ]
    if prov.note:
        lines.append(f"  {prov.note}")
    if extra.get("why"):
        lines.append(f"  why: {extra['why']}")
    lines.append(
        f"  chosen for the {deepep.schedule} schedule, timed in the {deepep.regime} regime"
    )
    if deepep.partial is not None:
        lines.append(
            f"  PARTIAL: {deepep.partial.reason}; load_policy uses DeepEP's defaults for it"
        )
    lines += _v2_lines(extra.get("v2"))
    overlap = deepep.overlap or {}
    if overlap:
        lines.append(
            f"  overlap split: {overlap.get('comm_sms')} communication SMs, expert GEMM on "
            f"{overlap.get('gemm_sms')}, chosen for the {overlap.get('order', 'gemm-first')} launch order"
        )
        lines.append(f"  GEMM stand-in: {overlap.get('gemm')}")
    if deepep.low_latency:  # low-latency mode: no chunk settings, sized by tokens per rank
        ll = deepep.low_latency
        lines.append(
            "  low-latency: "
            + ", ".join(f"{k} {v}" for k, v in ll.items())
            + " (its kernels have no chunk settings)"
        )
        return lines
    previous = None
    for bucket in deepep.buckets:
        name = _bucket_name(bucket.max_tokens, previous)
        previous = bucket.max_tokens
        lines.extend(_bucket_lines(name, bucket, prov.source))
    return lines + order_lines(deepep.measured_orders or ())


def _v2_lines(v2: Optional[dict]) -> list[str]:
    if not isinstance(v2, dict):
        return []
    out = [f"  DeepEP v2: {v2.get('why', '')}"]
    for tokens, r in (v2.get("report") or {}).items():
        if isinstance(r, dict) and r.get("vs_default"):
            out.append(f"    T={tokens}, report rounds: {_claim(r['vs_default'])}")
    return out


def order_lines(timings) -> list[str]:
    """The measured order timings: with the paired test (schema 2.2), or one sample each (before)."""
    out = []
    for t in timings:
        if t.faster is None:
            out.append(
                f"  both orders at T={t.tokens}: quant_then_dispatch {t.quant_then_dispatch_us} us, "
                f"dispatch_then_quant {t.dispatch_then_quant_us} us (one sample each: no test)"
            )
            continue
        verdict = (
            "neither beyond noise: the rules' order"
            if t.faster == "neither"
            else f"{t.faster} faster beyond noise"
        )
        low, high = t.ci95 if t.ci95 else (None, None)
        out.append(
            f"  both orders at T={t.tokens} ({t.rounds} rounds): quantizing first "
            f"{speedup_words(t.quant_first_speedup)} ({interval_words(low, high)}"
            f"{', ' + t.correction if t.correction else ''}): {verdict}"
        )
    return out


# what a hand-edited (free-form) ``measured`` can raise while it is rendered
_MALFORMED = (
    KeyError,
    TypeError,
    ValueError,
    IndexError,
    AttributeError,
    ZeroDivisionError,
    OverflowError,
)


def _bucket_lines(name: str, bucket, source: str) -> list[str]:
    """A bucket's chunks and what was measured for it; ``measured`` is free-form in the schema, so one
    not in the form ``tune`` writes is said to be so instead of rendered."""
    try:
        return _measured_lines(name, bucket, source)
    except _MALFORMED as exc:
        chunks = (
            f"send chunks {bucket.dispatch.num_max_nvl_chunked_send_tokens}/"
            f"{bucket.combine.num_max_nvl_chunked_send_tokens}"
        )
        return [
            f"  {name}: {chunks}; measured: not in the form tune writes, not shown ({type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:80]})"
        ]


def _measured_lines(name: str, bucket, source: str) -> list[str]:
    chunks = (
        f"send chunks {bucket.dispatch.num_max_nvl_chunked_send_tokens}/"
        f"{bucket.combine.num_max_nvl_chunked_send_tokens}"
    )
    m = bucket.measured or {}
    if "overlapped_us" in m:
        return [f"  {name}: {chunks}", *overlap_lines(OverlapBucketRow.from_doc(m))]
    lines = [f"  {name}: {chunks}"]
    if bucket.modelled:
        lines += modelled_lines(bucket.modelled)
    elif "report" in m:
        lines += measured_lines(m)
    elif m:
        lines += legacy_lines(m, source)
    if bucket.search:
        s = bucket.search
        lines.append(
            f"    search (selected minima, not a claim): best {s.get('best_us')} us at {s.get('num_sms')} SMs"
            + (
                f", DeepEP's default {s['default_us']} us"
                if s.get("default_us") is not None
                else ""
            )
        )
    return lines


def _claim(r: dict[str, Any]) -> str:
    """One stored comparison in the convention's words: a report figure (``protocol.Figure``: the
    estimate and its interval, no verdict) or, from older files, a tested one (``Speedup.to_doc``)."""
    low, high = r["ci95"] if r.get("ci95") else (None, None)
    interval = interval_words(low, high)
    if r.get("rounds_from") == "report":
        together = r.get("interval", "").partition(", ")[2]
        return (
            f"{speedup_words(r['speedup'])} than {r['baseline']} ({interval}"
            f"{', ' + together if together else ''}, {r['rounds']} report rounds)"
        )
    verdict = r.get("verdict", "")
    tail = {"faster": "", "slower": ": a loss beyond noise"}.get(verdict, f", {verdict}")
    family = f", {r['correction']}" if r.get("correction") else ""
    return (
        f"{speedup_words(r['speedup'])} than {r['baseline']}{tail} "
        f"({interval}, {r['rounds']} rounds{family})"
    )


def measured_lines(m: dict[str, Any]) -> list[str]:
    """A bucket of a schema 2.2 live tune: the config kept, then the report rounds' figures."""
    report = m["report"]
    out = [f"    kept {m.get('kept')} at {m.get('num_sms')} SMs: {m.get('selection', '')}"]
    times = ", ".join(f"{k} {v} us" for k, v in (report.get("median_us") or {}).items())
    out.append(
        f"    report rounds ({report.get('rounds')}, fresh workers, they decided nothing): {times}"
    )
    for key in ("vs_engine", "vs_default"):
        if report.get(key):
            out.append(f"    {_claim(report[key])}")
    return out


def modelled_lines(m: dict[str, Any]) -> list[str]:
    """A bucket of a modelled tune: the model's answers, labelled so; no interval, no noise test."""
    us = ", ".join(f"{k} {v} us" for k, v in (m.get("us") or {}).items())
    out = [
        f"    kept {m.get('kept')} at {m.get('num_sms')} SMs; modelled (the model bench's answers, not "
        f"measurements): {us}"
    ]
    c = m.get("chosen_vs_engine")
    if c:
        err = "unknown" if c.get("model_error") is None else f"{c['model_error']:.1%}"
        out.append(
            f"    {c.get('num_sms')} SMs vs the engine's default: {speedup_words(c['speedup'])}, modelled; "
            f"{c.get('claim')} (held-out error {err})"
        )
    return out


def legacy_lines(m: dict[str, Any], source: str) -> list[str]:
    """A bucket written before schema 2.2: search samples, and the re-measurement (``confirm``) whose
    figures came from the rounds that also decided; on the model bench, modelled, whatever it says."""
    timed = ", ".join(f"{k[:-3]} {m[k]} us" for k in ("dispatch_us", "combine_us") if k in m)
    out = [f"    search (selected minima, not a claim): {timed}"] if timed else []
    confirm = m.get("confirm")
    if not confirm:
        return out
    out.append(f"    kept {confirm['kept']}: {confirm['selection']}")
    for key in ("vs_engine", "vs_default"):
        r = confirm[key]
        if source == "modelled":
            out.append(
                f"    vs {r['baseline']}: {speedup_words(r['speedup'])}, modelled (no interval; the "
                "model's error is not in it)"
            )
            continue
        low, high = r["ci95"]
        verdict = "beyond noise" if r.get("beyond_noise") else "within noise"
        out.append(
            f"    vs {r['baseline']}: {speedup_words(r['speedup'])}, {verdict} "
            f"({interval_words(low, high)}, {r['rounds']} rounds; schema 2.1: the rounds that also decided)"
        )
    return out


def _us(x: float) -> str:
    return str(round(x, 1))


def _spread(spread: tuple[float, float]) -> str:
    return f"[{_us(spread[0])}, {_us(spread[1])}]"


def _time_ratio_words(ratio: float) -> str:
    """A time ratio (this over that) as the convention's speed-up."""
    return speedup_words(1.0 / ratio)


def overlap_lines(row: OverlapBucketRow) -> list[str]:
    """One bucket of ``tune --overlap``: what ``tune`` prints and ``audit`` shows."""
    c, v = row.chosen, row.vllm
    source = (
        "report rounds (fresh workers; they decided nothing)"
        if row.rounds_from == "report"
        else "the rounds that chose the split"
    )
    out = [
        f"    overlapped {_us(c.overlapped_us)} us {_spread(c.spread_us)}, medians of {row.rounds} "
        f"{source} ({row.objective} launch order)"
    ]
    comm = "comm alone without the host wait" if row.comm_region == "no-wait" else "comm alone"
    if v is not None:
        parts = (
            f"; {comm} {_us(v.comm_us)} us, GEMM alone {_us(v.gemm_us)} us" if v.gemm_us else ""
        )
        paired, split = row.paired_vs_vllm, row.vs_vllm_split  # split: set where v is
        claim = (
            f"{speedup_words(paired.speedup)} ({paired.interval()}, paired over "
            f"{paired.rounds} rounds)"
            if paired is not None
            else _time_ratio_words(split)
            if split is not None
            else ""
        )
        out.append(
            f"    vs vLLM's split ({VLLM_DBO_COMM_SMS} SMs): {_us(v.overlapped_us)} us "
            f"{_spread(v.spread_us)}{parts}: {claim}"
        )
    out.append(
        f"    vs its floor max({comm}, GEMM alone) = {_us(row.floor_us)} us: "
        f"{_time_ratio_words(row.vs_floor)}; serial {_us(row.serial_us)} us"
    )
    for order, label, tail in (
        ("gemm_first", "gemm-first", ""),
        ("comm_first", "comm-first", COMM_FIRST_NOTE),
        ("comm_first_no_wait", "comm-first, no host wait", COMM_FIRST_NO_WAIT_NOTE),
    ):
        ratio = row.vs_vllm_split_in(order)
        if ratio is not None and v is not None:  # a ratio needs vLLM's split
            out.append(
                f"    {label}: {_us(c.by_order[order])} us vs vLLM's split "
                f"{_us(v.by_order[order])} us ({_time_ratio_words(ratio)}, medians){tail}"
            )
    # each ratio is set only where what it divides by is (OverlapBucketRow)
    alone, by_sms = row.gemm_alone_vs_vllm_split, row.gemm_sm_ratio_vs_vllm_split
    if alone is not None and by_sms is not None and v is not None:
        out.append(
            f"    GEMM alone on {c.gemm_sms} SMs: {_time_ratio_words(alone)} than on "
            f"vLLM's {v.gemm_sms} ({_time_ratio_words(by_sms)} if its time followed "
            "its SMs)"
        )
    best_floor, b = row.best_floor_vs_vllm_split, row.bound
    if best_floor is not None and b is not None:
        out.append(
            f"    bound: the grid's lowest floor is {_time_ratio_words(best_floor)} than "
            f"vLLM's split ({_us(b.floor_us)} us at c={b.split}, the {b.bound_by} alone); "
            f"no split overlaps below its floor beyond the spread"
        )
    waited = v.deepep_waited_rounds if v is not None else None
    if waited:
        out.append(
            f"    at vLLM's split DeepEP waited for the GEMM in {waited} of {row.rounds} rounds (enqueued "
            f"after it, its cluster launch found no room beside the GEMM's programs)"
        )
    return out
