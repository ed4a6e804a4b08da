"""Every order through DeepEP at EP 2, 4 and 8, against quantizing the same tokens on one device.

Runs the harness of test_prepare_finalize_cpu.py over DeepEP's normal kernels with the Triton
quantizers (ranks share the GPU where fewer are visible), and measures low-latency in-kernel
quantization against the reference.
"""

import pytest

from gpu_support import WORLDS, require

pytestmark = pytest.mark.gpu

TOKENS, HIDDEN, EXPERTS, TOPK = 256, 7168, 32, 8
WORLD = 2  # low-latency


@pytest.fixture(scope="module", params=WORLDS, ids=lambda w: f"ep{w}")
def ranks(request, tmp_path_factory):
    require(1, need_deep_ep=True)
    from moepolicy.testing import a2a_harness as H

    world = request.param
    return world, H.spawn(
        world,
        "deepep",
        str(tmp_path_factory.mktemp(f"deepep{world}")),
        tokens=TOKENS,
        hidden=HIDDEN,
        num_experts=EXPERTS,
        top_k=TOPK,
    )


@pytest.mark.parametrize("name", ["block128", "block128_ue8m0", "token", "tensor_static"])
def test_deepep_both_orders_bit_identical(ranks, name):
    import torch

    from moepolicy.testing import a2a_harness as H

    world, results = ranks
    for order in ("quant_then_dispatch", "dispatch_then_quant"):
        expected = H.reference_rows(
            results, name, (name, order), world, TOKENS, HIDDEN, EXPERTS, TOPK
        )
        for r in range(world):
            got = results[r][(name, order)]
            assert got["q"].shape[0] > 0
            assert torch.equal(got["q"], expected[r][0]), (name, order, r)
            assert torch.equal(got["s"], expected[r][1]), (name, order, r)


def test_deepep_dynamic_tensor_receiver_scale_differs(ranks):
    from moepolicy.testing import a2a_harness as H

    world, results = ranks
    senders_exact, differ = H.dynamic_tensor_outcome(results, world, TOKENS, HIDDEN, EXPERTS, TOPK)
    assert senders_exact and differ > 0


def test_deepep_combine(ranks):
    from moepolicy.testing import a2a_harness as H

    world, results = ranks
    assert H.combine_is_exact(results, world, EXPERTS)


def test_low_latency_in_kernel_quant_measured_against_reference(tmp_path, record_property):
    require(1, need_deep_ep=True)
    import torch

    from moepolicy.quant import reference
    from moepolicy.rules.packs import builtin_pack
    from moepolicy.testing import a2a_harness as H

    tokens, hidden, experts, topk = 64, 2048, 16, 4
    rows = H.spawn_low_latency(
        WORLD, str(tmp_path), tokens=tokens, hidden=hidden, num_experts=experts, top_k=topk
    )
    refs = {}
    for s in range(WORLD):
        x, _, _ = H.make_inputs(s, tokens, hidden, experts, topk, "cpu")
        refs[s] = reference.per_token_group(x, 128)
    mismatched_bytes = total = 0
    worst_scale = 0.0
    for per_rank in rows:
        assert per_rank, "each rank received tokens"
        for s, t, q, sc in per_rank:
            q_ref, s_ref = refs[s][0][t].view(torch.uint8), refs[s][1][t]
            mismatched_bytes += int((q != q_ref).sum())
            total += q.numel()
            worst_scale = max(worst_scale, float(((sc - s_ref).abs() / s_ref).max()))
    fraction = mismatched_bytes / total
    record_property("ll_fp8_mismatch_fraction", fraction)
    record_property("ll_fp8_worst_scale_rel_diff", worst_scale)
    print(
        f"low-latency in-kernel fp8 vs reference: {fraction:.6f} of bytes differ, worst scale rel diff {worst_scale:.3e}"
    )
    label = {r.id: r.then.numerics for r in builtin_pack("deepep").rules}["deepep-ll/block-fp8"]
    identical = mismatched_bytes == 0 and worst_scale == 0
    if not identical:
        assert label == "approximate", (
            "in-kernel quantization differs from the reference: label approximate"
        )
    if label == "exact":
        assert identical, "labelled exact, so it must be bit-identical to the reference"
    assert fraction < 0.05 and worst_scale < 1e-3  # the same 1x128 scheme at worst
