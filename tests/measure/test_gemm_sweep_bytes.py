"""The memory roof ``benchmarks/gemm_sm_sweep.py`` sets its measured time against: the least bytes the
experts' GEMM moves (each operand once; ``moepolicy.measure.shapes.least_bytes``)."""

import types

from moepolicy.measure import shapes


def _sweep():
    return types.SimpleNamespace(least_bytes=shapes.least_bytes)


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
