"""What a policy keeps for DeepEP and what backs it, as values: the SM count, the chunk configs per
token bucket, DeepEP v2's settings, the schedule and regime they were chosen for, and the evidence.

The tuners (serial, overlap, extrapolated, v2) return a :class:`KeptDeepEP`; the planner's default is
one too; :mod:`moepolicy.document.deepep_section` is the one place it becomes the policy's
``deepep`` section (buffer sizes are the composer's: they follow from the plan's shapes).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Optional

from moepolicy.deepep.configs import ChunkConfig, default_configs, default_num_sms

# ElasticBuffer's defaults at dd758ca (num_sms 0: get_theoretical_num_sms decides)
V2_DEFAULTS = {"num_sms": 0, "prefer_overlap_with_compute": True, "allow_multiple_reduction": True}


@dataclass(frozen=True)
class KeptBucket:
    """One token bucket's configs, up to ``max_tokens`` per rank (None: every larger count), and what
    backs them as the document records it (``measured`` or ``modelled``, ``search``)."""

    max_tokens: Optional[int]
    dispatch: ChunkConfig
    combine: ChunkConfig
    evidence: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class KeptDeepEP:
    """DeepEP's settings a policy keeps; ``provenance`` says where they come from."""

    num_sms: int
    buckets: tuple[KeptBucket, ...]
    provenance: Mapping[str, Any]
    schedule: str = "serial"  # serial | overlapped
    regime: str = "host"
    v2: Optional[Mapping[str, Any]] = None  # deepep.v2: only for a DeepEP v2 target
    overlap: Optional[Mapping[str, Any]] = None  # the overlap search's summary
    partial: Optional[str] = None  # why the result is partial (an interrupted tune)

    def with_provenance(self, provenance: Mapping[str, Any], **changes: Any) -> "KeptDeepEP":
        return replace(self, provenance=provenance, **changes)


def deepep_defaults(sheet, ep_size: int, note: str) -> KeptDeepEP:
    """DeepEP's built-in configs and SM count for ``ep_size`` ranks (``sheet``: a DeepEP data sheet);
    a v2 build's ElasticBuffer defaults beside them."""
    dispatch, combine = default_configs(sheet, ep_size)
    return KeptDeepEP(default_num_sms(sheet), (KeptBucket(None, dispatch, combine),),
                      {"source": "default", "note": note},
                      v2=dict(V2_DEFAULTS) if sheet.api == "v2" else None)
