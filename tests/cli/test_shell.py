"""The CLI is a shell over the library: ``plan`` and ``tune`` read the checkpoint once and decide the
layers no more often than the library does (issue 45, item 2)."""

from __future__ import annotations

import contextlib
import io
from collections import Counter

import pytest

import moepolicy.checkpoint.source as source
import moepolicy.planner as planner
from moepolicy.cli.main import main

MODEL = ["--model", "Qwen3-30B-A3B-FP8", "--gpu", "h200", "--ep-size", "2"]
LAYERS = 48  # Qwen3-30B-A3B's decoder layers, every one MoE


@pytest.fixture
def calls(monkeypatch):
    """How often a command read a checkpoint (``source._resolve``) and decided a layer
    (``planner.decide_layer``): spies around the real functions."""
    counted: Counter[str] = Counter()
    for module, name in ((source, "_resolve"), (planner, "decide_layer")):
        real = getattr(module, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            counted[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)
    return counted


def _run(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    return code, err.getvalue()


def test_plan_reads_the_checkpoint_once(tmp_path, calls):
    code, err = _run(["plan", *MODEL, "-o", str(tmp_path / "p.yaml")])
    assert code == 0, err
    assert "this policy" in err  # the closing comparison with vLLM's own choice ran
    assert calls["_resolve"] == 1  # before: twice (the plan, then the weights' fit warning)
    assert calls["decide_layer"] == 2 * LAYERS  # the policy's stack, then vLLM's for its line


def test_tune_reads_the_checkpoint_once_and_decides_the_tuned_plan_once(tmp_path, calls):
    pytest.importorskip("optuna")
    storage = f"sqlite:///{tmp_path}/s.db"
    argv = ["tune", *MODEL, "--bench", "model", "--tokens", "1024", "--storage", storage]
    code, err = _run([*argv, "-o", str(tmp_path / "t.yaml")])
    assert code == 0, err
    assert "this policy" in err and (tmp_path / "t.yaml").is_file()
    assert calls["_resolve"] == 1  # before: twice
    # the plan, vLLM's own for the closing line, and once again with what the tune measured
    # (before: four times: the document and the closing line each decided the tuned plan again)
    assert calls["decide_layer"] == 3 * LAYERS
