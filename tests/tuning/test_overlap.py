"""`tune --overlap` coordination on CPUs: fake DeepEP workers answer overlapped measurements, the
search picks a split, compares it with vLLM's 20-SM split, and the policy and exports carry it."""

import json
import re

import pytest
import yaml

pytest.importorskip("optuna", reason="tuning needs optuna")

from conftest import run_cli  # noqa: E402


def test_overlap_tune_records_the_split_and_exports_it(tmp_path):
    out = tmp_path / "p.yaml"
    result = run_cli(
        "tune",
        "--model",
        "DeepSeek-V3",
        "--ep-size",
        "2",
        "--gpu",
        "h200",
        "--bench",
        "live",
        "--overlap",
        "--sms",
        "12,32,48",
        "--tokens",
        "1024,4096",
        "-o",
        str(out),
        "--storage",
        f"sqlite:///{tmp_path}/s.db",
        fake_deepep=2,
    )
    assert result.returncode == 0, result.stderr
    assert "fake DeepEP workers" in result.stderr.splitlines()[0]
    doc = yaml.safe_load(out.read_text())
    overlap = doc["deepep"]["overlap"]
    assert overlap["comm_sms"] == doc["deepep"]["num_sms"]
    assert set(overlap["splits_us"]) == {12, 20, 32, 48}  # vLLM's 20 is always measured beside
    chosen = min(overlap["splits_us"], key=overlap["splits_us"].get)
    assert overlap["comm_sms"] == chosen
    for bucket in doc["deepep"]["buckets"]:
        measured = bucket["measured"]
        assert measured["vllm_split_overlapped_us"] is not None
        assert measured["overlapped_us"] <= measured["vllm_split_overlapped_us"]
        assert measured["vs_floor"] >= 1.0
        # both launch orders are recorded, and that DeepEP, enqueued after the GEMM at vLLM's 20 SMs,
        # waited for it (the fake workers model what H200 showed at 24 SMs and fewer)
        assert (
            measured["comm_first_overlapped_us"]
            and measured["vllm_split_comm_first_overlapped_us"]
        )
        assert measured["vllm_split_deepep_waited_for_gemm_rounds"] == measured["rounds"]
        # the grid's lowest floor, beside vLLM's split: no split can beat it
        assert measured["best_floor_split"] in overlap["splits_us"]
        assert measured["best_floor_vs_vllm_split"] <= measured["vs_vllm_split"]
    assert "at vLLM's split DeepEP waited for the GEMM in 15 of 15 rounds" in result.stderr
    assert "bound: the grid's lowest floor is x" in result.stderr
    # the closing line says what the policy keeps of DeepEP: the split, never DeepEP's defaults
    closing = result.stderr.strip().splitlines()[-2]
    assert closing.startswith("this policy ") and "default configs" not in closing, closing
    assert f"DeepEP: {overlap['comm_sms']} SMs (vLLM runs 20) beside the experts' GEMM" in closing
    # the search's and the deciding rounds' figures are not printed (--log-level debug shows them):
    # what the summary says comes from the report rounds alone
    said = result.stderr.splitlines()
    assert not [line for line in said if re.match(r"\s+(round \d|joint \d|overlap c=)", line)]
    assert "overlap gate (fresh workers)" in said
    audit = run_cli("audit", str(out))
    assert audit.returncode == 0, audit.stderr
    first = doc["deepep"]["buckets"][0]["measured"]
    paired = first[
        "speedup_vs_vllm_split"
    ]  # the report rounds, paired per round, with the exact test
    assert first["rounds_from"] == "report" and paired["rounds"] == 15 and "verdict" not in paired
    assert paired["rounds_from"] == "report" and first["simultaneous_over"] == 2
    gate = doc["deepep"]["overlap"]["gate"]["test"]  # the decision's statistics: no figure
    assert gate["verdict"] == "faster" and "speedup" not in gate and gate["rounds_from"] == "gate"
    assert f"DeepEP: {overlap['comm_sms']} SMs" in audit.stdout
    assert (
        f"vs vLLM's split (20 SMs): {first['vllm_split_overlapped_us']} us {first['vllm_split_spread_us']}; "
        f"comm alone {first['vllm_split_comm_us']} us, GEMM alone {first['vllm_split_gemm_us']} us: "
        f"x{paired['speedup']:.3f} faster (95% CI x{paired['ci95'][0]:.3f}-x{paired['ci95'][1]:.3f} faster, "
        "simultaneous over 2 buckets, paired over 15 rounds)"
    ) in audit.stdout
    assert "medians of 15 report rounds (fresh workers; they decided nothing)" in audit.stdout
    bound = next(
        line for line in audit.stdout.splitlines() if "bound: the grid's lowest floor is" in line
    )
    assert " faster than vLLM's split" in bound
    gemm = next(
        line
        for line in audit.stdout.splitlines()
        if line.startswith(f"    GEMM alone on {first['gemm_sms']} SMs: x")
    )
    assert "than on vLLM's 112" in gemm and "if its time followed its SMs" in gemm
    assert "at vLLM's split DeepEP waited for the GEMM in 15 of 15 rounds" in audit.stdout
    comm_first = next(
        line for line in audit.stdout.splitlines() if line.startswith("    comm-first: ")
    )
    assert comm_first.endswith(
        "the GEMM launches only after the dispatch's host wait for its receive counts"
    )
    # the engines' order without the host wait (num_worst_tokens) is measured and shown beside it
    no_wait = next(
        line
        for line in audit.stdout.splitlines()
        if line.startswith("    comm-first, no host wait: ")
    )
    assert (
        f"{first['comm_first_no_wait_overlapped_us']} us vs vLLM's split "
        f"{first['vllm_split_comm_first_no_wait_overlapped_us']} us (x" in no_wait
    ) and "num_worst_tokens" in no_wait
    assert "faster, medians)" in no_wait or "slower, medians)" in no_wait
    # tune printed each bucket as audit renders it from the file: one renderer
    tune_lines = [line for line in result.stderr.splitlines() if line.startswith("    ")]
    audit_lines = [line for line in audit.stdout.splitlines() if line.startswith("    ")]
    assert audit_lines and audit_lines == tune_lines
    vllm = run_cli("export", str(out), "--to", "vllm", "--format", "json")
    assert vllm.returncode == 0, vllm.stderr
    exported = json.loads(vllm.stdout)
    # the plugin raises vLLM's manager cap to the policy's SMs, so the split applies above 20 too
    assert (
        exported["env"]["VLLM_DBO_COMM_SMS"] == str(overlap["comm_sms"])
        and "--enable-dbo" in exported["args"]
    )
    assert any("dual-batch overlap" in item for item in exported["applied"])
    sglang = json.loads(run_cli("export", str(out), "--to", "sglang").stdout)
    assert sglang["normal_dispatch"]["num_sms"] == overlap["comm_sms"]


def test_overlap_needs_the_live_bench(tmp_path):
    result = run_cli(
        "tune",
        "--model",
        "DeepSeek-V3",
        "--ep-size",
        "2",
        "--gpu",
        "h200",
        "--bench",
        "model",
        "--overlap",
        "--sms",
        "20",
        "--tokens",
        "1024",
        "-o",
        str(tmp_path / "p.yaml"),
        "--storage",
        f"sqlite:///{tmp_path}/s.db",
    )
    assert result.returncode != 0 and "--overlap needs the live bench" in result.stderr


def test_overlap_without_torch_says_so_in_one_line(tmp_path):
    """`pip install .[tune]` brings no torch: asking for a live overlap tune there must end in one
    line saying what is missing, not a traceback."""
    import os
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['torch'] = None; from moepolicy.cli.main import main; "
        "sys.exit(main(sys.argv[1:]))"
    )
    args = [
        "tune",
        "--model",
        "Qwen3-30B-A3B-FP8",
        "--ep-size",
        "2",
        "--gpu",
        "h200",
        "--bench",
        "live",
        "--overlap",
        "--sms",
        "16,48",
        "--tokens",
        "1024",
        "-o",
        str(tmp_path / "p.yaml"),
        "--storage",
        f"sqlite:///{tmp_path}/s.db",
    ]
    env = {k: v for k, v in os.environ.items() if k != "MOEPOLICY_FAKE_DEEPEP"}
    result = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env={**env, "MOEPOLICY_OFFLINE": "1"},
        timeout=120,
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith("moepolicy: --bench live: the live bench needs CUDA GPUs")
    )


def test_overlap_flags_are_checked(tmp_path):
    result = run_cli(
        "tune",
        "--model",
        "DeepSeek-V3",
        "--ep-size",
        "2",
        "--gpu",
        "h200",
        "--bench",
        "live",
        "--overlap",
        "--confirm-rounds",
        "0",
        "--sms",
        "12",
        "--tokens",
        "1024",
        "-o",
        str(tmp_path / "p.yaml"),
        "--storage",
        f"sqlite:///{tmp_path}/s.db",
        fake_deepep=2,
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "--confirm-rounds must be a whole number of at least 9" in result.stderr
    result = run_cli(
        "tune",
        "--model",
        "DeepSeek-V3",
        "--ep-size",
        "2",
        "--gpu",
        "h200",
        "--bench",
        "live",
        "--overlap",
        "--sms",
        "12,3x",
        "--tokens",
        "1024",
        "-o",
        str(tmp_path / "p.yaml"),
        "--storage",
        f"sqlite:///{tmp_path}/s2.db",
        fake_deepep=2,
    )
    assert (
        result.returncode != 0
        and "Traceback" not in result.stderr
        and "--sms takes even integers" in result.stderr
    )


@pytest.mark.parametrize(
    "order, field",
    [
        ("comm-first", "comm_first_overlapped_us"),
        ("comm-first-no-wait", "comm_first_no_wait_overlapped_us"),
    ],
)
def test_overlap_order_is_chosen_and_recorded(tmp_path, order, field):
    out = tmp_path / "p.yaml"
    result = run_cli(
        "tune",
        "--model",
        "Qwen3-30B-A3B-FP8",
        "--ep-size",
        "2",
        "--gpu",
        "h200",
        "--bench",
        "live",
        "--overlap",
        "--overlap-order",
        order,
        "--sms",
        "12,32",
        "--tokens",
        "1024",
        "--trials",
        "2",
        "--confirm-rounds",
        "9",
        "-o",
        str(out),
        "--storage",
        f"sqlite:///{tmp_path}/s.db",
        fake_deepep=2,
    )
    assert result.returncode == 0, result.stderr
    doc = yaml.safe_load(out.read_text())
    measured = doc["deepep"]["buckets"][0]["measured"]
    assert doc["deepep"]["overlap"]["order"] == measured["objective"] == order
    assert measured["overlapped_us"] == measured[field]
    # the floor takes the communication as that order runs it
    no_wait = order == "comm-first-no-wait"
    assert measured["comm_region"] == ("no-wait" if no_wait else "full")
    assert (
        measured["comm_us"] == measured["comm_no_wait_us"]
    ) == no_wait  # the fake's no-wait comm is 5 % shorter
    assert (
        "vs its floor max(comm alone without the host wait, GEMM alone)" in result.stderr
    ) == no_wait


def test_an_unknown_overlap_order_is_refused(tmp_path):
    out = tmp_path / "p.yaml"
    bad = run_cli(
        "tune",
        "--model",
        "Qwen3-30B-A3B-FP8",
        "--ep-size",
        "2",
        "--gpu",
        "h200",
        "--bench",
        "live",
        "--overlap",
        "--overlap-order",
        "sideways",
        "--sms",
        "12",
        "--tokens",
        "1024",
        "-o",
        str(out),
    )
    assert (
        bad.returncode != 0 and "Traceback" not in bad.stderr and "--overlap-order" in bad.stderr
    )
