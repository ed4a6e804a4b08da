"""The protocol on 2 GPUs with DeepEP (skipped elsewhere, with the reason): the live bench times both
orders with either one first, and a short live tune writes what the report rounds measured of the
config it keeps, its both-order facts with their intervals, and the search's minima apart."""

import pytest
import yaml

pytestmark = pytest.mark.gpu


def _require_two_gpus_and_deep_ep():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    pytest.importorskip("deep_ep", reason="deep_ep is not importable; install DeepEP to run these")
    pytest.importorskip("optuna")


def test_the_live_bench_times_both_orders_with_either_first():
    _require_two_gpus_and_deep_ep()
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


def test_a_short_live_tune_records_the_report_rounds_of_what_it_keeps(tmp_path):
    _require_two_gpus_and_deep_ep()
    from conftest import run_cli

    out = tmp_path / "p.yaml"
    result = run_cli(
        "tune",
        "--model",
        "Qwen3-30B-A3B-FP8",
        "--bench",
        "live",
        "--sms",
        "20,32",
        "--tokens",
        "1024,4096",
        "--trials",
        "3",
        "--confirm-rounds",
        "7",
        "--storage",
        f"sqlite:///{tmp_path}/s.db",
        "-o",
        str(out),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    deepep = yaml.safe_load(out.read_text())["deepep"]
    assert (
        deepep["provenance"]["source"] == "measured"
        and deepep["provenance"]["protocol"]["rounds"] == 7
    )
    for bucket in deepep["buckets"]:
        report = bucket["measured"]["report"]
        assert report["rounds"] == 7 and report["median_us"]["kept"] > 0
        assert bucket["measured"]["num_sms"] == deepep["num_sms"]
        assert bucket["search"]["note"].startswith("selected minima")
    for timing in deepep.get("measured_orders") or ():  # fp8 payload: both orders with their test
        assert (
            timing["rounds"] == 7
            and len(timing["ci95"]) == 2
            and timing["faster"] in ("quant_then_dispatch", "dispatch_then_quant", "neither")
        )
