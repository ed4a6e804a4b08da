"""The policy's ``deepep`` section, built in one place from a :class:`~moepolicy.deepep.kept.KeptDeepEP`
(what the planner defaults to or a tuner kept) and the sizes the composer derived from the plan."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Mapping, Optional, Sequence

from moepolicy.deepep.configs import DOC_KEYS, ChunkConfig
from moepolicy.deepep.kept import KeptDeepEP
from moepolicy.deepep.settings import Bucket
from moepolicy.document.builder import section
from moepolicy.document.model import DeepEPDoc
from moepolicy.names import UNMEASURED
from moepolicy.schema.measured import OrderTiming


def chunk_doc(config: ChunkConfig) -> dict[str, int]:
    """A chunk config as the document writes it (with DeepEP's effective RDMA receive capacity)."""
    return dict(zip(DOC_KEYS, config.effective()))


def order_timing_doc(timing: OrderTiming) -> dict[str, Any]:
    """A measured order timing as ``deepep.measured_orders`` records it (schema 2.2 adds the test)."""
    out: dict[str, Any] = {
        "tokens": timing.tokens,
        "quant_then_dispatch_us": round(float(timing.quant_then_dispatch_us), 2),
        "dispatch_then_quant_us": round(float(timing.dispatch_then_quant_us), 2),
    }
    if timing.verdict is not None:
        assert timing.speedup is not None, (
            "a measured order timing's verdict comes with its speedup"
        )
        out.update(
            {
                "rounds": timing.rounds,
                "quant_first_speedup": round(float(timing.speedup), 4),
                "ci95": None if timing.ci95 is None else [round(float(x), 4) for x in timing.ci95],
                "faster": "neither" if timing.verdict == UNMEASURED else timing.verdict,
            }
        )
        if timing.correction:
            out["correction"] = timing.correction
    return out


def _bucket(bucket: Bucket, evidence: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "max_tokens": bucket.max_tokens,
        "dispatch": chunk_doc(bucket.dispatch),
        "combine": chunk_doc(bucket.combine),
        **evidence,
    }


def deepep_section(
    kept: KeptDeepEP,
    buffers: tuple[int, int],
    low_latency: Optional[Mapping[str, int]] = None,
    measured_orders: Sequence[OrderTiming] = (),
) -> DeepEPDoc:
    """``kept`` with its buffer sizes ``(num_nvl_bytes, num_rdma_bytes)``, a low-latency target's
    settings and the order timings the layers were decided with."""
    fields: dict[str, Any] = {
        "num_sms": kept.num_sms,
        "num_nvl_bytes": buffers[0],
        "num_rdma_bytes": buffers[1],
        "buckets": [_bucket(b, kept.evidence_for(i)) for i, b in enumerate(kept.buckets)],
        "provenance": dict(kept.provenance),
    }
    if kept.overlap is not None:
        fields["overlap"] = dict(kept.overlap)
    fields.update({"schedule": kept.schedule, "regime": kept.regime})
    if kept.v2 is not None:
        fields["v2"] = asdict(kept.v2)
    if low_latency:
        fields["low_latency"] = dict(low_latency)
    if kept.partial is not None:
        fields["partial"] = {"reason": kept.partial}
    if measured_orders:
        fields["measured_orders"] = [order_timing_doc(t) for t in measured_orders]
    return section(DeepEPDoc, "deepep", **fields)
