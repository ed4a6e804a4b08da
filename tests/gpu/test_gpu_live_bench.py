"""The shared bench contract, run against the live DeepEP bench with 2 ranks (sharing the GPU where
one is visible: the contract's relations hold there too; its numbers are no measurement)."""

import pytest

from gpu_support import require
from moepolicy.testing.bench_contract import BenchContract

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def bench():
    """One live bench for the contract's tests (a module fixture: pytest 9 deprecates class-scoped
    fixtures defined as methods)."""
    require(1, need_deep_ep=True)
    pytest.importorskip("optuna")
    from moepolicy.tuning.live_bench import LiveBench

    live = LiveBench(2, 1 << 30, reps=10)
    yield live
    live.close()


class TestLiveBenchContract(BenchContract):
    @pytest.fixture
    def workload(self):
        from moepolicy.tuning.bench import Workload

        return Workload(7168, 256, 8, 2, "fp8")
