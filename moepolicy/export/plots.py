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


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display
    import matplotlib.pyplot as plt

    return plt


FIGURES = ("sms", "kept_vs_default", "orders", "overlap")
MAX_PANELS = 16  # token buckets side by side in one figure
MAX_POINTS = 1000  # rows drawn per figure


def draw(doc: dict[str, Any], folder: Path, notes: Optional[list[str]] = None) -> list[Path]:
    """Write every figure the document has data for into ``folder``; returns the files written.
    A figure whose data is malformed is skipped, and why is appended to ``notes``."""
    folder.mkdir(parents=True, exist_ok=True)
    deepep = doc["deepep"]
    label = str((deepep.get("provenance") or {}).get("source", "?"))
    written = []
    for name, fn in zip(FIGURES, (_sms, _kept, _orders, _overlap)):
        try:
            fig = fn(deepep, label)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError, ZeroDivisionError, OverflowError) as exc:
            _pyplot().close("all")
            if notes is not None:
                notes.append(f"{name}.png not drawn: its data is not in the form tune writes ({type(exc).__name__}: "
                             f"{' '.join(str(exc).split())[:120]})")
            continue
        if fig is None:
            continue
        path = folder / f"{name}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        _pyplot().close(fig)
        written.append(path)
    return written


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
            out.append({f: _number(item[f]) for f in fields} | {k: v for k, v in item.items() if k not in fields})
        if len(out) >= MAX_POINTS:
            break
    return out


def _sms(deepep: dict, label: str):
    prov = deepep.get("provenance") or {}
    scan = _rows(prov.get("scan") or (prov.get("search") or {}).get("scan"),  # 2.2: under provenance.search
                 ("tokens", "num_sms", "best_us"))
    if not scan:
        return None
    plt = _pyplot()
    tokens = sorted({row["tokens"] for row in scan})[:MAX_PANELS]
    fig, axes = plt.subplots(1, len(tokens), figsize=(4.2 * len(tokens), 3.4), squeeze=False)
    for ax, t in zip(axes[0], tokens):
        rows = sorted((r for r in scan if r["tokens"] == t), key=lambda r: r["num_sms"])
        ax.plot([r["num_sms"] for r in rows], [r["best_us"] for r in rows], "o-", label="search best")
        with_default = [r for r in rows if _number(r.get("default_us")) is not None]
        ax.plot([r["num_sms"] for r in with_default], [r["default_us"] for r in with_default], "s--",
                label="DeepEP default chunks")
        ax.axvline(deepep["num_sms"], color="green", label=f"chosen ({deepep['num_sms']})")
        ax.axvline(VLLM_HT_NUM_SMS, color="grey", linestyle=":", label=f"vLLM ({VLLM_HT_NUM_SMS})")
        ax.set(title=f"{t:g} tokens per rank", xlabel="DeepEP SMs", ylabel="dispatch + combine, us")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"DeepEP time against its SMs ({label}; search samples)", y=1.04)
    return fig


def _evidence(bucket: dict):
    """A bucket's figures: the report rounds (2.2), the re-measurement of a 2.1 tune, or a modelled
    tune's answers (2.2: ``modelled``, no interval)."""
    modelled = bucket.get("modelled")
    if modelled:
        us = modelled.get("us") or {}
        chosen = modelled.get("chosen_vs_engine")
        return {"median_us": {"engine": us.get("engine", us["kept"]), "default": us.get("chosen", us["kept"]),
                              "kept": us["kept"]},
                "vs_engine": {"speedup": us.get("engine", us["kept"]) / us["kept"]} if chosen else None}
    m = bucket.get("measured") or {}
    report = m.get("report") or m.get("confirm")
    return report if report and (report.get("median_us") or {}).get("engine") is not None else None


def _kept(deepep: dict, label: str):
    from moepolicy.measure.rounds import speedup_words

    buckets = [b for b in deepep["buckets"] if _evidence(b)][:MAX_PANELS]
    if not buckets:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    names = ["engine", "default", "kept"]
    for i, name in enumerate(names):
        xs = [j + (i - 1) * 0.27 for j in range(len(buckets))]
        ys = [_evidence(b)["median_us"].get(name, _evidence(b)["median_us"]["engine"]) for b in buckets]
        ax.bar(xs, ys, width=0.25, label={"engine": "engine default (20 SMs, table)",
                                          "default": "DeepEP default chunks", "kept": "kept"}[name])
    for j, b in enumerate(buckets):
        r = _evidence(b).get("vs_engine")
        if not r:
            continue
        words = speedup_words(r["speedup"])
        if label != "modelled" and r.get("ci95"):
            words += f" [{r['ci95'][0]:.2f}-{r['ci95'][1]:.2f}]"
        ax.annotate(words, (j + 0.27, 0), xytext=(0, 3), textcoords="offset points", ha="center", fontsize=7,
                    rotation=90)
    ax.set_xticks(range(len(buckets)), [_bucket_name(b, buckets) for b in buckets])
    ylabel = "us (the model's answer)" if label == "modelled" else "us (median of the report rounds)"
    ax.set(ylabel=ylabel, title=f"kept vs defaults ({label}); the kept config vs the engine")
    ax.legend(fontsize=7)
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
    fig, ax = plt.subplots(figsize=(6, 3.4))
    timed = timed[:MAX_POINTS]
    xs = range(len(timed))
    ax.bar([x - 0.2 for x in xs], [t["quant_then_dispatch_us"] for t in timed], width=0.4, label="quantize first")
    ax.bar([x + 0.2 for x in xs], [t["dispatch_then_quant_us"] for t in timed], width=0.4, label="dispatch bf16 first")
    ax.set_xticks(list(xs), [str(t["tokens"]) for t in timed])
    from moepolicy.measure.rounds import speedup_words

    for x, t in zip(xs, timed):  # 2.2: the paired test over rotated rounds; before, one sample each
        if t.get("quant_first_speedup"):
            verdict = "within noise" if t.get("faster") == "neither" else "beyond noise"
            ax.annotate(f"quantizing first {speedup_words(t['quant_first_speedup'])}, {verdict}", (x - 0.2, 0),
                        xytext=(0, 3), textcoords="offset points", ha="center", fontsize=7, rotation=90)
    ax.set(xlabel="tokens per rank", ylabel="us (medians)", title=f"both orders per bucket ({label})")
    ax.legend(fontsize=7)
    return fig


def _overlap(deepep: dict, label: str):
    overlap = deepep.get("overlap") if isinstance(deepep.get("overlap"), dict) else {}
    splits = overlap.get("splits_us") if isinstance(overlap.get("splits_us"), dict) else {}
    points = sorted((int(k), _number(v)) for k, v in splits.items()
                    if str(k).strip().isdigit() and len(str(k)) < 7 and _number(v) is not None)[:MAX_POINTS]
    if not points:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.4))
    ax.plot([p[0] for p in points], [p[1] for p in points], "o-")
    chosen = _number(overlap.get("comm_sms"))
    ax.axvline(chosen if chosen is not None else deepep["num_sms"], color="green", label="chosen")
    ax.axvline(VLLM_HT_NUM_SMS, color="grey", linestyle=":", label="vLLM's split (20)")
    ax.set(xlabel="communication SMs (the GEMM gets the rest)", ylabel="overlapped MoE step, us",
           title=f"overlap split scan ({label})")
    ax.legend(fontsize=7)
    return fig
