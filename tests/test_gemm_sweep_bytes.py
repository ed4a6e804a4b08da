"""``scripts/gemm_sm_sweep.py``'s memory roof: the least bytes the experts' GEMM moves (each operand
once), against which its measured time is set as TB/s."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gemm_sm_sweep.py"


def _sweep():
    spec = importlib.util.spec_from_file_location("gemm_sm_sweep", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_least_bytes_counts_the_weights_of_experts_that_got_rows_once():
    sweep = _sweep()
    hidden, out = 7168, 4096  # DeepSeek-V3's gate and up
    groups = [64] * 127 + [0]  # one local expert got no rows: its weights need not be read
    weights = 127 * out * hidden
    acts = 127 * 64 * hidden
    scales = 4 * (127 * (out // 128) * (hidden // 128) + 127 * 64 * (hidden // 128))
    assert sweep.least_bytes(groups, hidden, out) == weights + acts + scales + 2 * 127 * 64 * out
    # at 1024 tokens per rank the weights are nearly all of it: the GEMM streams 3.7 GB of fp8 experts
    assert weights / sweep.least_bytes(groups, hidden, out) > 0.95


def test_a_dimension_that_is_not_a_multiple_of_128_rounds_its_scale_blocks_up():
    sweep = _sweep()
    assert sweep.least_bytes([1], 130, 129) == 129 * 130 + 130 + 4 * (2 * 2 + 2) + 2 * 129
