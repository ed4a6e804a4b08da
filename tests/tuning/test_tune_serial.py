"""The serial-schedule tuner: num_sms chosen by the MoE step (DeepEP, then the experts' GEMM on every
SM), inside the bench's calibrated range; every bucket re-measured beside DeepEP's default chunks and
the engine's default (20 SMs, DeepEP's table) under the protocol of ``tuning.confirm``."""

import math
import random

import pytest
import yaml

optuna = pytest.importorskip("optuna", reason="tuning needs optuna")

from conftest import run_cli  # noqa: E402
from moepolicy.api import policy_document  # noqa: E402
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


def qwen_plan(ep=2, expert_kernel=None):
    target = resolve_target(
        TargetSpec(gpu="h200", ep_size=ep, expert_kernel=expert_kernel), probe=False
    )
    return make_plan(read_model("Qwen3-30B-A3B-FP8", hub=False), target, pack_stack())


MEASURED_LOOKING = (
    "ci95",
    "beyond_noise",
    "95% CI",
    "beyond noise",
    "measured:",
    "confirm",
    "search samples",
)


def test_the_modelled_main_job_keeps_the_engines_sm_count_where_only_it_is_calibrated(tmp_path):
    """Every 128- and 1024-token calibration point is at 20 SMs: no other SM count is calibrated at
    every bucket, so the modelled main job keeps the engine's default and claims nothing."""
    out = tmp_path / "q.yaml"
    result = run_cli(
        "tune",
        "--model",
        "Qwen3-30B-A3B-FP8",
        "--ep-size",
        "2",
        "--storage",
        f"sqlite:///{tmp_path}/s.db",
        "-o",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    assert (
        "are not calibrated at every token bucket (128 tokens: 20; 1024 tokens: 20; 4096 tokens: 20,24)"
        in result.stderr
    )
    assert "kept us (modelled)" in result.stderr
    doc = yaml.safe_load(out.read_text())
    deepep = doc["deepep"]
    assert deepep["provenance"]["source"] == "modelled" and deepep["schedule"] == "serial"
    assert (
        deepep["regime"] == "host" and deepep["num_sms"] == 20 and doc["schema_version"] == "2.4"
    )
    plan = qwen_plan()
    bench, work = ModelBench("h200"), workload_for(plan, "uniform")
    d, c = default_configs(plan.target.deepep, 2)
    for bucket, t in zip(deepep["buckets"], [128, 1024, 4096]):
        assert "measured" not in bucket  # a model's answers are never filed as measurements
        modelled = bucket["modelled"]
        assert modelled["kept"] == "engine" and modelled["us"]["kept"] == pytest.approx(
            bench.measure(work, TunePoint(20, t, d, c)).objective(), rel=1e-3
        )
        assert bucket["search"]["note"].startswith("selected minima")
        assert (
            bucket["dispatch"]["num_max_nvl_chunked_send_tokens"] == d.nvl_send
        )  # chunk effects unfitted
    _no_measured_looking_claims(out, result.stderr)


def _no_measured_looking_claims(policy, tune_stderr: str) -> None:
    """A modelled policy's file, tune's summary, audit and both exports: nothing reads as measured."""
    text = policy.read_text()
    assert "ci95" not in text and "beyond_noise" not in text and "measured:" not in text
    summary = tune_stderr.split("num_sms", 1)[1]
    audit = run_cli("audit", str(policy))
    vllm = run_cli("export", str(policy), "--to", "vllm")
    sglang = run_cli("export", str(policy), "--to", "sglang", "--format", "launch")
    for out in (summary, audit.stdout, vllm.stdout, sglang.stdout):
        assert not [w for w in MEASURED_LOOKING if w in out], out
    assert "modelled" in audit.stdout and "modelled" in vllm.stdout and "modelled" in sglang.stdout
    assert "tuned dispatch/combine" not in vllm.stdout


def test_a_modelled_sm_change_is_kept_only_beyond_the_models_held_out_error(tmp_path):
    """At 4096 tokens the calibration measured 20 and 24 SMs. DeepSeek-V3's modelled gain there exceeds
    the model's held-out error (7.5 %); Qwen3-30B-A3B's does not (22.4 %, the 2048-hidden combine)."""
    runs = {}
    for model in ("DeepSeek-V3", "Qwen3-30B-A3B-FP8"):
        out = tmp_path / f"{model}.yaml"
        result = run_cli(
            "tune",
            "--model",
            model,
            "--ep-size",
            "2",
            "--tokens",
            "4096",
            "--storage",
            f"sqlite:///{tmp_path}/{model}.db",
            "-o",
            str(out),
        )
        assert result.returncode == 0, result.stderr
        runs[model] = (yaml.safe_load(out.read_text())["deepep"], out, result.stderr)
    deepseek, qwen = runs["DeepSeek-V3"][0], runs["Qwen3-30B-A3B-FP8"][0]
    ds = deepseek["buckets"][0]["modelled"]["chosen_vs_engine"]
    assert (
        deepseek["num_sms"] == 24
        and ds["speedup"] - 1 > ds["model_error"]
        and ds["claim"].startswith("faster beyond")
    )
    qw = qwen["buckets"][0]["modelled"]["chosen_vs_engine"]
    assert (
        qwen["num_sms"] == 20
        and 0 < qw["speedup"] - 1 < qw["model_error"]
        and "within" in qw["claim"]
    )
    assert "within it; the engine's default kept (modelled)" in qwen["provenance"]["why"]
    for _, out, stderr in runs.values():
        _no_measured_looking_claims(out, stderr)


def test_a_hidden_size_the_calibration_never_measured_is_extrapolated(tmp_path):
    out = tmp_path / "q.yaml"  # Qwen3-235B-A22B: hidden 4096, between the measured 2048 and 7168
    result = run_cli(
        "tune",
        "--model",
        "Qwen3-235B-A22B",
        "--ep-size",
        "2",
        "--storage",
        f"sqlite:///{tmp_path}/s.db",
        "-o",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    doc = yaml.safe_load(out.read_text())
    assert doc["deepep"]["provenance"]["source"] == "extrapolated"
    assert "hidden 4096 was never measured" in doc["deepep"]["provenance"]["note"]


def test_sm_counts_outside_the_calibration_are_never_tried_and_none_inside_is_extrapolated(
    tmp_path,
):
    out = tmp_path / "q.yaml"
    result = run_cli(
        "tune",
        "--model",
        "Qwen3-30B-A3B-FP8",
        "--ep-size",
        "2",
        "--sms",
        "64,96",
        "--storage",
        f"sqlite:///{tmp_path}/s.db",
        "-o",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    doc = yaml.safe_load(out.read_text())
    assert (
        doc["deepep"]["provenance"]["source"] == "extrapolated" and doc["deepep"]["num_sms"] == 20
    )


def test_the_gpu_regime_is_outside_a_calibration_timed_in_the_host_regime(tmp_path):
    out = tmp_path / "q.yaml"
    result = run_cli(
        "tune",
        "--model",
        "Qwen3-30B-A3B-FP8",
        "--ep-size",
        "2",
        "--regime",
        "gpu",
        "--storage",
        f"sqlite:///{tmp_path}/s.db",
        "-o",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    doc = yaml.safe_load(out.read_text())
    assert (
        doc["deepep"]["provenance"]["source"] == "extrapolated"
        and doc["deepep"]["regime"] == "gpu"
    )
    assert "host regime" in doc["deepep"]["provenance"]["note"]


class FlatBench(Bench):
    """A live-like bench where SM count and chunks make no difference: every time is 500 us +- noise."""

    name = "flat"

    def __init__(self, seed=0, sigma=0.08, sms_effect=0.0):
        self.rng, self.sigma, self.sms_effect = random.Random(seed), sigma, sms_effect

    def measure(self, workload, point):
        us = (
            500.0
            * (20 / point.num_sms) ** self.sms_effect
            * math.exp(self.rng.gauss(0, self.sigma))
        )
        return Measurement(us, us * 0.8, 100.0, "measured")


def _tune(bench, tmp_path, plan=None, **kw):
    options = TuneOptions(
        buckets=((1024, 1.0), (4096, 1.0)),
        trials=6,
        sms=(20, 32, 48),
        storage=f"sqlite:///{tmp_path}/s.db",
        **kw,
    )
    return tune_plan(plan or qwen_plan(), bench, options, load_space(), load_objective())


def test_where_nothing_beats_the_engine_beyond_noise_the_engine_default_is_kept(tmp_path):
    result = _tune(FlatBench(seed=4), tmp_path)
    deepep = policy_document(result)["deepep"]
    assert deepep["num_sms"] == 20 and "the engine's default kept" in deepep["provenance"]["why"]
    for bucket in deepep["buckets"]:
        measured = bucket["measured"]
        assert measured["kept"] == "engine" and measured["report"]["rounds"] == 15
        # the report rounds record the engine's default's own times, and claim nothing against it
        assert (
            measured["report"]["vs_engine"] is None
            and measured["report"]["median_us"]["engine"] > 0
        )
        assert bucket["dispatch"]["num_max_nvl_chunked_send_tokens"] == 24  # DeepEP's EP2 table
        assert bucket["search"]["note"].startswith("selected minima")
    assert deepep["provenance"]["protocol"]["rounds"] == 15
    assert "search" in deepep["provenance"] and "scan" not in deepep["provenance"]


def test_a_real_sm_gain_is_kept_with_its_interval_from_the_report_rounds(tmp_path):
    result = _tune(FlatBench(seed=5, sigma=0.03, sms_effect=1.0), tmp_path)  # time falls as 1/SMs
    deepep = policy_document(result)["deepep"]
    assert deepep["num_sms"] == 48
    assert deepep["provenance"]["protocol"]["gate"]["sms"]["verdict"] == "faster"
    for bucket in deepep["buckets"]:
        engine = bucket["measured"]["report"]["vs_engine"]
        assert engine["rounds_from"] == "report" and engine["ci95"][0] > 1.0
        assert "verdict" not in engine  # a figure: what decided is under gate, without a figure
        assert engine["speedup"] == pytest.approx(
            (500 + 100) / (500 * 20 / 48 + 100), rel=0.05
        )  # dispatch + combine
        assert bucket["measured"]["num_sms"] == 48 and bucket["search"]["num_sms"] == 48


def test_the_protocol_refuses_too_few_rounds_on_a_noisy_bench(tmp_path):
    from moepolicy.errors import UsageError

    with pytest.raises(
        UsageError, match=r"confirm_rounds \(--confirm-rounds\) must be .* at least 9"
    ):
        _tune(FlatBench(), tmp_path, confirm_rounds=6)


def test_progress_events_count_the_search_and_the_re_measurement(tmp_path):
    import logging

    events = []

    class Recorder(logging.Handler):
        def emit(self, record):
            events.append(
                (
                    getattr(record, "phase", None),
                    getattr(record, "total", None),
                    getattr(record, "advance", 0),
                )
            )

    logger = logging.getLogger("moepolicy.tuning.progress")
    handler = Recorder()
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        # DeepGEMM experts: block fp8 quantized first, the wire both orders are timed for
        _tune(
            FlatBench(seed=5, sigma=0.03, sms_effect=1.0),
            tmp_path,
            plan=qwen_plan(expert_kernel="deepgemm"),
        )
    finally:
        logger.removeHandler(handler)
    phases = [(i, name, total) for i, (name, total, _) in enumerate(events) if name]
    names = [name for _, name, _ in phases]
    # the orders phase starts too (fp8 payload), and ends at its first measurement: this bench times no orders
    assert names == ["search", "select", "gate", "report", "orders (gate)"]
    (start, _, total), (second, _, _) = phases[:2]
    assert total == 3 * 2 * 6  # SM counts x buckets x trials: each trial counted once
    assert sum(step for _, _, step in events[start + 1 : second]) == total
    for (i, _, total), (j, _, _) in zip(phases[1:-1], phases[2:]):
        assert (
            sum(step for _, _, step in events[i + 1 : j]) == total
        )  # every protocol measurement counted


def test_per_trial_lines_only_with_verbose(tmp_path):
    args = (
        "tune",
        "--model",
        "Qwen3-30B-A3B-FP8",
        "--ep-size",
        "2",
        "--sms",
        "20",
        "--tokens",
        "1024",
        "--trials",
        "3",
        "--storage",
        f"sqlite:///{tmp_path}/s.db",
    )
    quiet = run_cli(*args, "-o", str(tmp_path / "a.yaml"))
    loud = run_cli(*args, "--study", "v", "-o", str(tmp_path / "b.yaml"), "--verbose")
    assert quiet.returncode == loud.returncode == 0, quiet.stderr + loud.stderr
    assert "trial 1/3" not in quiet.stderr and "trial 1/3" in loud.stderr
