"""Whether the weights fit (moepolicy.weights_memory): plan, tune and export say in one line when the
weights per rank exceed the GPU's memory from the GPU profile. The sizes are checked against the
published checkpoint sizes, not against the formulas."""

import pytest

from conftest import run_cli
from moepolicy.checkpoint.reader import facts_from_raw
from moepolicy.checkpoint.source import resolve
from moepolicy.datasheets import gpu_profile
from moepolicy.weights_memory import GIB, fit_warning_for, weight_bytes


def _model(name):
    raw = resolve(name, hub=False)
    return raw, facts_from_raw(raw)


@pytest.mark.parametrize(
    "name, low_gib, high_gib",
    [
        # the published safetensors, less the MTP layer (not loaded without speculative decoding) and, for
        # the trimmed catalog configs, the embeddings (no vocab_size): DeepSeek-V3 fp8 688 GB with MTP;
        # Qwen3-30B-A3B bf16 61 GB, FP8 31 GB; gpt-oss-120b (MXFP4 experts) 65 GB
        ("DeepSeek-V3", 590, 645),
        ("Qwen3-30B-A3B", 50, 57),
        ("Qwen3-30B-A3B-FP8", 25, 29),
        ("gpt-oss-120b", 52, 61),
    ],
)
def test_weight_bytes_match_the_published_checkpoint_sizes(name, low_gib, high_gib):
    raw, facts = _model(name)
    weights = weight_bytes(raw, facts)
    assert low_gib * GIB <= weights.experts + weights.other <= high_gib * GIB


def test_narrower_weights_take_fewer_bytes():
    sizes = [
        weight_bytes(*_model(name)).experts
        for name in ("Qwen3-30B-A3B", "Qwen3-30B-A3B-FP8", "Qwen3-30B-A3B-NVFP4")
    ]
    assert sizes[0] > sizes[1] > sizes[2]


def test_deepseek_v3_at_ep2_on_h200_does_not_fit_and_qwen3_fp8_does():
    raw, facts = _model("DeepSeek-V3")
    warning = fit_warning_for(raw, facts, "h200", 2)
    assert warning is not None and "routed experts alone" in warning and "EP 8 or more" in warning
    assert f"{gpu_profile('h200').memory_gib} GiB of one H200" in warning
    assert fit_warning_for(raw, facts, "h200", 8) is None
    assert fit_warning_for(*_model("Qwen3-30B-A3B-FP8"), "h200", 2) is None


def test_what_every_rank_holds_counts_too():
    """DeepSeek-V3 at EP 8 on H100: the experts (76 GiB per rank) fit 80 GiB, the whole does not."""
    raw, facts = _model("DeepSeek-V3")
    warning = fit_warning_for(raw, facts, "h100", 8)
    assert (
        warning is not None and "that every rank holds" in warning and "EP 16 or more" in warning
    )


def test_plan_tune_and_export_warn_in_one_line(tmp_path):
    policy = tmp_path / "d.yaml"
    planned = run_cli("plan", "--model", "DeepSeek-V3", "--ep-size", "2", "-o", str(policy))
    assert planned.returncode == 0
    assert [line for line in planned.stderr.splitlines() if "does not fit" in line][0].startswith(
        "warning: "
    )
    exported = run_cli("export", str(policy), "--to", "vllm")
    assert (
        exported.returncode == 0
        and "warning: deepseek-ai/DeepSeek-V3 does not fit" in exported.stderr
    )
    tuned = run_cli(
        "tune",
        "--model",
        "DeepSeek-V3",
        "--ep-size",
        "2",
        "--bench",
        "model",
        "--tokens",
        "128",
        "--storage",
        f"sqlite:///{tmp_path}/t.db",
        "-o",
        str(tmp_path / "t.yaml"),
    )
    assert tuned.returncode == 0, tuned.stderr
    assert sum("does not fit" in line for line in tuned.stderr.splitlines()) == 1


def test_a_model_that_fits_says_nothing(tmp_path):
    policy = tmp_path / "q.yaml"
    planned = run_cli("plan", "--model", "Qwen3-30B-A3B-FP8", "--ep-size", "2", "-o", str(policy))
    assert planned.returncode == 0 and "does not fit" not in planned.stderr
    exported = run_cli("export", str(policy), "--to", "sglang")
    assert exported.returncode == 0 and "does not fit" not in exported.stderr
