"""Pictures of a policy's tuning evidence (``moepolicy report --plots DIR``; the optional ``[plots]``
extra, matplotlib). Each figure draws only what the document records:

- ``sms.png``: per token bucket, DeepEP's time against its SM count (the search's best and DeepEP's
  default chunks), the chosen SM count and vLLM's 20;
- ``kept_vs_default.png``: per bucket, the re-measured kept config, DeepEP's default chunks and the
  engine's default, with the speed-ups' 95 % intervals;
- ``orders.png``: both orders per bucket, where a live tune timed them;
- ``overlap.png``: the overlap split scan, where the policy has one.

The fields drawn (``provenance.scan``, ``buckets[].measured.confirm``, ``overlap.splits_us``) are
free-form in the schema: a row that is not in the form ``tune`` writes (a hand edit, another tool)
is left out, a figure with nothing well-formed left is skipped with a note, never a crash.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

from moepolicy.deepep.engines import VLLM_HT_NUM_SMS
from moepolicy.deepep.settings import source_words
from moepolicy.text import is_digits


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display
    import matplotlib.pyplot as plt

    return plt


FIGURES = ("sms", "kept_vs_default", "orders", "overlap")
MAX_PANELS = 16  # token buckets side by side in one figure
MAX_POINTS = 1000  # rows drawn per figure


def draw(doc: dict[str, Any], folder: Path, notes: Optional[list[str]] = None) -> list[Path]:
    """Write every figure the document has data for into ``folder`` (made only if one is drawn);
    returns the files written. A figure whose data is malformed is skipped, and why is appended to
    ``notes``."""
    deepep = doc["deepep"]
    label = str((deepep.get("provenance") or {}).get("source", "?"))
    context = _context(doc, label)
    figures = []
    for name, fn in zip(FIGURES, (_sms, _kept, _orders, _overlap)):
        try:
            fig = fn(deepep, label)
        except (
            KeyError,
            TypeError,
            ValueError,
            IndexError,
            AttributeError,
            ZeroDivisionError,
            OverflowError,
        ) as exc:
            _pyplot().close("all")
            if notes is not None:
                notes.append(
                    f"{name}.png not drawn: its data is not in the form tune writes ({type(exc).__name__}: "
                    f"{' '.join(str(exc).split())[:120]})"
                )
            continue
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


def _context(doc: dict[str, Any], label: str) -> str:
    """The line under every figure: which model, target and tune it shows."""
    model = (doc.get("model") or {}).get("name", "?")
    target = doc.get("target") or {}
    regime = (doc.get("deepep") or {}).get("regime", "host")
    words = source_words(label)
    partial = (doc.get("deepep") or {}).get("partial")
    return (
        ("PARTIAL (not for serving): " if partial else "")
        + f"{model} on {target.get('gpu', '?')} EP{target.get('ep_size', '?')} ({target.get('backend', '?')}); "
        f"{words}; {regime} regime; 'vLLM' = what vLLM runs today (20 SMs, DeepEP's config table)"
    )


def _number(x: Any) -> Optional[float]:
    """A finite number (not a bool), or None."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    try:
        value = float(x)
    except OverflowError:
        return None
    return value if math.isfinite(value) and abs(value) < 1e15 else None


def _rows(items: Any, fields: tuple[str, ...]) -> list[dict[str, float]]:
    """The mappings of ``items`` whose ``fields`` are all finite numbers (those fields, as floats)."""
    out = []
    for item in items if isinstance(items, list) else ():
        if isinstance(item, dict) and all(_number(item.get(f)) is not None for f in fields):
            out.append(
                {f: _number(item[f]) for f in fields}
                | {k: v for k, v in item.items() if k not in fields}
            )
        if len(out) >= MAX_POINTS:
            break
    return out


def _sms(deepep: dict, label: str):
    prov = deepep.get("provenance") or {}
    scan = _rows(
        prov.get("scan") or (prov.get("search") or {}).get("scan"),  # 2.2: under provenance.search
        ("tokens", "num_sms", "best_us"),
    )
    if not scan:
        return None
    plt = _pyplot()
    tokens = sorted({row["tokens"] for row in scan})[:MAX_PANELS]
    fig, axes = plt.subplots(
        1, len(tokens), figsize=(4.4 * len(tokens), 3.6), squeeze=False, constrained_layout=True
    )
    chosen = deepep["num_sms"]
    for ax, t in zip(axes[0], tokens):
        rows = sorted((r for r in scan if r["tokens"] == t), key=lambda r: r["num_sms"])
        sms = [r["num_sms"] for r in rows]
        ax.plot(
            sms,
            [r["best_us"] for r in rows],
            "o-",
            color="tab:blue",
            label="search's best (selected minimum)",
        )
        with_default = [r for r in rows if _number(r.get("default_us")) is not None]
        ax.plot(
            [r["num_sms"] for r in with_default],
            [r["default_us"] for r in with_default],
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


def _evidence(bucket: dict):
    """A bucket's figures: the report rounds (2.2), the re-measurement of a 2.1 tune, or a modelled
    tune's answers (2.2: ``modelled``, no interval)."""
    modelled = bucket.get("modelled")
    if modelled:
        us = modelled.get("us") or {}
        chosen = modelled.get("chosen_vs_engine")
        return {
            "median_us": {
                "engine": us.get("engine", us["kept"]),
                "default": us.get("chosen", us["kept"]),
                "kept": us["kept"],
            },
            "vs_engine": {"speedup": us.get("engine", us["kept"]) / us["kept"]}
            if chosen
            else None,
        }
    m = bucket.get("measured") or {}
    report = m.get("report") or m.get("confirm")
    return report if report and (report.get("median_us") or {}).get("engine") is not None else None


_ARMS = {
    "engine": "vLLM today (20 SMs, DeepEP's table)",
    "default": "DeepEP's default chunks at the kept SMs",
    "kept": "kept by the tune",
}


def _kept(deepep: dict, label: str):
    from moepolicy.measure.rounds import speedup_words

    buckets = [b for b in deepep["buckets"] if _evidence(b)][:MAX_PANELS]
    if not buckets:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4), constrained_layout=True)
    for i, name in enumerate(_ARMS):
        xs = [j + (i - 1) * 0.27 for j in range(len(buckets))]
        ys = [
            _evidence(b)["median_us"].get(name, _evidence(b)["median_us"]["engine"])
            for b in buckets
        ]
        ax.bar(xs, ys, width=0.25, label=_ARMS[name])
    top = max(max(_evidence(b)["median_us"].values()) for b in buckets)
    for j, b in enumerate(buckets):
        r = _evidence(b).get("vs_engine")
        words = (
            "kept = vLLM's settings" if not r else f"kept vs vLLM: {speedup_words(r['speedup'])}"
        )
        if r and label != "modelled" and r.get("ci95"):
            words += f" [{r['ci95'][0]:.2f}-{r['ci95'][1]:.2f}]"
        ax.annotate(words, (j, top * 1.02), ha="center", fontsize=7)
    ax.set_ylim(0, top * 1.12)
    ax.set_xticks(range(len(buckets)), [_bucket_name(b, buckets) + " tokens" for b in buckets])
    ylabel = (
        "µs (the model's answer)" if label == "modelled" else "µs (median of the report rounds)"
    )
    ax.set(
        ylabel=ylabel,
        title=f"the kept DeepEP settings against vLLM's and DeepEP's defaults ({label})",
    )
    fig.legend(loc="outside lower center", ncol=3, fontsize=7)
    return fig


def _bucket_name(bucket: dict, buckets: list) -> str:
    if bucket["max_tokens"] is not None:
        return f"<= {bucket['max_tokens']}"
    bounds = [b["max_tokens"] for b in buckets if b["max_tokens"] is not None]
    return f"> {bounds[-1]}" if bounds else "all"


def _orders(deepep: dict, label: str):
    timed = deepep.get("measured_orders") or []
    if not timed:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3.8), constrained_layout=True)
    timed = timed[:MAX_POINTS]
    xs = range(len(timed))
    ax.bar(
        [x - 0.2 for x in xs],
        [t["quant_then_dispatch_us"] for t in timed],
        width=0.4,
        label="quantize first",
    )
    ax.bar(
        [x + 0.2 for x in xs],
        [t["dispatch_then_quant_us"] for t in timed],
        width=0.4,
        label="dispatch bf16 first",
    )
    ax.set_xticks(list(xs), [str(t["tokens"]) for t in timed])
    from moepolicy.measure.rounds import speedup_words

    top = max(max(t["quant_then_dispatch_us"], t["dispatch_then_quant_us"]) for t in timed)
    for x, t in zip(
        xs, timed
    ):  # 2.2: the paired test over rotated rounds; before, one sample each
        if t.get("quant_first_speedup"):
            verdict = "within noise" if t.get("faster") == "neither" else "beyond noise"
            words = f"quantizing first:\n{speedup_words(t['quant_first_speedup'])}, {verdict}"
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


def _object(value: Any) -> dict[Any, Any]:
    """``value`` where it is an object of the document, else an empty one."""
    return value if isinstance(value, dict) else {}


def _overlap(deepep: dict, label: str):
    overlap = _object(deepep.get("overlap"))
    splits = _object(overlap.get("splits_us"))
    points = sorted(
        (int(k), us)
        for k, v in splits.items()
        if is_digits(str(k).strip()) and len(str(k)) < 7 and (us := _number(v)) is not None
    )[:MAX_POINTS]
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
    chosen = _number(overlap.get("comm_sms"))
    chosen = chosen if chosen is not None else deepep["num_sms"]
    how = (  # a gate in fresh rounds from schema 2.2; older files kept what the scan chose
        "decided on fresh rounds, not on this scan"
        if isinstance(overlap.get("gate"), dict)
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
