"""Which expert stage ``moepolicy bench`` runs (``moe_step.experts``): DeepGEMM's where it runs for
the policy, else a stand-in that is named and never compared. On CPU: the choice for real policies,
with DeepGEMM's availability (a fact of the machine) given both ways."""

import json

import pytest

from conftest import run_cli

from moepolicy.document.reader import read_policy
from moepolicy.moe_step import experts as bench_experts_module
from moepolicy.moe_step.arms import build_arms
from moepolicy.moe_step.experts import DEEPGEMM, STAND_IN, bench_experts
from moepolicy.schema.measured import KernelStatus

DEEPSEEK = "deepseek-ai/DeepSeek-V3"  # block fp8: DeepGEMM's stage takes it
MIXTRAL_FP8 = "amd/Mixtral-8x7B-Instruct-v0.1-FP8-KV"  # per-tensor fp8: it does not


def _plan(tmp_path, model: str, *flags: str):
    out = tmp_path / "p.yaml"
    done = run_cli(
        "plan", "--model", model, "--ep-size", "8", "--gpu", "h200", *flags, "-o", str(out)
    )
    assert done.returncode == 0, done.stderr
    doc = read_policy(out).doc
    return doc, build_arms(doc)


@pytest.fixture
def deepgemm_here(monkeypatch):
    """DeepGEMM importable on an SM90 card: what ``kernel_status`` reports on an H200 with it."""
    from moepolicy.measure import expert_stage

    def status(kernels):
        return tuple(
            KernelStatus(k, k == DEEPGEMM, "deep_gemm 2.8.1" if k == DEEPGEMM else "not here")
            for k in kernels
        )

    pytest.importorskip("torch", reason="the expert stage module needs torch")
    monkeypatch.setattr(expert_stage, "kernel_status", status)


def test_block_fp8_on_a_deepgemm_gpu_runs_deepgemms_stage_at_the_models_shapes(
    tmp_path, deepgemm_here
):
    doc, arms = _plan(tmp_path, DEEPSEEK, "--expert-kernel", "deepgemm")
    got = bench_experts(doc, arms, "deepep")
    assert got.stage == DEEPGEMM and got.comparable
    assert got.intermediate == 2048  # DeepSeek-V3's moe_intermediate_size, from its config
    assert "DeepGEMM's (deep_gemm 2.8.1" in got.what
    # vLLM's own pick for the vllm arm is FlashInfer CUTLASS: said, since DeepGEMM runs in its place
    assert "vllm arm(s) would run flashinfer_cutlass" in got.other_kernels
    assert "not expert kernels" in got.other_kernels


def test_a_policy_whose_own_kernel_is_the_engines_names_both_arms(tmp_path, deepgemm_here):
    doc, arms = _plan(tmp_path, DEEPSEEK)  # the engine's kernel: FlashInfer CUTLASS
    got = bench_experts(doc, arms, "deepep")
    assert got.stage == DEEPGEMM
    assert "policy, vllm, deepep-default arm(s) would run flashinfer_cutlass" in got.other_kernels


def test_a_wire_deepgemm_does_not_take_gets_the_named_stand_in(tmp_path, deepgemm_here):
    doc, arms = _plan(tmp_path, MIXTRAL_FP8)
    got = bench_experts(doc, arms, "deepep")
    assert got.stage == STAND_IN and not got.comparable
    assert got.what.startswith("the expert stage is a stand-in")
    assert "block-fp8 rows with float32 1x128 scales" in got.what


def test_without_deepgemm_the_stand_in_says_why(tmp_path, monkeypatch):
    pytest.importorskip("torch", reason="the expert stage module needs torch")
    doc, arms = _plan(tmp_path, DEEPSEEK, "--expert-kernel", "deepgemm")
    got = bench_experts(doc, arms, "deepep")  # this machine: no CUDA, no sm90 DeepGEMM
    assert got.stage == STAND_IN and not got.comparable
    assert "stand-in" in got.what and "DeepGEMM" in got.what


def test_a_model_whose_config_is_not_readable_gets_the_stand_in(tmp_path, deepgemm_here):
    doc, arms = _plan(tmp_path, DEEPSEEK, "--expert-kernel", "deepgemm")
    doc = doc.model_copy(update={"model": doc.model.model_copy(update={"name": "no-such/model"})})
    got = bench_experts(doc, arms, "deepep")
    assert got.stage == STAND_IN and "expert shapes are not readable here" in got.what


def test_the_emulated_transport_runs_the_stand_in_and_the_bench_says_so(tmp_path):
    pytest.importorskip("torch", reason="bench needs torch (the CPU build is enough)")
    policy = tmp_path / "m.yaml"
    assert (
        run_cli("plan", "--model", MIXTRAL_FP8, "--ep-size", "2", "-o", str(policy)).returncode
        == 0
    )
    out = tmp_path / "bench.json"
    done = run_cli(
        "bench", str(policy), "--tokens", "16", "--routing", "uniform", "--rounds", "2",
        "--reps", "1", "-o", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "experts: the expert stage is a stand-in" in done.stderr
    raw = json.loads(out.read_text())
    assert raw["spec"]["experts"] == STAND_IN and raw["comparison"] == []
    assert raw["experts"].startswith("the expert stage is a stand-in")


def test_the_stage_names_are_one_vocabulary():
    """The worker and the chooser read the same names (one home: moe_step.experts)."""
    pytest.importorskip("torch", reason="moe_step.measure needs torch")
    from moepolicy.moe_step import measure

    assert measure.DEEPGEMM is bench_experts_module.DEEPGEMM
    assert measure.StepSpec.__dataclass_fields__["experts"].default == STAND_IN
