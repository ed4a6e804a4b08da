"""Pictures of a policy's tuning evidence (``moepolicy report --plots DIR``; the optional ``[plots]``
extra, matplotlib). Each figure draws only what the document records:

- ``sms.png``: per token bucket, DeepEP's time against its SM count (the search's best and DeepEP's
  default chunks), the chosen SM count and vLLM's 20;
- ``kept_vs_default.png``: per bucket, the re-measured kept config, DeepEP's default chunks and the
  engine's default, with the speed-ups' 95 % intervals;
- ``orders.png``: both orders per bucket, where a live tune timed them;
- ``overlap.png``: the overlap split scan, where the policy has one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from moepolicy.deepep.engines import VLLM_HT_NUM_SMS


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display
    import matplotlib.pyplot as plt

    return plt


def draw(doc: dict[str, Any], folder: Path) -> list[Path]:
    """Write every figure the document has data for into ``folder``; returns the files written."""
    folder.mkdir(parents=True, exist_ok=True)
    deepep = doc["deepep"]
    label = deepep["provenance"]["source"]
    written = []
    for name, fn in (("sms", _sms), ("kept_vs_default", _kept), ("orders", _orders), ("overlap", _overlap)):
        fig = fn(deepep, label)
        if fig is None:
            continue
        path = folder / f"{name}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        _pyplot().close(fig)
        written.append(path)
    return written


def _sms(deepep: dict, label: str):
    prov = deepep["provenance"]
    scan = prov.get("scan") or (prov.get("search") or {}).get("scan") or []  # 2.2: under provenance.search
    if not scan:
        return None
    plt = _pyplot()
    tokens = sorted({row["tokens"] for row in scan})
    fig, axes = plt.subplots(1, len(tokens), figsize=(4.2 * len(tokens), 3.4), squeeze=False)
    for ax, t in zip(axes[0], tokens):
        rows = sorted((r for r in scan if r["tokens"] == t), key=lambda r: r["num_sms"])
        ax.plot([r["num_sms"] for r in rows], [r["best_us"] for r in rows], "o-", label="search best")
        with_default = [r for r in rows if "default_us" in r]
        ax.plot([r["num_sms"] for r in with_default], [r["default_us"] for r in with_default], "s--",
                label="DeepEP default chunks")
        ax.axvline(deepep["num_sms"], color="green", label=f"chosen ({deepep['num_sms']})")
        ax.axvline(VLLM_HT_NUM_SMS, color="grey", linestyle=":", label=f"vLLM ({VLLM_HT_NUM_SMS})")
        ax.set(title=f"{t} tokens per rank", xlabel="DeepEP SMs", ylabel="dispatch + combine, us")
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

    buckets = [b for b in deepep["buckets"] if _evidence(b)]
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
    splits = (deepep.get("overlap") or {}).get("splits_us") or {}
    if not splits:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.4))
    points = sorted((int(k), v) for k, v in splits.items())
    ax.plot([p[0] for p in points], [p[1] for p in points], "o-")
    ax.axvline(deepep["overlap"].get("comm_sms", deepep["num_sms"]), color="green", label="chosen")
    ax.axvline(VLLM_HT_NUM_SMS, color="grey", linestyle=":", label="vLLM's split (20)")
    ax.set(xlabel="communication SMs (the GEMM gets the rest)", ylabel="overlapped MoE step, us",
           title=f"overlap split scan ({label})")
    ax.legend(fontsize=7)
    return fig
