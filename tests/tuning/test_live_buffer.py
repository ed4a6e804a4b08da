"""The DeepEP buffer a live bench sizes from its budget (``--max-buffer-mb``) fits DeepEP's int
limit at every EP size: at the default 2048 MiB the internode RDMA buffer would be 2**31 bytes, which
DeepEP 29d31c0 refuses on every rank at ``deep_ep.Buffer`` (csrc/deep_ep.cpp)."""

import pytest

from moepolicy.deepep.buffers import INT_MAX, budget_buffers


@pytest.mark.parametrize("ranks", [2, 8, 16, 32])
def test_the_default_buffer_budget_fits_deepeps_int_limit(ranks):
    nvl, rdma = budget_buffers(2048 * 1024 * 1024, ranks)
    assert nvl % 128 == 0 and rdma % 128 == 0
    if ranks > 8:
        assert 0 < rdma <= INT_MAX and 0 < nvl <= INT_MAX
    else:
        assert (nvl, rdma) == (2**31, 0)  # intranode: no RDMA buffer, no int limit on NVLink's
