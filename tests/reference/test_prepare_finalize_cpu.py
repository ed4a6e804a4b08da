"""Correctness of every order against quantizing the same tokens on one device, on 2 emulated ranks
(torch.distributed gloo, CPU). The same harness runs over DeepEP on GPUs (test_gpu_deepep.py)."""

import pytest

torch = pytest.importorskip(
    "torch", reason="the quantization tests need torch (pip install torch)"
)

from moepolicy.testing import a2a_harness as H  # noqa: E402

WORLD, TOKENS, HIDDEN, EXPERTS, TOPK = 2, 96, 512, 16, 4


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("a2a")
    return H.spawn(
        WORLD,
        "emulated",
        str(out),
        tokens=TOKENS,
        hidden=HIDDEN,
        num_experts=EXPERTS,
        top_k=TOPK,
        backend="torch",
    )


def ref(results, name, order):
    return H.reference_rows(results, name, (name, order), WORLD, TOKENS, HIDDEN, EXPERTS, TOPK)


@pytest.mark.parametrize("name", ["block128", "block128_ue8m0", "token", "tensor_static"])
def test_both_orders_bit_identical_to_one_device(results, name):
    for order in ("quant_then_dispatch", "dispatch_then_quant"):
        expected = ref(results, name, order)
        for r in range(WORLD):
            got = results[r][(name, order)]
            q_ref, s_ref = expected[r]
            assert torch.equal(got["q"], q_ref), (name, order, r)
            assert torch.equal(got["s"], s_ref), (name, order, r)  # UE8M0: packed int32 both sides
    for r in range(WORLD):
        a = results[r][(name, "quant_then_dispatch")]
        b = results[r][(name, "dispatch_then_quant")]
        assert torch.equal(a["q"], b["q"]) and torch.equal(a["s"], b["s"])


def test_per_expert_static_scales_would_differ():
    """The checkpoint's per-expert scales differ; the global-max convention picks one scale, and
    quantizing with an expert's own scale gives other bytes (why the convention must be stated)."""
    from moepolicy.quant import reference

    scales = H.per_expert_static_scales(EXPERTS)
    assert scales.unique().numel() == EXPERTS
    x, _, _ = H.make_inputs(0, TOKENS, HIDDEN, EXPERTS, TOPK, "cpu")
    global_q = reference.per_tensor_static(x, reference.global_static_scale(scales))
    own_q = reference.per_tensor_static(x, scales[0])
    assert not torch.equal(global_q.view(torch.uint8), own_q.view(torch.uint8))


def test_dynamic_per_tensor_orders_differ_and_label_agrees(results):
    """Quantizing after dispatch uses the receiver's amax: not what one device gives the sender's
    tokens. The per-sender order is exact; the policy labels them exact and approximate."""
    senders_exact, differ = H.dynamic_tensor_outcome(results, WORLD, TOKENS, HIDDEN, EXPERTS, TOPK)
    assert senders_exact
    assert differ > 0, "the receiver-side scale should differ from the senders'"
    from moepolicy.rules.packs import builtin_pack

    numerics = {r.id: r.then.numerics for r in builtin_pack("deepep").rules}
    assert numerics["deepep-ht/dynamic-tensor"] == "approximate"
    assert numerics["deepep-ht/dynamic-tensor-per-sender"] == "exact"


def test_received_rows_follow_routing(results):
    from moepolicy.reference.transport import destination_mask

    for r in range(WORLD):
        got = results[r][("block128", "quant_then_dispatch")]
        expected = []
        for s in range(WORLD):
            _, idx, _ = H.make_inputs(s, TOKENS, HIDDEN, EXPERTS, TOPK, "cpu")
            expected += [
                (s, t)
                for t in torch.nonzero(destination_mask(idx, EXPERTS, WORLD)[:, r])
                .flatten()
                .tolist()
            ]
        assert list(zip(got["src_rank"].tolist(), got["src_token"].tolist())) == expected
        local = got["topk_idx"]
        assert int(local.max()) < EXPERTS // WORLD and int(local.min()) >= -1


def test_combine_sums_each_row_back(results):
    assert H.combine_is_exact(results, WORLD, EXPERTS)
