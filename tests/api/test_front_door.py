"""The library's front door (moepolicy.plan / tune / write_policy / load_policy) against the CLI."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from conftest import run_cli

import moepolicy
from moepolicy.errors import MoePolicyError, UsageError

MODEL = "Qwen3-30B-A3B-FP8"


def test_import_stays_light_and_lists_the_front_door():
    code = (
        "import sys, moepolicy; heavy = [m for m in ('moepolicy.planner', 'optuna', 'torch', 'pydantic') "
        "if m in sys.modules]; print(heavy); print(sorted(moepolicy.__all__))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out[0] == "[]"
    for name in ("plan", "tune", "write_policy", "load_policy", "TargetSpec"):
        assert name in out[1]
        assert callable(getattr(moepolicy, name))


def test_plan_and_write_match_the_cli(tmp_path):
    target = moepolicy.TargetSpec(gpu="h200", ep_size=8, deep_ep_version="1.2.1")
    plan = moepolicy.plan(MODEL, target)
    written = moepolicy.write_policy(plan, tmp_path / "api.yaml")
    cli = run_cli(
        "plan",
        "--model",
        MODEL,
        "--gpu",
        "h200",
        "--ep-size",
        "8",
        "--deep-ep-version",
        "1.2.1",
        "-o",
        str(tmp_path / "cli.yaml"),
    )
    assert cli.returncode == 0, cli.stderr
    from_cli = yaml.safe_load((tmp_path / "cli.yaml").read_text())
    assert (
        yaml.safe_load((tmp_path / "api.yaml").read_text())["key"]
        == from_cli["key"]
        == written["key"]
    )
    policy = moepolicy.load_policy(tmp_path / "api.yaml", ep_size=8)
    assert not policy.is_fallback and policy.num_layers == len(plan.layers)


def test_tune_on_the_model_bench_writes_a_policy_the_runtime_applies(tmp_path):
    pytest.importorskip("optuna")
    plan = moepolicy.plan(MODEL, moepolicy.TargetSpec(gpu="h200", ep_size=2))
    result = moepolicy.tune(
        plan, bench="model", tokens=[128, 1024], trials=1, storage=f"sqlite:///{tmp_path}/s.db"
    )
    doc = moepolicy.write_policy(result, tmp_path / "tuned.json")
    assert [b["max_tokens"] for b in doc["deepep"]["buckets"]][:1] == [128]
    policy = moepolicy.load_policy(tmp_path / "tuned.json", ep_size=2)
    assert not policy.is_fallback and policy.deepep.num_sms == doc["deepep"]["num_sms"]


def test_errors_are_one_line_library_errors():
    with pytest.raises(MoePolicyError):
        moepolicy.plan("no-such/model-anywhere-xyz", moepolicy.TargetSpec(gpu="h200", ep_size=2))
    plan = moepolicy.plan(MODEL, moepolicy.TargetSpec(gpu="h200", ep_size=2))
    with pytest.raises(UsageError, match="bench"):
        moepolicy.tune(plan, bench="fast")
    with pytest.raises(UsageError, match="positive"):
        moepolicy.tune(plan, bench="model", tokens=[0, 128])
