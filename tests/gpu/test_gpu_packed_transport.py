"""NVFP4 bytes with their e4m3 scale factors (viewed as float32), and MXFP8 with UE8M0 scales packed
four to an int32, through DeepEP's normal dispatch at EP 2, 4 and 8 (ranks share the GPU where fewer
are visible; transport bit-exactness does not depend on the link): every received row and its scales
equal the bytes its sender sent. This is transport only: which expert kernel on which GPU reads the
layout is a separate (consumer) capability."""

import pytest

from gpu_support import WORLDS, require

pytestmark = pytest.mark.gpu

TOKENS, HIDDEN, EXPERTS, TOPK = 256, 7168, 32, 8


@pytest.mark.parametrize("world", WORLDS, ids=lambda w: f"ep{w}")
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_packed_bytes_and_scales_arrive_bit_exact(tmp_path_factory, fmt, world):
    require(1, need_deep_ep=True)
    from moepolicy.testing import a2a_harness as H

    H.check_packed_arrived(_results(tmp_path_factory, world), fmt, TOKENS, HIDDEN)


_CACHE: dict = {}


def _results(factory, world):
    if world not in _CACHE:
        from moepolicy.testing import a2a_harness as H

        _CACHE[world] = H.spawn_packed(
            world,
            str(factory.mktemp(f"packed{world}")),
            tokens=TOKENS,
            hidden=HIDDEN,
            num_experts=EXPERTS,
            top_k=TOPK,
            transport_kind="deepep",
        )
    return _CACHE[world]
