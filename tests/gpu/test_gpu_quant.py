"""Triton quantization kernels against the torch reference, bit for bit, on a GPU."""

import pytest

from gpu_support import require

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _need_gpu():
    require(1)


@pytest.mark.parametrize(
    "tokens, hidden", [(1, 128), (7, 2880), (333, 2048), (1024, 7168), (64, 7000)]
)
@pytest.mark.parametrize("ue8m0", [False, True])
def test_group_quant_bit_identical(tokens, hidden, ue8m0):
    import torch

    from moepolicy.quant import reference, triton_kernels

    for seed in range(3):
        g = torch.Generator(device="cuda").manual_seed(seed)
        x = (torch.randn(tokens, hidden, device="cuda", generator=g) * 5).to(torch.bfloat16)
        x[0, :17] = 0  # an all-zero stretch exercises the eps floor
        q_ref, s_ref = reference.per_token_group(x, 128, ue8m0=ue8m0)
        q = torch.full_like(q_ref.view(torch.uint8), 0x7F).view(torch.float8_e4m3fn)  # poison
        q, s = triton_kernels.per_token_group(x, 128, ue8m0=ue8m0)
        assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
        assert torch.equal(s, s_ref)


def test_token_and_static_quant_bit_identical():
    import torch

    from moepolicy.quant import reference, triton_kernels

    x = (torch.randn(513, 7168, device="cuda") * 3).to(torch.bfloat16)
    q_ref, s_ref = reference.per_token(x)
    q, s = triton_kernels.per_token(x)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(s, s_ref)
    scale = torch.tensor([0.037], device="cuda")
    assert torch.equal(
        triton_kernels.per_tensor_static(x, scale).view(torch.uint8),
        reference.per_tensor_static(x, scale).view(torch.uint8),
    )
