"""SGLang's ``--deepep-config`` JSON.

SGLang's loader (sgl-project/sglang python/sglang/srt/layers/moe/token_dispatcher/deepep.py @
003a81bf, ``DeepEPConfig.__init__``) reads ``normal_dispatch`` and ``normal_combine``, builds
``deep_ep.Config(**section)`` from each, asserts both ``num_sms`` are equal, and uses that
``num_sms`` as ``num_qps_per_rank`` in normal mode. Only normal (high-throughput) mode is
configurable; buffers are sized by SGLang from these configs.
"""

from __future__ import annotations

from typing import Any, Optional

from moepolicy.errors import PolicyError
from moepolicy.schema.policy import PolicyDoc

CONFIG_KWARGS = ("num_sms", "num_max_nvl_chunked_send_tokens", "num_max_nvl_chunked_recv_tokens",
                 "num_max_rdma_chunked_send_tokens", "num_max_rdma_chunked_recv_tokens")


def _bucket(doc: PolicyDoc, tokens: Optional[int]):
    buckets = doc.deepep.buckets
    if tokens is None:
        return buckets[-1]
    for bucket in buckets:
        if bucket.max_tokens is None or tokens <= bucket.max_tokens:
            return bucket
    return buckets[-1]


def export(doc: PolicyDoc, tokens: Optional[int] = None) -> dict[str, Any]:
    """The JSON object; SGLang takes one config, so one bucket is chosen (the largest by default,
    since SGLang uses normal mode for prefill)."""
    if doc.target.backend != "deepep_ht":
        raise PolicyError("SGLang's --deepep-config configures normal (high-throughput) mode only; "
                          f"this policy is for {doc.target.backend}")
    if doc.target.deep_ep.api != "legacy":
        raise PolicyError("SGLang's --deepep-config builds deep_ep.Config (the legacy API); this "
                          f"policy targets DeepEP {doc.target.deep_ep.api}")
    bucket = _bucket(doc, tokens)
    num_sms = doc.deepep.num_sms
    return {
        "normal_dispatch": {"num_sms": num_sms, **bucket.dispatch.model_dump(include=set(CONFIG_KWARGS))},
        "normal_combine": {"num_sms": num_sms, **bucket.combine.model_dump(include=set(CONFIG_KWARGS))},
    }
