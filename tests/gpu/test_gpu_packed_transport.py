"""NVFP4 bytes with their e4m3 scale factors (viewed as float32), and MXFP8 with UE8M0 scales packed
four to an int32, through DeepEP's normal dispatch on 2 GPUs: every received row and its scales equal
the bytes its sender sent. This is transport only: which expert kernel on which GPU reads the layout
is a separate (consumer) capability."""

import pytest

from gpu_support import require

pytestmark = pytest.mark.gpu

WORLD, TOKENS, HIDDEN, EXPERTS, TOPK = 2, 256, 7168, 32, 8


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_packed_bytes_and_scales_arrive_bit_exact(tmp_path_factory, fmt):
    require(2, need_deep_ep=True)
    check_arrived(_results(tmp_path_factory, "deepep"), fmt)


def check_arrived(results, fmt):
    import torch

    from moepolicy.testing import a2a_harness as H

    sent = {r: H.packed_payload(r, TOKENS, HIDDEN, fmt) for r in range(WORLD)}
    for rank in range(WORLD):
        got = results[rank][fmt]
        assert got["x"].shape[0] > 0
        for row, (src, token) in enumerate(zip(got["src_rank"].tolist(), got["src_token"].tolist())):
            x, scales = sent[src]
            assert torch.equal(got["x"][row], x[token]), (fmt, rank, row)
            assert torch.equal(got["s"][row].view(torch.uint8), scales[token].view(torch.uint8)), (fmt, rank, row)


_CACHE: dict = {}


def _results(factory, kind):
    if kind not in _CACHE:
        from moepolicy.testing import a2a_harness as H

        _CACHE[kind] = H.spawn_packed(WORLD, str(factory.mktemp("packed")), tokens=TOKENS, hidden=HIDDEN,
                                      num_experts=EXPERTS, top_k=TOPK, transport_kind=kind)
    return _CACHE[kind]
