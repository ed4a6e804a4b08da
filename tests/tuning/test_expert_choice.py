"""The expert-kernel choice (tuning.expert_choice) against benches of known times: a faster kernel
wins beyond noise, equal kernels keep the engine's pick, an unmeasured engine pick is never claimed
against, orders follow the step (compute + communication), figures come from rounds that decided
nothing, and the recorded H200 campaign answers only where it recorded."""

import pytest

from moepolicy.measure.routing import ExpertShape
from moepolicy.names import UNMEASURED
from moepolicy.testing.fakes import KnownExpertBench
from moepolicy.tuning.expert_bench import RecordedExpertBench
from moepolicy.tuning.expert_choice import (
    ChoiceInputs,
    Communication,
    choose_experts,
)

SHAPE = ExpertShape(7168, 2048, 256, 8, 2, (8, 4))
BUCKETS = ((512, 1.0), (4096, 1.0))
QTD, DTQ, FI = (
    "deepgemm/quant_then_dispatch",
    "deepgemm/dispatch_then_quant",
    ("flashinfer_cutlass/no_quant"),
)


def comm(fp8_us=200.0, bf16_us=350.0, combine_us=400.0, error=0.1):
    def of(tokens, wire):
        return Communication(fp8_us if wire == "fp8" else bf16_us, combine_us, error)

    return of


def no_comm(tokens, wire):
    return None


def inputs(default="flashinfer_cutlass", rounds=16, seed=0):
    return ChoiceInputs(
        SHAPE,
        BUCKETS,
        default,
        ("flashinfer_cutlass", "deepgemm"),
        rounds=rounds,
        communication_words="modelled (test)",
        seed=seed,
    )


def known(qtd, dtq, fi, **kw):
    return KnownExpertBench(
        {(a, t): us for t in (512, 4096) for a, us in ((QTD, qtd), (DTQ, dtq), (FI, fi))}, **kw
    )


def test_a_kernel_faster_beyond_noise_replaces_the_engines_pick():
    bench = known(1000, 1100, 1600, sigma=0.03, runs=("deepgemm", "flashinfer_cutlass"))
    choice = choose_experts(inputs(), bench, comm())
    assert choice.faster_kernel == "deepgemm", choice.why
    overall = [t for t in choice.tests if t.tokens == 0][0]
    assert overall.verdict == "faster" and overall.speedup > 1.2


def test_equal_kernels_keep_the_engines_pick():
    # the same step: deepgemm's faster order (fp8 wire) costs what flashinfer's bf16 step costs
    bench = known(1150, 1200, 1000, sigma=0.03, runs=("deepgemm", "flashinfer_cutlass"))
    choice = choose_experts(inputs(), bench, comm())
    assert choice.faster_kernel == UNMEASURED, choice.tests


def test_a_kernel_slower_at_one_bucket_does_not_replace_the_engines_pick():
    true = {(QTD, 512): 1000, (DTQ, 512): 1100, (FI, 512): 1600}
    true.update({(QTD, 4096): 3000, (DTQ, 4096): 3100, (FI, 4096): 2000})
    bench = KnownExpertBench(true, sigma=0.02, runs=("deepgemm", "flashinfer_cutlass"))
    choice = choose_experts(inputs(), bench, comm())
    assert choice.faster_kernel == UNMEASURED
    # the weighted gain first (here the selection already found no gain over the engine's pick);
    # only where it passes are the buckets tested for a loss
    overall = [t for t in choice.tests if t.tokens == 0]
    assert (
        not overall
        or overall[0].verdict != "faster"
        or any(t.tokens == 4096 and t.verdict == "slower" for t in choice.tests)
    )


def test_an_engine_pick_that_was_not_measured_is_never_claimed_against():
    bench = known(1000, 1100, 5000, sigma=0.03, runs=("deepgemm",))
    choice = choose_experts(inputs(), bench, comm())
    assert choice.faster_kernel == UNMEASURED
    assert "flashinfer_cutlass (the engine's pick) was not measured here" in choice.why
    assert [s.kernel for s in choice.kernels if not s.runs] == ["flashinfer_cutlass"]


def test_quantizing_first_wins_where_its_step_is_faster_beyond_the_models_error():
    # equal compute; fp8 on the wire 150 us cheaper per dispatch than bf16, model error 10 %
    bench = known(1000, 1000, 1600, sigma=0.02)
    choice = choose_experts(inputs(), bench, comm())
    timings = choice.orders_for("deepgemm")
    assert [t.verdict for t in timings] == ["quant_then_dispatch"] * 2
    assert all(t.rounds == 16 and t.speedup > 1.0 for t in timings)  # report rounds, per phase


def test_an_order_inside_the_communication_models_error_is_not_claimed():
    # 20 us cheaper on the wire, but the model's error (10 % of ~600 us) is larger
    bench = known(1000, 1000, 1600, sigma=0.02)
    choice = choose_experts(inputs(), bench, comm(fp8_us=330.0))
    assert {t.verdict for t in choice.orders_for("deepgemm")} == {UNMEASURED}


def test_without_communication_only_quantizing_first_can_be_claimed():
    faster_first = choose_experts(inputs(), known(1000, 1200, 1600, sigma=0.02), no_comm)
    assert {t.verdict for t in faster_first.orders_for("deepgemm")} == {"quant_then_dispatch"}
    assert "compute only" in faster_first.orders_for("deepgemm")[0].basis
    # the receiver's quantization faster in compute: its bf16 wire is twice the bytes, unknown here
    slower_first = choose_experts(inputs(), known(1200, 1000, 1600, sigma=0.02), no_comm)
    assert {t.verdict for t in slower_first.orders_for("deepgemm")} == {UNMEASURED}


class PhaseBench(KnownExpertBench):
    """Quantizing first is 30 % faster the first time a bucket is timed (the gate) and equal after
    (the report)."""

    seen: set = set()

    def times(self, shape, tokens, arms, rounds):
        got = super().times(shape, tokens, arms, rounds)
        if tokens not in self.seen:
            self.seen.add(tokens)
            got.per_round[QTD] = [x * 0.7 for x in got.per_round[QTD]]
        return got


def test_figures_come_from_the_report_rounds_not_the_rounds_that_decided():
    bench = PhaseBench(known(1000, 1000, 1600).true_us, sigma=0.01)
    bench.seen = set()
    choice = choose_experts(inputs(), bench, no_comm)
    for t in choice.orders_for("deepgemm"):
        assert t.verdict == "quant_then_dispatch"  # the gate rounds
        assert 0.97 < t.speedup < 1.03  # the report rounds: no gain
    assert choice.rounds == 16


def test_the_false_claim_rate_with_equal_kernels_is_at_most_the_tests_level():
    claims = 0
    for seed in range(60):
        bench = known(
            1150, 1200, 1000, sigma=0.08, seed=seed, runs=("deepgemm", "flashinfer_cutlass")
        )
        claims += choose_experts(inputs(seed=seed), bench, comm()).faster_kernel != UNMEASURED
    assert claims <= 3  # 2.5 % per side, Holm over the buckets: about 1.5 expected at most


def test_too_few_rounds_is_refused_in_one_line():
    with pytest.raises(ValueError, match="at least 9 rounds per phase"):
        choose_experts(inputs(rounds=8), known(1000, 1100, 1600), comm())


def test_the_recorded_campaign_answers_only_where_it_recorded():
    bench = RecordedExpertBench("h200", regime="gpu")
    assert bench.problem(SHAPE, 1024) is None
    assert "outside the recorded" in bench.problem(SHAPE, 8192)
    other = ExpertShape(4096, 1024, 64, 6, 2)
    assert "no cell" in bench.problem(other, 1024)
    exact = bench.times(SHAPE, 1024, [QTD, DTQ], 1)
    between = bench.times(SHAPE, 1500, [QTD, DTQ], 1)
    assert 0 < exact.error < 0.2 and between.error >= exact.error
    lo, hi = bench.times(SHAPE, 1024, [QTD], 1), bench.times(SHAPE, 2048, [QTD], 1)
    assert lo.per_round[QTD][0] < between.per_round[QTD][0] < hi.per_round[QTD][0]
    assert [s.runs for s in bench.kernels(["deepgemm", "flashinfer_cutlass"])] == [True, False]
    assert not RecordedExpertBench("b200").kernels(["deepgemm"])[0].runs


def test_a_modelled_choice_claims_only_beyond_its_error():
    bench = RecordedExpertBench("h200", regime="gpu")
    ins = ChoiceInputs(SHAPE, BUCKETS, "flashinfer_cutlass", ("flashinfer_cutlass", "deepgemm"))
    choice = choose_experts(ins, bench, comm())
    assert choice.source == "modelled" and choice.rounds == 0
    assert choice.faster_kernel == UNMEASURED  # flashinfer was never recorded
    # recorded at EP 2: quantizing first costs about what quantizing after does in compute, the
    # fp8 wire saves 150 us a dispatch against a 10 % model error on ~600-750 us: within error
    assert {t.verdict for t in choice.orders_for("deepgemm")} <= {
        UNMEASURED,
        "quant_then_dispatch",
    }


def _tune(tmp_path, *extra, expert_us, runs=("deepgemm",)):
    """``moepolicy tune`` in this process on the model bench, its expert stage of known times."""
    import contextlib
    import io

    from moepolicy.cli.main import main
    from moepolicy.testing.fakes import FakeBenchSource

    err = io.StringIO()
    args = [
        "tune",
        "--model",
        "DeepSeek-V3",
        "--ep-size",
        "2",
        "--gpu",
        "h200",
        "--bench",
        "model",
        "--tokens",
        "1024,4096",
        "--trials",
        "2",
        "--storage",
        f"sqlite:///{tmp_path}/s.db",
        "-o",
        str(tmp_path / "p.yaml"),
        *extra,
    ]
    source = FakeBenchSource(expert_us=expert_us, expert_runs=runs)
    with contextlib.redirect_stderr(err):
        code = main(args, bench_source=source)
    return code, err.getvalue()


def _times(qtd, dtq, fi):
    return {(a, t): us for t in (1024, 4096) for a, us in ((QTD, qtd), (DTQ, dtq), (FI, fi))}


def test_a_tune_with_a_measured_faster_kernel_writes_it_and_the_launch_builds_it(tmp_path):
    from conftest import run_cli

    from moepolicy.document.reader import read_policy

    code, err = _tune(
        tmp_path, expert_us=_times(1000, 1100, 1700), runs=("deepgemm", "flashinfer_cutlass")
    )
    assert code == 0, err
    doc = read_policy(tmp_path / "p.yaml").doc
    assert doc.experts.faster_kernel == "deepgemm" and doc.experts.source == "measured"
    assert doc.target.expert_kernel == "deepgemm"
    moe = [layer for layer in doc.layers if layer.kind == "moe"]
    assert all(layer.facts["kernel.name"] == "deepgemm" for layer in moe)
    assert {layer.order for layer in moe} == {"quant_then_dispatch"}
    assert "deepgemm experts where vLLM builds flashinfer_cutlass" in err
    assert "expert stage measured on this GPU, communication modelled" in err
    export = run_cli("export", str(tmp_path / "p.yaml"), "--to", "vllm")
    assert export.returncode == 0 and "VLLM_USE_DEEP_GEMM=1" in export.stdout, export.stderr
    explained = run_cli("explain", str(tmp_path / "p.yaml"), "--layer", "3")
    assert explained.returncode == 0 and "experts/measured-faster" in explained.stdout, (
        explained.stdout + explained.stderr
    )


def test_a_tune_whose_engine_pick_was_not_measured_keeps_it(tmp_path):
    from moepolicy.document.reader import read_policy

    code, err = _tune(tmp_path, expert_us=_times(1000, 1100, 9000))
    assert code == 0, err
    doc = read_policy(tmp_path / "p.yaml").doc
    assert doc.experts.faster_kernel == "unmeasured"
    assert doc.target.expert_kernel == "flashinfer_cutlass"
    assert "this policy matches vLLM's own choice" in err


def test_an_asked_kernel_takes_its_order_from_the_measured_step(tmp_path):
    from moepolicy.document.reader import read_policy

    # quantizing after dispatch is 25 % cheaper in compute: more than fp8's saving on the wire
    code, err = _tune(tmp_path, "--expert-kernel", "deepgemm", expert_us=_times(2000, 1500, 9000))
    assert code == 0, err
    doc = read_policy(tmp_path / "p.yaml").doc
    moe = [layer for layer in doc.layers if layer.kind == "moe"]
    assert {layer.order for layer in moe} == {"dispatch_then_quant"}, err
    assert all(layer.facts["measured.faster_order"] == "dispatch_then_quant" for layer in moe)
    assert all(layer.unmeasured is not None for layer in moe)  # the rules' choice without it
