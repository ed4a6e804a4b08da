"""DeepEP's settings as values, one type from the tuner to the plugin: a token bucket's chunk
configs (:class:`Bucket`), DeepEP v2's options (:class:`V2Settings`) and the SM count, buffer sizes
and buckets a serving process runs DeepEP with (:class:`DeepEPSettings`). The tuners keep them
(:mod:`moepolicy.deepep.kept`), the document writes them, the runtime reads them back into them.

Light: no torch, no deep_ep at import (the serving process imports deep_ep itself).
"""

from __future__ import annotations

import bisect
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from moepolicy.deepep import buffers
from moepolicy.deepep.configs import ChunkConfig


# Where a policy's DeepEP settings came from (its ``deepep.provenance.source``), in the words every
# export, audit and picture uses: DeepEP's defaults are named as such, whichever way they were kept.
SOURCE_WORDS = {
    "measured": "measured on the target by a live tune",
    "modelled": "chosen with the model bench (modelled, not measured)",
    "extrapolated": "DeepEP's built-in defaults for this EP size (extrapolated: a tune outside the "
    "model bench's calibration keeps them; nothing measured)",
    "default": "DeepEP's built-in defaults for this EP size (from a plan: no tune ran)",
}


def source_words(source: str) -> str:
    """``SOURCE_WORDS[source]``, or the source itself for one this version does not know."""
    return SOURCE_WORDS.get(source, source)


@dataclass(frozen=True)
class Bucket:
    max_tokens: Optional[int]
    dispatch: ChunkConfig
    combine: ChunkConfig


@dataclass(frozen=True)
class V2Settings:
    """DeepEP v2 (ElasticBuffer): ``num_sms`` 0 asks for its analytical count."""

    num_sms: int = 0
    prefer_overlap_with_compute: bool = True
    allow_multiple_reduction: bool = True


@dataclass(frozen=True)
class DeepEPSettings:
    """One validated ``num_sms``, per-bucket dispatch/combine configs, buffer sizes."""

    num_sms: int
    # None: unknown here (no hidden size): the engine sizes DeepEP's buffer itself
    num_nvl_bytes: Optional[int]
    num_rdma_bytes: Optional[int]
    buckets: tuple[Bucket, ...]
    source: str
    is_default: bool = False
    low_latency: Mapping[str, Any] = field(default_factory=dict)
    v2: Optional[V2Settings] = None  # only for a DeepEP v2 target

    def __post_init__(self) -> None:
        bounds = tuple(
            b.max_tokens if b.max_tokens is not None else sys.maxsize for b in self.buckets
        )
        # computed once: bucket_for runs per forward pass
        object.__setattr__(self, "_bounds", bounds)

    def bucket_for(self, num_tokens: int) -> Bucket:
        """The first bucket whose ``max_tokens`` holds ``num_tokens`` (the last one otherwise)."""
        i = bisect.bisect_left(self._bounds, num_tokens)  # type: ignore[attr-defined]  # set by __post_init__, no field
        return self.buckets[min(i, len(self.buckets) - 1)]

    def deep_ep_configs(self, num_tokens: int):
        """(dispatch, combine) as ``deep_ep.Config`` objects; imports deep_ep on first use."""
        import deep_ep  # the serving process has it; loading a policy does not need it

        bucket = self.bucket_for(num_tokens)
        return (
            deep_ep.Config(self.num_sms, *bucket.dispatch),
            deep_ep.Config(self.num_sms, *bucket.combine),
        )

    def buffer_bytes(self, hidden: int, num_ranks: int) -> tuple[int, int]:
        """(num_nvl_bytes, num_rdma_bytes) for bf16 rows of ``hidden`` over every bucket's configs:
        DeepEP's own hints when deep_ep is imported, the same formulas otherwise."""
        deep_ep = sys.modules.get("deep_ep")
        nvl = rdma = 0
        for bucket in self.buckets:
            for chunk in (bucket.dispatch, bucket.combine):
                if deep_ep is not None:
                    config = deep_ep.Config(self.num_sms, *chunk)
                    nvl = max(nvl, config.get_nvl_buffer_size_hint(hidden * 2, num_ranks))
                    if num_ranks > 8:
                        rdma = max(rdma, config.get_rdma_buffer_size_hint(hidden * 2, num_ranks))
                else:
                    nvl = max(
                        nvl,
                        buffers.nvl_bytes_hint(
                            self.num_sms, chunk.nvl_recv, hidden * 2, num_ranks
                        ),
                    )
                    rdma = max(
                        rdma,
                        buffers.rdma_bytes_hint(
                            self.num_sms, chunk.rdma_recv, hidden * 2, num_ranks
                        ),
                    )
        return nvl, rdma
