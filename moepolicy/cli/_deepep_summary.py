"""The DeepEP section of a policy, rendered for ``audit``: SM count, where the numbers came from, and
per bucket what backs it (for ``tune --overlap``: the split against vLLM's, its floor, and the lowest
floor of the grid). Only renders what the document records; ``tune --overlap`` prints the same lines.

One convention for every speed-up (``measure.rounds.speedup_words``): ``x1.035 faster`` or
``x1.051 slower``. Modelled figures say so and carry no interval; the search's selected minima are
labelled as such; figures a schema 2.1 tune wrote from the rounds that also decided say that too.
"""

from __future__ import annotations

from typing import Optional

from moepolicy.deepep.engines import VLLM_DBO_COMM_SMS
from moepolicy.deepep.settings import source_words
from moepolicy.document.evidence import (
    FigureDoc,
    MeasuredDoc,
    ModelledDoc,
    OverlapRowDoc,
    V2EvidenceDoc,
)
from moepolicy.document.model import BucketDoc, DeepEPDoc
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


def deepep_lines(deepep: DeepEPDoc) -> list[str]:
    prov = deepep.provenance
    where = ", ".join(part for part in (prov.bench, prov.date) if part)
    lines = [
        f"DeepEP: {deepep.num_sms} SMs, NVLink buffer {_mib(deepep.num_nvl_bytes)}, RDMA buffer "
        f"{_mib(deepep.num_rdma_bytes)}; {source_words(prov.source)}"
        + (f" ({where})" if where else "")
    ]
    if prov.note:
        lines.append(f"  {prov.note}")
    if prov.why:
        lines.append(f"  why: {prov.why}")
    lines.append(
        f"  chosen for the {deepep.schedule} schedule, timed in the {deepep.regime} regime"
    )
    if deepep.partial is not None:
        lines.append(
            f"  PARTIAL: {deepep.partial.reason}; load_policy uses DeepEP's defaults for it"
        )
    lines += _v2_lines(prov.v2)
    overlap = deepep.overlap
    if overlap is not None:
        lines.append(
            f"  overlap split: {overlap.comm_sms} communication SMs, expert GEMM on "
            f"{overlap.gemm_sms}, chosen for the {overlap.order} launch order"
        )
        lines.append(f"  GEMM stand-in: {overlap.gemm}")
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


def _v2_lines(v2: Optional[V2EvidenceDoc]) -> list[str]:
    if v2 is None:
        return []
    out = [f"  DeepEP v2: {v2.why}"]
    for tokens, r in v2.report.items():
        if r.vs_default is not None:
            out.append(f"    T={tokens}, report rounds: {_claim(r.vs_default)}")
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


def _bucket_lines(name: str, bucket: BucketDoc, source: str) -> list[str]:
    """A bucket's chunks and what backs them: an overlap tune's row, a modelled tune's answers,
    the report rounds (schema 2.2) or a schema 2.1 re-measurement, and the search's minima."""
    chunks = (
        f"send chunks {bucket.dispatch.num_max_nvl_chunked_send_tokens}/"
        f"{bucket.combine.num_max_nvl_chunked_send_tokens}"
    )
    m = bucket.measured
    if isinstance(m, OverlapRowDoc):
        row = OverlapBucketRow.from_doc(m.model_dump(exclude_unset=True))
        return [f"  {name}: {chunks}", *overlap_lines(row)]
    lines = [f"  {name}: {chunks}"]
    if bucket.modelled is not None:
        lines += modelled_lines(bucket.modelled)
    elif m is not None and m.report is not None:
        lines += measured_lines(m)
    elif m is not None:
        lines += legacy_lines(m, source)
    if bucket.search is not None:
        s = bucket.search
        lines.append(
            f"    search (selected minima, not a claim): best {s.best_us} us at {s.num_sms} SMs"
            + (f", DeepEP's default {s.default_us} us" if s.default_us is not None else "")
        )
    return lines


def _claim(r: FigureDoc) -> str:
    """One stored comparison in the convention's words: a report figure (``protocol.Figure``: the
    estimate and its interval, no verdict) or, from older files, a tested one (``Speedup.to_doc``)."""
    low, high = r.ci95 if r.ci95 else (None, None)
    interval = interval_words(low, high)
    if r.rounds_from == "report":
        together = (r.interval or "").partition(", ")[2]
        return (
            f"{speedup_words(r.speedup)} than {r.baseline} ({interval}"
            f"{', ' + together if together else ''}, {r.rounds} report rounds)"
        )
    verdict = r.verdict or ""
    tail = {"faster": "", "slower": ": a loss beyond noise"}.get(verdict, f", {verdict}")
    family = f", {r.correction}" if r.correction else ""
    return (
        f"{speedup_words(r.speedup)} than {r.baseline}{tail} "
        f"({interval}, {r.rounds} rounds{family})"
    )


def measured_lines(m: MeasuredDoc) -> list[str]:
    """A bucket of a schema 2.2 live tune: the config kept, then the report rounds' figures."""
    report = m.report
    out = [f"    kept {m.kept} at {m.num_sms} SMs: {m.selection or ''}"]
    if report is None:
        return out
    times = ", ".join(f"{k} {v} us" for k, v in report.median_us.items())
    out.append(
        f"    report rounds ({report.rounds}, fresh workers, they decided nothing): {times}"
    )
    for figure in (report.vs_engine, report.vs_default):
        if figure is not None:
            out.append(f"    {_claim(figure)}")
    return out


def modelled_lines(m: ModelledDoc) -> list[str]:
    """A bucket of a modelled tune: the model's answers, labelled so; no interval, no noise test."""
    us = ", ".join(f"{k} {v} us" for k, v in m.us.items())
    out = [
        f"    kept {m.kept} at {m.num_sms} SMs; modelled (the model bench's answers, not "
        f"measurements): {us}"
    ]
    c = m.chosen_vs_engine
    if c is not None:
        err = "unknown" if c.model_error is None else f"{c.model_error:.1%}"
        out.append(
            f"    {c.num_sms} SMs vs the engine's default: {speedup_words(c.speedup)}, modelled; "
            f"{c.claim} (held-out error {err})"
        )
    return out


def legacy_lines(m: MeasuredDoc, source: str) -> list[str]:
    """A bucket written before schema 2.2: search samples, and the re-measurement (``confirm``) whose
    figures came from the rounds that also decided; on the model bench, modelled, whatever it says."""
    timed = ", ".join(
        f"{what} {us} us"
        for what, us in (("dispatch", m.dispatch_us), ("combine", m.combine_us))
        if us is not None
    )
    out = [f"    search (selected minima, not a claim): {timed}"] if timed else []
    confirm = m.confirm
    if confirm is None:
        return out
    out.append(f"    kept {confirm.kept}: {confirm.selection}")
    for r in (confirm.vs_engine, confirm.vs_default):
        if source == "modelled":
            out.append(
                f"    vs {r.baseline}: {speedup_words(r.speedup)}, modelled (no interval; the "
                "model's error is not in it)"
            )
            continue
        low, high = r.ci95 if r.ci95 else (None, None)
        verdict = "beyond noise" if r.beyond_noise else "within noise"
        out.append(
            f"    vs {r.baseline}: {speedup_words(r.speedup)}, {verdict} "
            f"({interval_words(low, high)}, {r.rounds} rounds; schema 2.1: the rounds that also decided)"
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
    if row.floor_us > 0:  # rows before the floor was recorded have neither time alone
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
    if alone and by_sms and v is not None:  # no ratio where a time alone was not recorded
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
