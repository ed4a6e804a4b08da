"""The live bench times both orders with either one first, on 2 ranks: a GPU each where 2 are
visible, sharing one otherwise (then only that both are timed is checked, not what they measure)."""

import pytest

from gpu_support import require

pytestmark = pytest.mark.gpu


def test_the_live_bench_times_both_orders_with_either_first():
    require(1, need_deep_ep=True)
    pytest.importorskip("optuna")
    import dataclasses

    from moepolicy.deepep.configs import ChunkConfig
    from moepolicy.tuning.bench import TunePoint, Workload
    from moepolicy.tuning.live_bench import LiveBench

    work = Workload(7168, 256, 8, 2, "fp8", both_orders=True)
    point = TunePoint(24, 1024, ChunkConfig(24, 256, 6, 128), ChunkConfig(10, 256, 6, 128))
    bench = LiveBench(2, 1 << 30, reps=10)
    try:
        for first in ("quant_then_dispatch", "dispatch_then_quant"):
            orders = bench.measure(dataclasses.replace(work, orders_first=first), point).orders
            assert set(orders) == {"quant_then_dispatch", "dispatch_then_quant"}
            assert all(us > 0 for us in orders.values())
    finally:
        bench.close()
