"""The expert stage with DeepGEMM's grouped GEMMs against a float32 torch reference, on a GPU."""

import pytest

from gpu_support import gpu_here, require

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def small():
    require(1)
    import torch

    from moepolicy.measure import expert_stage as es
    from moepolicy.measure.routing import ExpertShape, rank_view

    dg, where = es.find_deep_gemm()
    if dg is None:
        pytest.skip(where)
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the DeepGEMM stage is measured on Hopper (sm90)")
    shape = ExpertShape(hidden=512, intermediate=256, experts=16, top_k=4, ep_size=2)
    experts = es.DeepGemmExperts(shape, torch.device("cuda", 0), seed=3)
    return es, experts, experts.inputs(rank_view(shape, 96, seed=5), seed=5)


def test_deepgemm_stage_matches_the_float32_reference(small):
    es, experts, inp = small
    got = experts.run(inp.rows_fp8, inp.rows_scale, inp).float()
    want = es.reference_stage(experts, inp)
    assert got.shape == want.shape == inp.rows_bf16.shape
    # the activation's second 1x128 fp8 quantization is the only rounding the reference skips
    assert es.closeness_diff(got, want) < 2e-3
    shuffled = got[:, __import__("torch").randperm(got.shape[1], device=got.device)]
    assert es.closeness_diff(shuffled, want) > 0.5  # the measure tells wrong answers apart


def test_both_orders_feed_the_experts_the_same_bits(small):
    """Quantizing the sent tokens and quantizing the received rows is the same 1x128 quantization of
    the same rows: the stage's output is bit-identical (the orders' numerics are exact)."""
    import torch

    es, experts, inp = small
    arms = es.step_arms(experts, inp)
    assert torch.equal(arms["quant_then_dispatch"](), arms["dispatch_then_quant"]())


def test_the_stage_makes_no_host_sync(small):
    """Like vLLM's experts, the stage never waits on the host: the rows per expert are the counts
    DeepEP's dispatch handed the host."""
    import torch

    es, experts, inp = small
    arms = es.step_arms(experts, inp)
    arms["quant_then_dispatch"]()  # compiled and launched once before the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for fn in arms.values():
            fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def test_balanced_rounds_time_every_arm(small):
    import torch

    es, experts, inp = small
    times = es.time_arms(
        es.step_arms(experts, inp), rounds=3, reps=3, mode="synced", device=torch.device("cuda", 0)
    )
    assert sorted(times) == ["dispatch_then_quant", "quant_then_dispatch"]
    assert all(len(xs) == 3 and all(x > 0 for x in xs) for xs in times.values())


def test_a_live_comparison_decides_the_orders_from_measured_rounds(small):
    """The live expert bench on this GPU through the choice: both orders timed in balanced rounds,
    a gate's rounds deciding and a report's giving the figures; the engine's pick (FlashInfer, not
    timed here) is never claimed against."""
    from moepolicy.measure.routing import ExpertShape
    from moepolicy.names import UNMEASURED
    from moepolicy.tuning.expert_bench import LiveExpertBench
    from moepolicy.tuning.expert_choice import ChoiceInputs, choose_experts

    shape = ExpertShape(hidden=2048, intermediate=768, experts=128, top_k=8, ep_size=8)
    inputs = ChoiceInputs(
        shape,
        ((512, 1.0), (4096, 1.0)),
        "flashinfer_cutlass",
        ("flashinfer_cutlass", "deepgemm"),
        rounds=12,
    )
    choice = choose_experts(inputs, LiveExpertBench("gpu", reps=5), lambda tokens, wire: None)
    assert choice.source == "measured" and choice.rounds == 12
    assert choice.faster_kernel == UNMEASURED and "was not measured here" in choice.why
    timings = choice.orders_for("deepgemm")
    assert [t.tokens for t in timings] == [512, 4096]
    assert all(t.rounds == 12 and t.ci95 is not None for t in timings)
    # quantizing the 4096 sent tokens costs less than quantizing the ~3x as many rows received
    big = [a for tokens, arms in choice.arms if tokens == 4096 for a in arms]
    qtd = next(a.compute_us for a in big if a.order == "quant_then_dispatch")
    dtq = next(a.compute_us for a in big if a.order == "dispatch_then_quant")
    assert qtd < dtq * 1.05


def test_tune_live_on_one_gpu_measures_the_expert_stage_and_models_deepep(tmp_path):
    """``tune --bench live`` on one GPU: the expert stage measured here, DeepEP's half modelled
    (labelled), and with DeepGEMM asked for the layers' order comes from the measured step."""
    import subprocess
    import sys

    require(1)
    from moepolicy.document.reader import read_policy

    out = tmp_path / "p.yaml"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "moepolicy",
            "tune",
            "--model",
            "Qwen3-30B-A3B-FP8",
            "--ep-size",
            "2",
            "--gpu",
            gpu_here(),
            "--bench",
            "live",
            "--expert-kernel",
            "deepgemm",
            "--tokens",
            "1024,4096",
            "--trials",
            "2",
            "--storage",
            f"sqlite:///{tmp_path}/s.db",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr
    assert "the expert stage is measured live on this GPU" in done.stderr
    doc = read_policy(out).doc
    assert doc.experts.source == "measured" and doc.experts.kernel == "deepgemm"
    # the model bench is calibrated on H200 at EP 2 only: elsewhere DeepEP's half is extrapolated and
    # the expert comparison says it has no communication figure (compute only)
    calibrated = gpu_here() == "h200"
    assert doc.deepep.provenance.source == ("modelled" if calibrated else "extrapolated")
    words = "communication modelled" if calibrated else "no communication figure for this target"
    assert words in doc.experts.basis
    assert len(doc.experts.orders) == 2


def test_bench_stage_on_received_rows_is_the_stage(small):
    """What ``moepolicy bench`` runs between dispatch and combine (``ReceivedRowsStage``, called with
    DeepEP's outputs) gives the stage's own bits: on fp8 rows with their scales, and on bf16 rows,
    which it quantizes 1x128 itself as the experts do with bf16 on the wire; a second call (the
    layout kept per count tuple) makes no host sync."""
    import torch

    es, experts, inp = small
    stage = es.ReceivedRowsStage(experts)
    want = experts.run(inp.rows_fp8, inp.rows_scale, inp)
    counts = list(inp.per_expert)
    fp8 = stage(inp.rows_fp8, inp.rows_scale, inp.topk_local, inp.topk_weights, counts)
    bf16 = stage(inp.rows_bf16, None, inp.topk_local, inp.topk_weights, counts)
    assert torch.equal(fp8, want) and torch.equal(bf16, want)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        stage(inp.rows_bf16, None, inp.topk_local, inp.topk_weights, counts)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    nothing = stage(
        inp.rows_fp8, inp.rows_scale, inp.topk_local, inp.topk_weights, [0] * len(counts)
    )
    assert nothing.shape == want.shape and not nothing.any()
