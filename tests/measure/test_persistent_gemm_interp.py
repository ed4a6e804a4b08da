"""The persistent block-fp8 grouped GEMM under Triton's CPU interpreter (runs where Triton is
installed; CI's CPU image has no Triton, so it skips there and the GPU test covers it)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "triton", reason="Triton is not installed (its CPU interpreter runs this check)"
)

SCRIPT = r"""
import torch
from moepolicy.measure.persistent_gemm import grouped_block_fp8, grouped_block_fp8_reference
g = torch.Generator().manual_seed(0)
rows, n, k = [70, 0, 130], 256, 384
a = torch.randn(sum(rows), k, generator=g).to(torch.float8_e4m3fn)
a_s = torch.rand(sum(rows), k // 128, generator=g) + 0.5
b = torch.randn(3, n, k, generator=g).to(torch.float8_e4m3fn)
b_s = torch.rand(3, n // 128, k // 128, generator=g) + 0.5
ref = grouped_block_fp8_reference(a, a_s, b, b_s, rows).float()
for sms, bm, bn in ((3, 64, 128), (1, 32, 64), (2, 16, 256)):
    c = grouped_block_fp8(a, a_s, b, b_s, rows, sms, block_m=bm, block_n=bn).float()
    assert ((c - ref).abs().max() / ref.abs().max()).item() < 1e-2
try:
    grouped_block_fp8(a, a_s, b, b_s, [1, 2, 3], 1)
except ValueError as exc:
    assert "do not match" in str(exc)
else:
    raise AssertionError("mismatched group rows accepted")
from moepolicy.measure.persistent_gemm import tile_tables
te, tr, ee, om, on = (t.tolist() for t in tile_tables([3, 5], 2, 128, 256, "cpu"))
assert te == [0, 0, 1, 1, 1] and tr == [0, 2, 3, 5, 7] and ee == [3, 8]
assert list(zip(om, on)) == [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (3, 0), (4, 0), (2, 1), (3, 1), (4, 1)]
te, tr, ee, om, on = (t.tolist() for t in tile_tables([3, 5], 2, 128, 256, "cpu", order="rows"))
assert list(zip(om, on))[:4] == [(0, 0), (0, 1), (1, 0), (1, 1)]
c = grouped_block_fp8(a, a_s, b, b_s, rows, 2, tables=tile_tables(rows, 64, 128, n, "cpu", order="rows")).float()
assert ((c - ref).abs().max() / ref.abs().max()).item() < 1e-2
for sms, bm, bn, loads in ((3, 64, 128, "tma"), (2, 16, 256, "tma"), (2, 64, 128, "tma-flat"), (3, 32, 128, "tma-ws")):
    # TMA loads: tiles read past an expert's rows, never store them
    c = grouped_block_fp8(a, a_s, b, b_s, rows, sms, block_m=bm, block_n=bn, loads=loads).float()
    assert ((c - ref).abs().max() / ref.abs().max()).item() < 1e-2, (sms, bm, bn, loads)
try:
    grouped_block_fp8(a, a_s, b, b_s, rows, 3, cluster=2)
except ValueError as exc:
    assert "multiple of the cluster size" in str(exc)
else:
    raise AssertionError("3 SMs in clusters of 2 accepted")
print("ok")
"""


def test_kernel_matches_reference_under_the_interpreter():
    env = dict(
        os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(Path(__file__).resolve().parents[2])
    )
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]
