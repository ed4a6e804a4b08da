"""What a policy keeps for DeepEP and what backs it, as values: the SM count, the chunk configs per
token bucket (:class:`~moepolicy.deepep.settings.Bucket`, the runtime's own type), DeepEP v2's
settings, the schedule and regime they were chosen for, and the evidence.

The tuners (serial, overlap, extrapolated, v2) return a :class:`KeptDeepEP`; the planner's default is
one too; :mod:`moepolicy.document.deepep_section` is the one place it becomes the policy's
``deepep`` section (buffer sizes are the composer's: they follow from the plan's shapes).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional

from moepolicy.deepep.configs import default_configs, default_num_sms
from moepolicy.deepep.settings import Bucket, DeepEPSettings, V2Settings


@dataclass(frozen=True)
class KeptDeepEP:
    """DeepEP's settings a policy keeps; ``provenance`` says where they come from; ``evidence`` is
    per bucket what backs its configs as the document records it (``measured`` or ``modelled``,
    ``search``), empty where nothing was measured."""

    num_sms: int
    buckets: tuple[Bucket, ...]
    provenance: Mapping[str, Any]
    evidence: tuple[Mapping[str, Any], ...] = ()
    schedule: str = "serial"  # serial | overlapped
    regime: str = "host"
    v2: Optional[V2Settings] = None  # only for a DeepEP v2 target
    overlap: Optional[Mapping[str, Any]] = None  # the overlap search's summary
    partial: Optional[str] = None  # why the result is partial (an interrupted tune)

    def with_provenance(self, provenance: Mapping[str, Any], **changes: Any) -> "KeptDeepEP":
        return replace(self, provenance=provenance, **changes)

    def evidence_for(self, i: int) -> Mapping[str, Any]:
        return self.evidence[i] if i < len(self.evidence) else {}

    @property
    def settings(self) -> DeepEPSettings:
        """What a serving process runs DeepEP with (buffer sizes: the composer's, from the plan)."""
        source = str(self.provenance.get("source", ""))
        return DeepEPSettings(
            self.num_sms,
            None,
            None,
            self.buckets,
            source,
            is_default=source == "default",
            v2=self.v2,
        )


def deepep_defaults(sheet, ep_size: int, note: str) -> KeptDeepEP:
    """DeepEP's built-in configs and SM count for ``ep_size`` ranks (``sheet``: a DeepEP data sheet);
    a v2 build's ElasticBuffer defaults beside them."""
    dispatch, combine = default_configs(sheet, ep_size)
    return KeptDeepEP(
        default_num_sms(sheet),
        (Bucket(None, dispatch, combine),),
        {"source": "default", "note": note},
        v2=V2Settings() if sheet.api == "v2" else None,
    )
