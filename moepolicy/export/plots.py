"""Pictures of a policy's tuning evidence (``moepolicy report --plots DIR``; the optional ``[plots]``
extra, matplotlib). Each figure draws only what the document records:

- ``sms.png``: per token bucket, DeepEP's time against its SM count (the search's best and DeepEP's
  default chunks), the chosen SM count and vLLM's 20;
- ``kept_vs_default.png``: per bucket, the re-measured kept config, DeepEP's default chunks and the
  engine's default, with the speed-ups' 95 % intervals;
- ``orders.png``: both orders per bucket, where a live tune timed them;
- ``overlap.png``: the overlap split scan, where the policy has one.

The figures read the typed document (:mod:`moepolicy.document.evidence`): evidence not in the form
``tune`` writes is refused by the reader, in one line, before anything is drawn. A point that is not
finite is left out (an axis cannot hold it); a figure with nothing left to draw is not drawn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

from moepolicy.deepep.engines import VLLM_HT_NUM_SMS
from moepolicy.deepep.settings import source_words
from moepolicy.document.evidence import FigureDoc, MeasuredDoc, ScanRowDoc
from moepolicy.document.model import BucketDoc, DeepEPDoc, PolicyDoc
from moepolicy.measure.rounds import speedup_words


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display
    import matplotlib.pyplot as plt

    return plt


FIGURES = ("sms", "kept_vs_default", "orders", "overlap")
MAX_PANELS = 16  # token buckets side by side in one figure
MAX_POINTS = 1000  # rows drawn per figure


def draw(doc: PolicyDoc, folder: Path) -> list[Path]:
    """Write every figure the document has data for into ``folder`` (made only if one is drawn);
    returns the files written."""
    deepep = doc.deepep
    label = deepep.provenance.source
    context = _context(doc, label)
    figures = []
    for name, fn in zip(FIGURES, (_sms, _kept, _orders, _overlap)):
        fig = fn(deepep, label)
        if fig is not None:
            _caption(fig, context)
            figures.append((name, fig))
    if figures:
        folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fig in figures:
        path = folder / f"{name}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        _pyplot().close(fig)
        written.append(path)
    return written


def _caption(fig, context: str) -> None:
    """``context`` as the figure's top line, above its own title (a suptitle, laid out with it)."""
    existing = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) is not None else ""
    fig.suptitle(
        (existing + "\n" if existing else "") + context,
        fontsize=8 if existing else 7,
        color="black" if existing else "dimgrey",
    )


def _context(doc: PolicyDoc, label: str) -> str:
    """The line under every figure: which model, target and tune it shows."""
    target = doc.target
    return (
        ("PARTIAL (not for serving): " if doc.deepep.partial is not None else "")
        + f"{doc.model.name} on {target.gpu} EP{target.ep_size} ({target.backend}); "
        f"{source_words(label)}; {doc.deepep.regime} regime; 'vLLM' = what vLLM runs today (20 SMs, "
        "DeepEP's config table)"
    )


def _finite(*values: Optional[float]) -> bool:
    """Every value a number an axis can hold."""
    return all(v is not None and math.isfinite(v) and abs(v) < 1e15 for v in values)


def _scan(deepep: DeepEPDoc) -> list[ScanRowDoc]:
    """The search's scan rows that can be drawn (at most ``MAX_POINTS``)."""
    rows = deepep.provenance.scan_rows()
    return [r for r in rows if _finite(r.best_us, r.tokens, r.num_sms)][:MAX_POINTS]


def _sms(deepep: DeepEPDoc, label: str):
    scan = _scan(deepep)
    if not scan:
        return None
    plt = _pyplot()
    tokens = sorted({row.tokens for row in scan})[:MAX_PANELS]
    fig, axes = plt.subplots(
        1, len(tokens), figsize=(4.4 * len(tokens), 3.6), squeeze=False, constrained_layout=True
    )
    chosen = deepep.num_sms
    for ax, t in zip(axes[0], tokens):
        rows = sorted((r for r in scan if r.tokens == t), key=lambda r: r.num_sms)
        sms = [r.num_sms for r in rows]
        ax.plot(
            sms,
            [r.best_us for r in rows],
            "o-",
            color="tab:blue",
            label="search's best (selected minimum)",
        )
        with_default = [r for r in rows if _finite(r.default_us)]
        ax.plot(
            [r.num_sms for r in with_default],
            [r.default_us for r in with_default],
            "s--",
            color="tab:orange",
            markerfacecolor="none",
            markersize=9,
            label="DeepEP's default chunks (hollow: under the best where equal)",
        )
        if chosen == VLLM_HT_NUM_SMS:
            ax.axvline(chosen, color="green", label=f"kept = vLLM's {chosen} SMs")
        else:
            ax.axvline(chosen, color="green", label=f"kept ({chosen} SMs)")
            ax.axvline(
                VLLM_HT_NUM_SMS, color="grey", linestyle=":", label=f"vLLM ({VLLM_HT_NUM_SMS} SMs)"
            )
        lo, hi = min(sms + [chosen, VLLM_HT_NUM_SMS]), max(sms + [chosen, VLLM_HT_NUM_SMS])
        ax.set_xlim(lo - max(2, (hi - lo) * 0.1), hi + max(2, (hi - lo) * 0.1))
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set(
            title=f"{t:g} tokens per rank", xlabel="DeepEP's SMs", ylabel="dispatch + combine (µs)"
        )
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=2, fontsize=7)
    fig.suptitle(f"DeepEP's time against its SM count ({label}; the search's samples)")
    return fig


@dataclass(frozen=True)
class _Bars:
    """A bucket's bars: the kept config's, DeepEP's default chunks' and the engine's times, and the
    kept config's speed-up over the engine's (with its interval where measured)."""

    median_us: Mapping[str, float]
    vs_engine: Optional[float]
    ci95: Optional[Sequence[float]] = None


def _evidence(bucket: BucketDoc) -> Optional[_Bars]:
    """A bucket's figures: the report rounds (2.2), the re-measurement of a 2.1 tune, or a modelled
    tune's answers (2.2: ``modelled``, no interval)."""
    modelled = bucket.modelled
    if modelled is not None:
        us = modelled.us
        kept = us.get("kept")
        if kept is None:
            return None
        engine = us.get("engine", kept)
        return _Bars(
            {"engine": engine, "default": us.get("chosen", kept), "kept": kept},
            engine / kept if modelled.chosen_vs_engine is not None else None,
        )
    m = bucket.measured
    report = (m.report or m.confirm) if isinstance(m, MeasuredDoc) else None
    if report is None or report.median_us.get("engine") is None:
        return None
    figure: Optional[FigureDoc] = report.vs_engine
    return _Bars(
        report.median_us,
        None if figure is None else figure.speedup,
        None if figure is None else figure.ci95,
    )


_ARMS = {
    "engine": "vLLM today (20 SMs, DeepEP's table)",
    "default": "DeepEP's default chunks at the kept SMs",
    "kept": "kept by the tune",
}


def _kept(deepep: DeepEPDoc, label: str):
    drawn = [(b, bars) for b in deepep.buckets if (bars := _evidence(b)) is not None]
    drawn = [(b, bars) for b, bars in drawn if _finite(*bars.median_us.values())][:MAX_PANELS]
    if not drawn:
        return None
    buckets = [b for b, _ in drawn]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4), constrained_layout=True)
    for i, name in enumerate(_ARMS):
        xs = [j + (i - 1) * 0.27 for j in range(len(drawn))]
        ys = [bars.median_us.get(name, bars.median_us["engine"]) for _, bars in drawn]
        ax.bar(xs, ys, width=0.25, label=_ARMS[name])
    top = max(max(bars.median_us.values()) for _, bars in drawn)
    for j, (_, bars) in enumerate(drawn):
        words = (
            "kept = vLLM's settings"
            if bars.vs_engine is None
            else f"kept vs vLLM: {speedup_words(bars.vs_engine)}"
        )
        if bars.vs_engine is not None and label != "modelled" and bars.ci95:
            words += f" [{bars.ci95[0]:.2f}-{bars.ci95[1]:.2f}]"
        ax.annotate(words, (j, top * 1.02), ha="center", fontsize=7)
    ax.set_ylim(0, top * 1.12)
    ax.set_xticks(range(len(drawn)), [_bucket_name(b, buckets) + " tokens" for b in buckets])
    ylabel = (
        "µs (the model's answer)" if label == "modelled" else "µs (median of the report rounds)"
    )
    ax.set(
        ylabel=ylabel,
        title=f"the kept DeepEP settings against vLLM's and DeepEP's defaults ({label})",
    )
    fig.legend(loc="outside lower center", ncol=3, fontsize=7)
    return fig


def _bucket_name(bucket: BucketDoc, buckets: list[BucketDoc]) -> str:
    if bucket.max_tokens is not None:
        return f"<= {bucket.max_tokens}"
    bounds = [b.max_tokens for b in buckets if b.max_tokens is not None]
    return f"> {bounds[-1]}" if bounds else "all"


def _orders(deepep: DeepEPDoc, label: str):
    timed = [
        t
        for t in deepep.measured_orders or ()
        if _finite(t.quant_then_dispatch_us, t.dispatch_then_quant_us)
    ]
    if not timed:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3.8), constrained_layout=True)
    timed = timed[:MAX_POINTS]
    xs = range(len(timed))
    ax.bar(
        [x - 0.2 for x in xs],
        [t.quant_then_dispatch_us for t in timed],
        width=0.4,
        label="quantize first",
    )
    ax.bar(
        [x + 0.2 for x in xs],
        [t.dispatch_then_quant_us for t in timed],
        width=0.4,
        label="dispatch bf16 first",
    )
    ax.set_xticks(list(xs), [str(t.tokens) for t in timed])

    top = max(max(t.quant_then_dispatch_us, t.dispatch_then_quant_us) for t in timed)
    for x, t in zip(xs, timed):
        # 2.2: the paired test over rotated rounds; before, one sample each
        if t.quant_first_speedup:
            verdict = "within noise" if t.faster == "neither" else "beyond noise"
            words = f"quantizing first:\n{speedup_words(t.quant_first_speedup)}, {verdict}"
        else:
            words = "one sample each:\nno test"
        ax.annotate(words, (x, top * 1.03), ha="center", fontsize=7)
    ax.set_ylim(0, top * 1.18)
    ax.set(
        xlabel="tokens per rank",
        ylabel="µs (medians)",
        title=f"quantize before dispatch, or dispatch bf16 and quantize after ({label})",
    )
    fig.legend(loc="outside lower center", ncol=2, fontsize=7)
    return fig


def _overlap(deepep: DeepEPDoc, label: str):
    overlap = deepep.overlap
    if overlap is None:
        return None
    points = sorted((sms, us) for sms, us in overlap.splits_us.items() if _finite(sms, us))[
        :MAX_POINTS
    ]
    if not points:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3.8), constrained_layout=True)
    ax.plot(
        [p[0] for p in points],
        [p[1] for p in points],
        "o-",
        label="the split scan (one search sample each)",
    )
    best = min(points, key=lambda p: p[1])
    ax.plot(
        [best[0]],
        [best[1]],
        "v",
        color="tab:red",
        markersize=9,
        label=f"the scan's fastest ({best[0]} SMs)",
    )
    chosen = overlap.comm_sms if overlap.comm_sms is not None else deepep.num_sms
    how = (  # a gate in fresh rounds from schema 2.2; older files kept what the scan chose
        "decided on fresh rounds, not on this scan"
        if overlap.gate is not None
        else "chosen from these samples: no fresh rounds"
    )
    ax.axvline(chosen, color="green", label=f"kept ({chosen:g} SMs: {how})")
    ax.axvline(
        VLLM_HT_NUM_SMS, color="grey", linestyle=":", label=f"vLLM's split ({VLLM_HT_NUM_SMS} SMs)"
    )
    ax.set(
        xlabel="DeepEP's SMs (the experts' GEMM gets the rest)",
        ylabel="overlapped MoE step (µs)",
        title=f"DeepEP's SMs beside the experts' GEMM ({label})",
    )
    fig.legend(loc="outside lower center", ncol=2, fontsize=7)
    return fig
