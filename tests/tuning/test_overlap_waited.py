"""The rule that says DeepEP waited for the GEMM instead of running beside it, on cases measured on
H200 (comm alone, comm end and GEMM end inside the GEMM-first pair, µs) and one made-up edge."""

import pytest

pytest.importorskip("torch", reason="moepolicy.measure needs torch (the CPU build is enough)")

from moepolicy.measure.overlapped_step import deepep_waited  # noqa: E402


@pytest.mark.parametrize(
    "comm, comm_end, gemm_end, waited",
    [
        (
            295.9,
            1439.0,
            1228.3,
            True,
        ),  # 2026-11-30: DeepSeek-V3, 1024 tokens, 20 SMs, unclustered GEMM: ran after it
        (866.8, 3885.1, 3137.4, True),  # 2026-11-30: the same at 4096 tokens
        (
            292.5,
            476.0,
            1585.3,
            False,
        ),  # 2026-11-30: 20 SMs beside the clustered GEMM: ended long before it
        (
            541.8,
            567.7,
            130.9,
            False,
        ),  # 2026-11-30: Qwen3, 4 SMs: the comm is just longer than the GEMM (end ~ alone)
        (200.0, 260.0, 150.0, False),  # made up: ends after the GEMM, but within 1.5x its own time
    ],
)
def test_waited_rule(comm, comm_end, gemm_end, waited):
    assert deepep_waited(comm, comm_end, gemm_end) is waited
