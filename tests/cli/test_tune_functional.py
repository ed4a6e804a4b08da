"""A functional tune (the test-only switch: EP ranks sharing a GPU) shows what ran end to end and
what it kept, never a time or a speed-up, and its closing line says the policy is not for serving:
the runtime serves DeepEP's defaults for it. The same tune with a GPU per rank shows its table."""

import re

import pytest
import yaml

from conftest import run_cli
from moepolicy.measure.placement import SHARED_LABEL
from moepolicy.tuning.bench_source import SHARED_RANKS_ENV


def _live_tune(tmp_path, shared: bool):
    out = tmp_path / "policy.yaml"
    done = run_cli(
        "tune",
        "--model",
        "Qwen3-30B-A3B-FP8",
        "--ep-size",
        "2",
        "--gpu",
        "h200",
        "--bench",
        "live",
        "--sms",
        "20,24",
        "--tokens",
        "512,4096",
        "--trials",
        "2",
        "--confirm-rounds",
        "9",
        "--storage",
        f"sqlite:///{tmp_path}/s.db",
        "-o",
        str(out),
        env={SHARED_RANKS_ENV: "1" if shared else "0"},
        fake_deepep=2,
    )
    assert done.returncode == 0, done.stderr
    return done.stderr, yaml.safe_load(out.read_text())


def _deepep_lines(stderr: str) -> tuple[str, str]:
    """What the tune prints of DeepEP once its search is done: from the protocol's re-measuring to
    the summary's first lines (the table, or the plumbing line), and the closing line (what the
    policy changes against vLLM). The expert kernels' section between them is the expert stage's,
    timed on one GPU or modelled (labelled), and not DeepEP's."""
    lines = stderr.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("re-measuring"))
    first = next(i for i, line in enumerate(lines) if re.match(r"plumbing ok|num_sms ", line))
    closing = next(line for line in lines if line.startswith("this policy "))
    return "\n".join(lines[start : first + 3]), closing


# a time, a speed-up or a test's p-value, as the summary of a measured tune prints them
FIGURES = re.compile(r"\d us\b|\bus\b|x\d+\.\d+ (faster|slower)|\bp \d")


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "gpu-per-rank"])
def test_a_functional_tune_shows_no_time_and_is_not_served(tmp_path, shared):
    stderr, doc = _live_tune(tmp_path, shared)
    summary, closing = _deepep_lines(stderr)
    if shared:
        assert f"{SHARED_LABEL}:" in stderr
        assert "plumbing ok: the search, then the selection, gate and report rounds ran" in summary
        assert f"kept {doc['deepep']['num_sms']} SMs: T=512 " in summary
        assert not FIGURES.search(summary) and not FIGURES.search(closing), summary + closing
        assert (
            "DeepEP: a functional run, not for serving (load_policy serves DeepEP's defaults)"
            in closing
        )
        assert "functional run" in doc["deepep"]["partial"]["reason"]
    else:  # the contrast: a GPU per rank (here fake DeepEP workers) prints the report rounds' table
        assert SHARED_LABEL not in stderr
        assert FIGURES.search(summary) and "kept us" in summary, summary
        assert "functional" not in closing and doc["deepep"].get("partial") is None
