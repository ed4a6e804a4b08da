"""The packed-format harness of ``test_gpu_packed_transport.py`` over the emulated all-to-all on CPU:
the layouts are what NVFP4 and MXFP8 send, and the comparison finds every row (so the GPU test can
fail only on DeepEP's account)."""

import pytest

torch = pytest.importorskip(
    "torch", reason="the emulated all-to-all needs torch (the CPU build is enough)"
)

from moepolicy.testing.a2a_harness import check_packed_arrived  # noqa: E402

WORLD, TOKENS, HIDDEN, EXPERTS, TOPK = 2, 256, 7168, 32, 8


def test_the_layouts_are_nvfp4_and_mxfp8():
    from moepolicy.testing.a2a_harness import packed_payload

    x, s = packed_payload(0, 4, 7168, "nvfp4")
    assert (
        x.shape == (4, 3584)
        and s.dtype == torch.float32
        and s.view(torch.uint8).shape == (4, 7168 // 16)
    )
    x, s = packed_payload(0, 4, 7168, "mxfp8")
    assert (
        x.shape == (4, 7168)
        and s.dtype == torch.int32
        and s.view(torch.uint8).shape == (4, 7168 // 32)
    )


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_the_emulated_transport_carries_them_and_the_check_sees_every_row(tmp_path, fmt):
    from moepolicy.testing import a2a_harness as H

    results = H.spawn_packed(
        WORLD,
        str(tmp_path),
        tokens=TOKENS,
        hidden=HIDDEN,
        num_experts=EXPERTS,
        top_k=TOPK,
        transport_kind="emulated",
    )
    check_packed_arrived(results, fmt, TOKENS, HIDDEN)
    broken = [{**r, fmt: {**r[fmt], "x": r[fmt]["x"].clone()}} for r in results]
    broken[0][fmt]["x"][0, 0] ^= 1  # one flipped bit in one received row
    with pytest.raises(AssertionError):
        check_packed_arrived(broken, fmt, TOKENS, HIDDEN)
