"""DeepEP buffer sizes from chosen configs: the same formulas as DeepEP's own size hints.

``Config.get_nvl_buffer_size_hint`` / ``get_rdma_buffer_size_hint`` (csrc/config.hpp:52-104 at
29d31c0) and ``Buffer.get_low_latency_rdma_size_hint`` (config.hpp:127-193). When ``deep_ep`` is
imported the runtime asks DeepEP itself; these are used otherwise (and are checked against the
worked values of DeepEP's own hint formulas, checked by the tests). Sized for bf16 rows,
since combine is bf16.
"""

from __future__ import annotations

TOPK_IDX_BYTES = 8  # int64 topk_idx_t (the default build)
# DeepEP's Buffer keeps the high-throughput sizes in an int: num_rdma_bytes (and num_nvl_bytes once an
# RDMA buffer exists) must be at most INT_MAX (csrc/deep_ep.cpp at 29d31c0; deepep-source-notes)
INT_MAX = 2**31 - 1
MAX_TOPK = 128
MAX_SCALES = 128


def _round128(n: int) -> int:
    return (n + 127) // 128 * 128


def nvl_bytes_hint(
    num_sms: int, nvl_recv: int, hidden_bytes: int, num_ranks: int, nvshmem_build: bool = True
) -> int:
    channels = num_sms // 2
    nvl_ranks = min(num_ranks, 8)
    rdma_ranks = max(num_ranks // 8, 1)
    meta = channels * nvl_ranks * (2 * rdma_ranks + 3) * 4
    slot = (
        hidden_bytes
        + (8 if nvshmem_build else 0)
        + MAX_TOPK * TOPK_IDX_BYTES
        + MAX_TOPK * 4
        + MAX_SCALES * 4
    )
    return _round128(meta + channels * nvl_ranks * nvl_recv * slot)


def rdma_bytes_hint(num_sms: int, rdma_recv: int, hidden_bytes: int, num_ranks: int) -> int:
    if num_ranks <= 8:
        return 0
    channels = num_sms // 2
    rdma_ranks = num_ranks // 8
    meta = channels * rdma_ranks * (8 * 2 + 2) * 2 * 4
    slot = hidden_bytes + 8 + MAX_TOPK * TOPK_IDX_BYTES + MAX_TOPK * 4 + MAX_SCALES * 4 + 16
    return _round128(meta + channels * rdma_ranks * rdma_recv * 2 * slot)


def low_latency_bytes_hint(max_tokens_per_rank: int, hidden: int, num_experts: int) -> int:
    num_scales = hidden // 128
    dispatch_msg = 16 + max(2 * hidden, hidden + 4 * num_scales)
    combine_msg = 4 * num_scales + 2 * hidden
    t, e = max_tokens_per_rank, num_experts
    send = 2 * max(t * dispatch_msg, e * t * combine_msg)
    recv = 2 * max(e * t * dispatch_msg, e * t * combine_msg)
    signal = 2 * _round128(e * 4)
    total = send + recv + signal
    return (total + 128) // 128 * 128


def effective_rdma_recv(send: int, recv: int) -> int:
    """DeepEP's Config rounds the RDMA receive capacity up to a multiple of the send chunk."""
    return -(-recv // send) * send


def ht_buffer_bytes(num_sms: int, configs, hidden: int, num_ranks: int) -> tuple[int, int]:
    """(num_nvl_bytes, num_rdma_bytes) that hold bf16 rows of ``hidden`` under every config of
    ``configs`` (``ChunkConfig``s: nvl_send, nvl_recv, rdma_send, rdma_recv), by DeepEP's hints."""
    hidden_bytes = hidden * 2
    nvl = max(nvl_bytes_hint(num_sms, c[1], hidden_bytes, num_ranks) for c in configs)
    rdma = max(
        rdma_bytes_hint(num_sms, effective_rdma_recv(c[2], c[3]), hidden_bytes, num_ranks)
        for c in configs
    )
    return nvl, rdma


def budget_buffers(budget_bytes: int, num_ranks: int) -> tuple[int, int]:
    """(num_nvl_bytes, num_rdma_bytes) of a live bench's buffer from its byte budget: intranode
    (at most 8 ranks) the whole budget on NVLink; internode the budget on each, each kept within
    DeepEP's int limit (``INT_MAX``, rounded down to 128: the default 2048 MiB is 2**31 bytes, one
    too many). Both are multiples of 128, as DeepEP asks."""
    if num_ranks <= 8:
        return int(budget_bytes) // 128 * 128, 0
    fit = min(int(budget_bytes), INT_MAX) // 128 * 128
    return fit, fit
