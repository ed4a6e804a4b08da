"""The shared bench contract, run against the live DeepEP bench with 2 ranks (sharing the GPU where
one is visible: the contract's relations hold there too; its numbers are no measurement)."""

import pytest

from gpu_support import require
from moepolicy.testing.bench_contract import BenchContract

pytestmark = pytest.mark.gpu


class TestLiveBenchContract(BenchContract):
    @pytest.fixture(scope="class")
    def bench(self):
        require(1, need_deep_ep=True)
        pytest.importorskip("optuna")
        from moepolicy.tuning.live_bench import LiveBench

        bench = LiveBench(2, 1 << 30, reps=10)
        yield bench
        bench.close()

    @pytest.fixture
    def workload(self):
        from moepolicy.tuning.bench import Workload

        return Workload(7168, 256, 8, 2, "fp8")
