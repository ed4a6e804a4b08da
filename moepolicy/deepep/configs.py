"""DeepEP's chunk configs as values, and DeepEP's built-in defaults (the one home for them).

A ``deep_ep.Config`` is ``(num_sms, nvl_send, nvl_recv, rdma_send, rdma_recv)``; the SM count is the
buffer's, so a :class:`ChunkConfig` holds the other four. DeepEP rounds the RDMA receive capacity up
to a multiple of the send chunk; :meth:`ChunkConfig.effective` applies that, so two configs that
DeepEP runs the same way compare equal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, NamedTuple

from moepolicy.deepep.buffers import effective_rdma_recv
from moepolicy.deepep.engines import DEEPEP_DEFAULT_NUM_SMS

if TYPE_CHECKING:
    from moepolicy.schema.capability import DeepEPSheet

DOC_KEYS = (
    "num_max_nvl_chunked_send_tokens",
    "num_max_nvl_chunked_recv_tokens",
    "num_max_rdma_chunked_send_tokens",
    "num_max_rdma_chunked_recv_tokens",
)


class ChunkConfig(NamedTuple):
    """One direction's chunking (dispatch or combine), in tokens."""

    nvl_send: int
    nvl_recv: int
    rdma_send: int
    rdma_recv: int

    def effective(self) -> "ChunkConfig":
        return self._replace(rdma_recv=effective_rdma_recv(self.rdma_send, self.rdma_recv))

    def with_nvl_send(self, nvl_send: int) -> "ChunkConfig":
        return self._replace(nvl_send=nvl_send)

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> "ChunkConfig":
        return cls(*(int(doc[key]) for key in DOC_KEYS))


def default_configs(sheet: "DeepEPSheet", ep_size: int) -> tuple[ChunkConfig, ChunkConfig]:
    """DeepEP's built-in (dispatch, combine) configs for ``ep_size`` ranks, effective."""
    d = sheet.defaults
    dispatch = d.dispatch.get(ep_size, d.config_fallback)
    combine = d.combine.get(ep_size, d.config_fallback)
    return ChunkConfig(*dispatch).effective(), ChunkConfig(*combine).effective()


def default_num_sms(sheet: "DeepEPSheet") -> int:
    """``deep_ep.Buffer.num_sms`` for the build (20 where the sheet does not say)."""
    return sheet.defaults.num_sms or DEEPEP_DEFAULT_NUM_SMS
