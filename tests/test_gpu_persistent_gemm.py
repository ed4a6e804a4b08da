"""The persistent block-fp8 grouped GEMM (the overlap objective's expert GEMM) on a GPU: correct
against a float32 reference, and the same bits whatever SM count it is launched on."""

import pytest

from gpu_support import require

pytestmark = pytest.mark.gpu


def _operands(group_rows, n, k, device):
    import torch

    g = torch.Generator(device=device).manual_seed(5)
    rows = sum(group_rows)
    a = torch.randn(rows, k, device=device, generator=g).to(torch.float8_e4m3fn)
    a_s = torch.rand(rows, -(-k // 128), device=device, generator=g) + 0.5
    b = torch.randn(len(group_rows), n, k, device=device, generator=g).to(torch.float8_e4m3fn)
    b_s = torch.rand(len(group_rows), -(-n // 128), -(-k // 128), device=device, generator=g) + 0.5
    return a, a_s, b, b_s


@pytest.mark.parametrize("group_rows,n,k", [([70, 0, 130, 1, 256], 512, 1024), ([300] * 4, 1536, 2048)])
def test_matches_the_reference_on_any_sm_count(group_rows, n, k):
    require(1)
    import torch

    from moepolicy.measure.persistent_gemm import grouped_block_fp8, grouped_block_fp8_reference

    a, a_s, b, b_s = _operands(group_rows, n, k, torch.device("cuda", 0))
    ref = grouped_block_fp8_reference(a, a_s, b, b_s, group_rows).float()
    outs = {sms: grouped_block_fp8(a, a_s, b, b_s, group_rows, sms) for sms in (1, 7, 132)}
    for out in outs.values():
        rel = ((out.float() - ref).abs().max() / ref.abs().max()).item()
        assert rel < 1e-2, rel  # bf16 output rounding, float32 accumulation order
    assert torch.equal(outs[1], outs[7]) and torch.equal(outs[7], outs[132])  # a tile never depends on the grid


def test_expert_gemm_picks_the_persistent_kind_on_sm90():
    require(1)
    import torch

    from moepolicy.measure.overlap import ConfinedGemm, ExpertGemm, GemmShape

    if torch.cuda.get_device_capability(0) != (9, 0):
        pytest.skip("the fp8 persistent kernel is checked on SM90 here")
    gemm = ExpertGemm(GemmShape(rows=512, hidden=2048, out=1536), torch.device("cuda", 0), [64] * 8)
    assert gemm.kind.startswith("fp8 block-128 persistent grouped GEMM"), (gemm.kind, gemm.fallback_reason)
    confined = ConfinedGemm(gemm, 66)
    with torch.cuda.stream(confined.stream):
        out = confined.run()
    torch.cuda.synchronize()
    assert out.shape == (512, 1536) and torch.isfinite(out.float()).all()
