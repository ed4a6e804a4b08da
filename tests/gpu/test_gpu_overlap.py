"""Overlapped measurement: DeepEP on c SMs beside the experts' GEMM on the others (held by its grid,
as serving runs it), in both launch orders. With a GPU per rank the timings' relations are checked;
where the 2 ranks share one GPU (its SMs are split between two ranks' DeepEP and GEMMs) only that
every part is measured and reported."""

import pytest

from gpu_support import gpu_here, require, shared

pytestmark = pytest.mark.gpu


def test_overlap_measurement_is_consistent():
    require(1, need_deep_ep=True)
    pytest.importorskip("optuna")
    from moepolicy.measure.overlapped_step import GemmShape
    from moepolicy.tuning.bench import TunePoint, Workload
    from moepolicy.tuning.live_bench import LiveBench

    bench = LiveBench(2, 1 << 30, reps=5)
    try:
        r = bench.measure_overlap(
            Workload(7168, 256, 8, 2, "fp8"),
            TunePoint(20, 1024, (24, 256, 6, 132), (10, 256, 6, 132)),
            GemmShape(rows=8192, hidden=7168, out=4096),
        )
    finally:
        bench.close()
    assert r["comm_sms"] == 20 and r["gemm_sms"] == 112
    assert r["timing"].endswith(
        "slowest rank per repetition"
    )  # an EP step ends when its last rank does
    import torch

    if torch.cuda.get_device_capability(0) == (9, 0):
        # the experts' GEMM is the fp8 block-scaled persistent grouped kind, one group per local expert with
        # DeepEP's row counts, held by its grid only (GemmShape's defaults, as serving runs it)
        assert r["gemm_kind"].startswith("fp8 block-128 persistent grouped GEMM"), (
            r["gemm_kind"],
            r.get("gemm_fallback"),
        )
        assert "128 local experts" in r["gemm_kind"] and "grid only" in r["gemm_kind"]
    for side in ("overlapped_comm_end", "overlapped_gemm_end"):
        assert r[side]["median_us"] <= r["overlapped"]["max_us"] + 1e-6
    for side in (
        "comm_first_comm_end",
        "comm_first_gemm_end",
    ):  # the other launch order, timed alike
        assert r[side]["median_us"] <= r["overlapped_comm_first"]["max_us"] + 1e-6
    for side in (
        "comm_first_no_wait_comm_end",
        "comm_first_no_wait_gemm_end",
    ):  # and without the host wait
        assert r[side]["median_us"] <= r["overlapped_comm_first_no_wait"]["max_us"] + 1e-6
    assert r["comm_no_wait"]["median_us"] > 0
    from moepolicy.measure.overlapped_step import deepep_waited

    assert r["deepep_waited_for_gemm"] == deepep_waited(
        r["comm"]["median_us"],
        r["overlapped_comm_end"]["median_us"],
        r["overlapped_gemm_end"]["median_us"],
    )
    for part in ("comm", "gemm", "serial", "overlapped"):
        assert (
            r[part]["median_us"] > 0
            and r[part]["min_us"] <= r[part]["median_us"] <= r[part]["max_us"]
        )
    if shared(2):
        return  # ranks on one GPU: the relations below are about a GPU per rank
    assert (
        r["overlapped"]["median_us"] >= 0.9 * r["floor_us"]
    )  # cannot beat the slower side by much
    assert r["overlapped"]["median_us"] <= 1.5 * r["serial"]["median_us"]


def test_deepep_runs_beside_a_clustered_gemm():
    """DeepEP launches cooperatively in 2-CTA clusters. Beside the experts' GEMM launched first in
    2-CTA clusters too, it ran beside the GEMM in every measurement on H200 (2026-11-30), instead of
    waiting for it as it often does beside the unclustered kernel. Where the ranks share a GPU, only
    that the clustered GEMM runs beside DeepEP and both are timed."""
    require(1, need_deep_ep=True)
    pytest.importorskip("optuna")
    import torch

    from moepolicy.measure.overlapped_step import GemmShape
    from moepolicy.tuning.bench import TunePoint, Workload
    from moepolicy.tuning.live_bench import LiveBench

    if torch.cuda.get_device_capability(0) != (9, 0):
        pytest.skip("checked on SM90")
    bench = LiveBench(2, 1 << 30, reps=5)
    try:
        r = bench.measure_overlap(
            Workload(7168, 256, 8, 2, "fp8"),
            TunePoint(20, 1024, (24, 256, 6, 132), (10, 256, 6, 132)),
            GemmShape(rows=8192, hidden=7168, out=4096, kind="persistent-clustered"),
        )
    finally:
        bench.close()
    assert "2-CTA clusters" in r["gemm_kind"], (r["gemm_kind"], r.get("gemm_fallback"))
    assert r["overlapped_comm_end"]["median_us"] > 0 and r["overlapped_gemm_end"]["median_us"] > 0
    if shared(2):
        return
    assert not r["deepep_waited_for_gemm"]
    assert r["overlapped_comm_end"]["median_us"] < 0.5 * r["overlapped_gemm_end"]["median_us"]


def test_measure_overlap_times_both_sides_on_one_gpu():
    """The overlapped measurement itself, on one GPU: a memory-bound stand-in for the communication
    on the current stream beside the experts' GEMM confined to the other SMs."""
    require(1)
    import torch

    from moepolicy.measure.overlapped_step import (
        ConfinedGemm,
        ExpertGemm,
        GemmShape,
        measure_overlap,
    )
    from moepolicy.measure.timing import Timer

    device = torch.device("cuda", 0)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    gemm = ConfinedGemm(
        ExpertGemm(GemmShape(rows=4096, hidden=2048, out=1536), device, [512] * 8), sms - 24
    )
    x = torch.ones(64 << 20, device=device)

    def comm():
        x.mul_(1.0)  # one pass over 256 MiB: a bandwidth-bound kernel on every free SM

    r = measure_overlap(comm, gemm, 5, Timer(device, collective=False), comm_no_wait=comm)
    for part in (
        "comm",
        "comm_no_wait",
        "gemm",
        "serial",
        "overlapped",
        "overlapped_comm_first",
        "overlapped_comm_first_no_wait",
    ):
        assert 0 < r[part]["min_us"] <= r[part]["median_us"] <= r[part]["max_us"], part
    assert r["serial"]["median_us"] >= max(r["comm"]["median_us"], r["gemm"]["median_us"])
    assert r["floor_us"] == max(r["comm"]["median_us"], r["gemm"]["median_us"])
    for prefix in ("overlapped", "comm_first", "comm_first_no_wait"):
        name = prefix if prefix == "overlapped" else f"overlapped_{prefix}"
        assert (
            max(r[f"{prefix}_comm_end"]["median_us"], r[f"{prefix}_gemm_end"]["median_us"])
            <= r[name]["max_us"] + 1e-6
        )
    assert r["timing"].startswith("queued") and isinstance(r["deepep_waited_for_gemm"], bool)


def test_an_overlap_tune_keeps_a_split_and_its_closing_line_says_so(tmp_path):
    """``tune --overlap`` end to end at EP 2 (ranks sharing the GPU where one is visible)."""
    require(1, need_deep_ep=True)
    pytest.importorskip("optuna")
    import yaml

    from gpu_support import moepolicy_cli, ranks_env

    env, shared = ranks_env(2)
    out = tmp_path / "p.yaml"
    args = ["tune", "--model", "Qwen3-30B-A3B-FP8", "--ep-size", 2, "--gpu", gpu_here()]
    args += ["--bench", "live", "--overlap", "--sms", "20,32", "--tokens", "1024", "--trials", 2]
    args += ["--confirm-rounds", 9, "--storage", f"sqlite:///{tmp_path}/s.db", "-o", out]
    done = moepolicy_cli(args, env, 2)
    assert done.returncode == 0, done.stderr[-3000:]
    overlap = yaml.safe_load(out.read_text())["deepep"]["overlap"]
    assert overlap["comm_sms"] in (20, 32) and set(overlap["splits_us"]) == {20, 32}
    closing = next(line for line in done.stderr.splitlines() if line.startswith("this policy "))
    assert "beside the experts' GEMM" in closing and "default configs" not in closing
    assert ("functional only" in done.stderr) == shared
