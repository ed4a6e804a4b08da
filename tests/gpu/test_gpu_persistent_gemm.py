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


@pytest.mark.parametrize(
    "loads,cluster", [("pointer", 1), ("tma", 1), ("tma-flat", 1), ("tma-ws", 1), ("tma", 2)]
)
@pytest.mark.parametrize(
    "group_rows,n,k", [([70, 0, 130, 1, 256], 512, 1024), ([300] * 4, 1536, 2048)]
)
def test_matches_the_reference_on_any_sm_count(group_rows, n, k, loads, cluster):
    require(1)
    import torch

    from moepolicy.measure.persistent_gemm import grouped_block_fp8, grouped_block_fp8_reference

    if (loads != "pointer" or cluster > 1) and torch.cuda.get_device_capability(0) < (9, 0):
        pytest.skip("TMA loads and clusters need SM90 or newer")
    a, a_s, b, b_s = _operands(group_rows, n, k, torch.device("cuda", 0))
    ref = grouped_block_fp8_reference(a, a_s, b, b_s, group_rows).float()
    outs = {
        sms: grouped_block_fp8(a, a_s, b, b_s, group_rows, sms, loads=loads, cluster=cluster)
        for sms in (cluster, 7 * cluster, 132)
    }
    for out in outs.values():
        rel = ((out.float() - ref).abs().max() / ref.abs().max()).item()
        assert rel < 1e-2, rel  # bf16 output rounding, float32 accumulation order
    first, *rest = outs.values()
    assert all(torch.equal(first, other) for other in rest)  # a tile never depends on the grid


def test_expert_gemm_picks_the_persistent_kind_on_sm90():
    require(1)
    import torch

    from moepolicy.measure.overlapped_step import ConfinedGemm, ExpertGemm, GemmShape

    if torch.cuda.get_device_capability(0) != (9, 0):
        pytest.skip("the fp8 persistent kernel is checked on SM90 here")
    gemm = ExpertGemm(
        GemmShape(rows=512, hidden=2048, out=1536), torch.device("cuda", 0), [64] * 8
    )
    assert gemm.kind.startswith("fp8 block-128 persistent grouped GEMM"), (
        gemm.kind,
        gemm.fallback_reason,
    )
    confined = ConfinedGemm(gemm, 66)
    with torch.cuda.stream(confined.stream):
        out = confined.run()
    torch.cuda.synchronize()
    assert out.shape == (512, 1536) and torch.isfinite(out.float()).all()


def test_trace_says_where_each_program_ran():
    """Traced on 100 programs of a config too large for two to share an SM: 100 distinct SMs, every
    tile counted once, each program's end after its start."""
    require(1)
    import torch

    from moepolicy.measure import persistent_gemm as pg

    if torch.cuda.get_device_capability(0) != (9, 0):
        pytest.skip("checked on SM90 (228 KiB of shared memory per SM)")
    group_rows, n, k = [300] * 8, 4096, 2048
    a, a_s, b, b_s = _operands(group_rows, n, k, torch.device("cuda", 0))
    trace = torch.zeros(100, len(pg.TRACE_FIELDS), dtype=torch.int64, device="cuda")
    pg.grouped_block_fp8(a, a_s, b, b_s, group_rows, 100, 64, 256, 8, 4, trace=trace)
    torch.cuda.synchronize()
    shared, _ = pg.launch_resources(64, 256, 8, 4)
    assert shared > 228 * 1024 // 2, shared  # so no two programs fit on one SM
    sm, start, end, tiles = (trace[:, i].tolist() for i in range(4))
    assert len(set(sm)) == 100 and all(
        0 <= s < torch.cuda.get_device_properties(0).multi_processor_count for s in sm
    )
    assert all(e > s > 0 for s, e in zip(start, end))
    assert sum(tiles) == len(group_rows) * -(-300 // 64) * (n // 256)


def test_expert_gemm_picks_a_launch_config_per_sm_count():
    require(1)
    import torch

    from moepolicy.measure.overlapped_step import ConfinedGemm, ExpertGemm, GemmShape

    if torch.cuda.get_device_capability(0) != (9, 0):
        pytest.skip("the fp8 persistent kernel is checked on SM90 here")
    gemm = ExpertGemm(
        GemmShape(rows=2048, hidden=2048, out=1536), torch.device("cuda", 0), [256] * 8
    )
    assert not gemm.skipped_launches, (
        gemm.skipped_launches
    )  # every candidate, TMA ones included, ran
    for sms in (100, 112):
        confined = ConfinedGemm(gemm, sms)
        picked = gemm.launch_config[sms]
        assert picked["candidates"] == len(gemm._launches) and picked["us_alone"] > 0
        assert f"on {sms} SMs: tile {picked['tile']}" in confined.kind
    clustered = ExpertGemm(
        GemmShape(rows=2048, hidden=2048, out=1536, kind="persistent-clustered"),
        torch.device("cuda", 0),
        [256] * 8,
    )
    assert (
        "in 2-CTA clusters" in ConfinedGemm(clustered, 100).kind and not clustered.fallback_reason
    )
