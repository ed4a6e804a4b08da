"""The policy's ``deepep`` section, built in one place from a :class:`~moepolicy.deepep.kept.KeptDeepEP`
(what the planner defaults to or a tuner kept) and the sizes the composer derived from the plan."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Mapping, Optional, Sequence

from moepolicy.deepep.configs import DOC_KEYS, ChunkConfig
from moepolicy.deepep.kept import KeptDeepEP
from moepolicy.deepep.settings import Bucket


def chunk_doc(config: ChunkConfig) -> dict[str, int]:
    """A chunk config as the document writes it (with DeepEP's effective RDMA receive capacity)."""
    return dict(zip(DOC_KEYS, config.effective()))


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
    measured_orders: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """``kept`` with its buffer sizes ``(num_nvl_bytes, num_rdma_bytes)``, a low-latency target's
    settings and the order timings the layers were decided with."""
    section: dict[str, Any] = {
        "num_sms": kept.num_sms,
        "num_nvl_bytes": buffers[0],
        "num_rdma_bytes": buffers[1],
        "buckets": [_bucket(b, kept.evidence_for(i)) for i, b in enumerate(kept.buckets)],
        "provenance": dict(kept.provenance),
    }
    if kept.overlap is not None:
        section["overlap"] = dict(kept.overlap)
    section.update({"schedule": kept.schedule, "regime": kept.regime})
    if kept.v2 is not None:
        section["v2"] = asdict(kept.v2)
    if low_latency:
        section["low_latency"] = dict(low_latency)
    if kept.partial is not None:
        section["partial"] = {"reason": kept.partial}
    if measured_orders:
        section["measured_orders"] = [dict(t) for t in measured_orders]
    return section
