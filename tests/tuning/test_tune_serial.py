"""The serial-schedule tuner: num_sms chosen by the MoE step (DeepEP, then the experts' GEMM on every
SM), inside the bench's calibrated range; every bucket re-measured beside DeepEP's default chunks and
the engine's default (20 SMs, DeepEP's table) under the protocol of ``tuning.confirm``."""

import math
import random

import pytest
import yaml

optuna = pytest.importorskip("optuna", reason="tuning needs optuna")

from conftest import run_cli  # noqa: E402
from moepolicy.checkpoint.reader import read_model  # noqa: E402
from moepolicy.deepep.configs import default_configs  # noqa: E402
from moepolicy.planner import make_plan  # noqa: E402
from moepolicy.rules.packs import pack_stack  # noqa: E402
from moepolicy.target import TargetSpec, resolve_target  # noqa: E402
from moepolicy.tuning.bench import Bench, Measurement, TunePoint  # noqa: E402
from moepolicy.tuning.model_bench import ModelBench  # noqa: E402
from moepolicy.tuning.options import TuneOptions  # noqa: E402
from moepolicy.tuning.runner import tune_plan, workload_for  # noqa: E402
from moepolicy.tuning.space import load_objective, load_space  # noqa: E402


def qwen_plan(ep=2):
    target = resolve_target(TargetSpec(gpu="h200", ep_size=ep), probe=False)
    return make_plan(read_model("Qwen3-30B-A3B-FP8", hub=False), target, pack_stack())


def test_the_modelled_main_job_stays_inside_the_calibration_and_compares_with_the_engine(tmp_path):
    out = tmp_path / "q.yaml"
    result = run_cli("tune", "--model", "Qwen3-30B-A3B-FP8", "--ep-size", "2", "--storage",
                     f"sqlite:///{tmp_path}/s.db", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert "SM counts 64 are outside the calibrated 8-48" in result.stderr
    assert "engine default us" in result.stderr
    doc = yaml.safe_load(out.read_text())
    deepep = doc["deepep"]
    assert deepep["provenance"]["source"] == "modelled" and deepep["schedule"] == "serial"
    assert deepep["regime"] == "host"
    assert 8 <= deepep["num_sms"] <= 48  # never outside the calibrated SM range
    # serial: more SMs cost the GEMM nothing, so the fastest modelled communication is chosen
    plan = qwen_plan()
    bench, work = ModelBench("h200"), workload_for(plan, "uniform")
    d, c = default_configs(plan.target.deepep, 2)
    tokens = [1024, 4096]
    for sms in (8, 12, 16, 20, 24, 32):
        assert sum(bench.measure(work, TunePoint(sms, t, d, c)).objective() for t in tokens) > \
            sum(bench.measure(work, TunePoint(deepep["num_sms"], t, d, c)).objective() for t in tokens)
    bounds = [128, 1024, 4096]
    for bucket, t in zip(deepep["buckets"], bounds):
        confirm = bucket["measured"]["confirm"]
        engine = bench.measure(work, TunePoint(20, t, d, c)).objective()  # what vLLM runs: 20 SMs, the table
        kept = bench.measure(work, TunePoint(deepep["num_sms"], t, d, c)).objective()
        assert confirm["median_us"]["engine"] == pytest.approx(engine, rel=1e-3)
        assert confirm["vs_engine"]["speedup"] == pytest.approx(engine / kept, rel=1e-3)
        # the model's chunk effects are hand-set, so its chunks are DeepEP's default
        assert confirm["kept"] == "default" and bucket["dispatch"]["num_max_nvl_chunked_send_tokens"] == d.nvl_send


def test_sm_counts_outside_the_calibration_are_never_tried_and_none_inside_is_extrapolated(tmp_path):
    out = tmp_path / "q.yaml"
    result = run_cli("tune", "--model", "Qwen3-30B-A3B-FP8", "--ep-size", "2", "--sms", "64,96",
                     "--storage", f"sqlite:///{tmp_path}/s.db", "-o", str(out))
    assert result.returncode == 0, result.stderr
    doc = yaml.safe_load(out.read_text())
    assert doc["deepep"]["provenance"]["source"] == "extrapolated" and doc["deepep"]["num_sms"] == 20


def test_the_gpu_regime_is_outside_a_calibration_timed_in_the_host_regime(tmp_path):
    out = tmp_path / "q.yaml"
    result = run_cli("tune", "--model", "Qwen3-30B-A3B-FP8", "--ep-size", "2", "--regime", "gpu",
                     "--storage", f"sqlite:///{tmp_path}/s.db", "-o", str(out))
    assert result.returncode == 0, result.stderr
    doc = yaml.safe_load(out.read_text())
    assert doc["deepep"]["provenance"]["source"] == "extrapolated" and doc["deepep"]["regime"] == "gpu"
    assert "host regime" in doc["deepep"]["provenance"]["note"]


class FlatBench(Bench):
    """A live-like bench where SM count and chunks make no difference: every time is 500 us +- noise."""

    name = "flat"

    def __init__(self, seed=0, sigma=0.08, sms_effect=0.0):
        self.rng, self.sigma, self.sms_effect = random.Random(seed), sigma, sms_effect

    def measure(self, workload, point):
        us = 500.0 * (20 / point.num_sms) ** self.sms_effect * math.exp(self.rng.gauss(0, self.sigma))
        return Measurement(us, us * 0.8, 100.0, "measured")


def _tune(bench, tmp_path, **kw):
    options = TuneOptions(buckets=((1024, 1.0), (4096, 1.0)), trials=6, sms=(20, 32, 48),
                          storage=f"sqlite:///{tmp_path}/s.db", **kw)
    return tune_plan(qwen_plan(), bench, options, load_space(), load_objective())


def test_where_nothing_beats_the_engine_beyond_noise_the_engine_default_is_kept(tmp_path):
    result = _tune(FlatBench(seed=4), tmp_path)
    deepep = result.document["deepep"]
    assert deepep["num_sms"] == 20 and "no gain beyond noise" in deepep["provenance"]["why"]
    for bucket in deepep["buckets"]:
        confirm = bucket["measured"]["confirm"]
        assert confirm["vs_engine"]["rounds"] == 7 and confirm["kept"] == "engine"
        assert bucket["dispatch"]["num_max_nvl_chunked_send_tokens"] == 24  # DeepEP's EP2 table
    assert deepep["provenance"]["protocol"]["rounds"] == 7


def test_a_real_sm_gain_is_kept_with_its_interval(tmp_path):
    result = _tune(FlatBench(seed=5, sigma=0.03, sms_effect=1.0), tmp_path)  # time falls as 1/SMs
    deepep = result.document["deepep"]
    assert deepep["num_sms"] == 48
    for bucket in deepep["buckets"]:
        engine = bucket["measured"]["confirm"]["vs_engine"]
        assert engine["beyond_noise"] and engine["ci95"][0] > 1.0
        assert engine["speedup"] == pytest.approx((500 + 100) / (500 * 20 / 48 + 100), rel=0.05)  # dispatch + combine


def test_the_protocol_refuses_too_few_rounds_on_a_noisy_bench(tmp_path):
    from moepolicy.errors import TuningError

    with pytest.raises(TuningError, match="at least 7"):
        _tune(FlatBench(), tmp_path, confirm_rounds=3)


def test_progress_events_count_the_search_and_the_re_measurement(tmp_path):
    import logging

    events = []

    class Recorder(logging.Handler):
        def emit(self, record):
            events.append((getattr(record, "phase", None), getattr(record, "total", None),
                           getattr(record, "advance", 0)))

    logger = logging.getLogger("moepolicy.tuning.progress")
    handler = Recorder()
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        _tune(FlatBench(seed=5, sigma=0.03, sms_effect=1.0), tmp_path)
    finally:
        logger.removeHandler(handler)
    phases = [(i, name, total) for i, (name, total, _) in enumerate(events) if name]
    assert [name for _, name, _ in phases] == ["search", "re-measure"]
    (start, _, total), (second, _, _) = phases
    assert total == 3 * 2 * 6  # SM counts x buckets x trials: each trial counted once
    assert sum(step for _, _, step in events[start + 1:second]) == total
    assert sum(step for _, _, step in events[second + 1:]) > 0


def test_per_trial_lines_only_with_verbose(tmp_path):
    args = ("tune", "--model", "Qwen3-30B-A3B-FP8", "--ep-size", "2", "--sms", "24", "--tokens", "1024",
            "--trials", "3", "--storage", f"sqlite:///{tmp_path}/s.db")
    quiet = run_cli(*args, "-o", str(tmp_path / "a.yaml"))
    loud = run_cli(*args, "--study", "v", "-o", str(tmp_path / "b.yaml"), "--verbose")
    assert quiet.returncode == loud.returncode == 0, quiet.stderr + loud.stderr
    assert "trial 1/3" not in quiet.stderr and "trial 1/3" in loud.stderr
