"""``moepolicy bench`` on CPU: the emulated all-to-all runs the three arms end to end (plumbing only,
labelled so); the arms carry the policy's and vLLM's decisions as the rules make them."""

import json

import pytest

from conftest import run_cli

torch = pytest.importorskip("torch", reason="bench needs torch (the CPU build is enough)")

MIXTRAL_FP8 = "amd/Mixtral-8x7B-Instruct-v0.1-FP8-KV"  # per-tensor fp8: the policy and vLLM differ


@pytest.fixture(scope="module")
def mixtral_policy(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "mixtral.yaml"
    plan = run_cli("plan", "--model", MIXTRAL_FP8, "--ep-size", "2", "-o", str(out))
    assert plan.returncode == 0, plan.stderr
    return out


def test_the_arms_carry_the_policy_and_the_vllm_pack_decisions(mixtral_policy):
    from moepolicy.moe_step.arms import build_arms
    from moepolicy.document.reader import read_policy

    doc = read_policy(mixtral_policy).doc
    policy, vllm, default = build_arms(doc)
    assert [k.order for k in policy.kinds] == ["quant_then_dispatch"]
    assert [k.order for k in vllm.kinds] == [
        "dispatch_then_quant"
    ]  # vLLM 0.33 sends per-tensor fp8 as bf16
    assert dict(vllm.kinds[0].wire)["dtype"] == "bf16"
    assert (
        policy.kinds[0].consumes == vllm.kinds[0].consumes
    )  # the same experts, fed the same format
    assert vllm.num_sms == 20 and default.kinds == policy.kinds
    assert sum(k.count for k in policy.kinds) == sum(
        1 for layer in doc.layers if layer.kind == "moe"
    )


def test_bench_runs_the_moe_step_end_to_end_on_the_emulated_transport(mixtral_policy, tmp_path):
    out = tmp_path / "bench.json"
    result = run_cli(
        "bench",
        str(mixtral_policy),
        "--tokens",
        "16",
        "--routing",
        "uniform,zipf",
        "--rounds",
        "2",
        "--reps",
        "1",
        "-o",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("plumbing ok") and "plumbing only" in result.stderr
    assert (
        " us" not in result.stdout and "faster" not in result.stdout and "x1." not in result.stdout
    )  # no ratio
    assert (
        "bench: 1/2 uniform routing, 16 tokens: 2 rounds in" in result.stderr
    )  # progress per bucket
    raw = json.loads(out.read_text())
    assert raw["transport"] == "emulated" and set(raw["arms"]) == {
        "policy",
        "vllm",
        "deepep-default",
    }
    assert raw["comparison"] == []  # the emulated transport compares nothing
    for routing in ("uniform", "zipf"):
        assert all(len(xs) == 2 for xs in raw["times_us"][routing]["16"].values())


def _times(rounds, policy_gain=1.0, seed=0, sigma=0.03):
    import math
    import random

    rng = random.Random(seed)
    return {
        r: {
            str(t): {
                "policy": [
                    100.0 / policy_gain * math.exp(rng.gauss(0, sigma)) for _ in range(rounds)
                ],
                "vllm": [100.0 * math.exp(rng.gauss(0, sigma)) for _ in range(rounds)],
                "deepep-default": [100.0 * math.exp(rng.gauss(0, sigma)) for _ in range(rounds)],
            }
            for t in (128, 1024, 4096)
        }
        for r in ("uniform", "zipf")
    }


def test_one_round_claims_nothing_and_says_it_cannot_test():
    from moepolicy.cli.bench import comparison

    rows = comparison(
        _times(1, policy_gain=1.37)
    )  # one round: a zero-width interval said "x1.37 beyond noise"
    for row in rows:
        for base in ("vs_vllm", "vs_deepep-default"):
            assert row[base]["verdict"].startswith(
                "untested: 1 deciding rounds cannot test 12 comparisons"
            )
            assert row[base]["ci95"] is None and row[base]["speedup"] is None


def test_the_runs_comparisons_are_tested_together_and_a_loss_is_printed_as_one(capsys):
    from moepolicy.cli.bench import comparison, render

    rows = comparison(
        _times(24, policy_gain=1.0 / 1.2, sigma=0.02)
    )  # the policy 1.2x slower everywhere
    assert all(row["vs_vllm"]["verdict"] == "slower" for row in rows)
    assert rows[0]["vs_vllm"]["correction"] == "Holm over 12 comparisons of this run"
    render(rows, functional="", rounds=24)
    out = capsys.readouterr().out
    assert "x1.200 slower, a loss beyond noise" in out or "slower, a loss beyond noise" in out
    equal = comparison(_times(24, seed=3))
    assert (
        sum(
            row[b]["verdict"] in ("faster", "slower")
            for row in equal
            for b in ("vs_vllm", "vs_deepep-default")
        )
        == 0
    )


def test_bench_refuses_what_it_cannot_run_in_one_line(mixtral_policy):
    for args, what in (
        (("--routing", "bursty"), "--routing"),
        (("--tokens", "0"), "--tokens"),
        (("--ranks", "3"), "do not divide"),
    ):
        result = run_cli("bench", str(mixtral_policy), *args)
        assert (
            result.returncode != 0 and "Traceback" not in result.stderr and what in result.stderr
        )


def test_the_regime_is_asked_per_run_and_the_emulated_transport_says_and_records_it_has_none(
    mixtral_policy, tmp_path
):
    from moepolicy.cli.bench import RUN_AHEAD
    from moepolicy.measure.timing import RUN_AHEAD_CALLS

    assert RUN_AHEAD == RUN_AHEAD_CALLS  # the help text's count is the timer's
    out = tmp_path / "bench.json"
    args = ("--tokens", "16", "--routing", "uniform", "--rounds", "1", "--reps", "1")
    result = run_cli("bench", str(mixtral_policy), *args, "--regime", "runahead", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text())["spec"]["regime"] is None  # the emulated transport has none
    assert "--regime applies to DeepEP on GPUs" in result.stderr
    bad = run_cli("bench", str(mixtral_policy), *args, "--regime", "eager")
    assert bad.returncode == 2 and "invalid choice: 'eager'" in bad.stderr


def test_zipf_routing_is_skewed_and_uniform_is_not():
    from moepolicy.moe_step.measure import routing

    def spread(kind):
        idx, _ = routing(4096, 64, 4, kind, seed=1)
        counts = torch.bincount(idx.flatten(), minlength=64).float()
        assert (idx.sort(dim=1).values.diff(dim=1) > 0).all()  # k distinct experts per token
        return float(counts.max() / counts.min().clamp(min=1))

    assert spread("uniform") < 1.5 and spread("zipf") > 10


def _experts_reference(experts, rows, topk_idx, topk_weights):
    """Each local expert on the rows routed to it, one at a time (the plain reading of the stand-in)."""
    out = torch.zeros(rows.shape[0], rows.shape[1], dtype=torch.float32)
    for r in range(rows.shape[0]):
        for slot in range(topk_idx.shape[1]):
            e = int(topk_idx[r, slot])
            if e >= 0:
                h = torch.relu(rows[r : r + 1] @ experts.w1[e]) @ experts.w2[e]
                out[r] += h[0].float() * float(topk_weights[r, slot])
    return out


def test_the_stand_in_experts_group_rows_by_the_counts_dispatch_handed_the_host():
    """The stand-in groups rows by expert with the per-expert counts from dispatch (no host wait):
    the same result as running each routed (row, expert) pair alone."""
    from moepolicy.moe_step.measure import StandInExperts

    g = torch.Generator().manual_seed(3)
    local, hidden, rows_n, top_k = 4, 16, 37, 3
    experts = StandInExperts(local, hidden, 8, torch.device("cpu"), torch.float32)
    rows = torch.randn(rows_n, hidden, generator=g)
    # each received row names up to top_k distinct local experts; -1: an expert of another rank
    topk_idx = torch.stack([torch.randperm(local + 3, generator=g)[:top_k] for _ in range(rows_n)])
    topk_idx = torch.where(topk_idx < local, topk_idx, torch.full_like(topk_idx, -1))
    topk_weights = torch.rand(rows_n, top_k, generator=g)
    counts = [int((topk_idx == e).sum()) for e in range(local)]
    got = experts(rows, None, topk_idx, topk_weights, counts)
    torch.testing.assert_close(got, _experts_reference(experts, rows, topk_idx, topk_weights))
    assert 0 in counts or sum(counts) < rows_n * top_k  # the test routes some pairs elsewhere


@pytest.mark.parametrize("missing", ["kernel.name", "ckpt.weight_dtype", "ckpt.act_granularity"])
def test_vllms_arm_is_replayed_from_a_stored_fact_set_that_lacks_a_fact(
    mixtral_policy, tmp_path, missing
):
    """A hand-edited (and re-keyed) fact set that validate accepts: vLLM's arm is still built, the
    missing fact read as unknown as the rules read it (found by the command fuzz test in CI)."""
    import yaml

    from moepolicy.document.keys import compute_keys
    from moepolicy.document.reader import read_policy
    from moepolicy.moe_step.arms import build_arms

    doc = yaml.safe_load(mixtral_policy.read_text())
    for facts in doc["layer_facts"].values():
        facts.pop(missing, None)
    doc["key"] = compute_keys(doc)
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump(doc, sort_keys=False))
    policy, vllm, _ = build_arms(read_policy(edited).doc)
    assert sum(k.count for k in vllm.kinds) == sum(k.count for k in policy.kinds)


def _depth(text: str) -> int:
    deepest = level = 0
    for ch in text:
        level += {"(": 1, ")": -1}.get(ch, 0)
        deepest = max(deepest, level)
    return deepest


def test_arms_that_make_the_same_choices_are_said_up_front_and_not_timed(tmp_path):
    """The main job's Qwen3-30B-A3B-FP8 plan is vLLM's choice with DeepEP's defaults: the three arms
    would time one step three times (minutes on CPU); bench says so before timing and stops."""
    policy = tmp_path / "q.yaml"
    assert (
        run_cli(
            "plan", "--model", "Qwen3-30B-A3B-FP8", "--ep-size", "2", "-o", str(policy)
        ).returncode
        == 0
    )
    done = run_cli("bench", str(policy), "-o", str(tmp_path / "b.json"))
    assert done.returncode == 0, done.stderr
    assert "nothing to compare: the 3 arms make the same choices here" in done.stderr
    assert "timing " not in done.stderr and not (tmp_path / "b.json").exists()
    assert "b.json was not written" in done.stderr
    first = done.stderr.splitlines()[0]
    assert first.startswith("bench: emulated, 2 ranks; ") and _depth(first) <= 1, first
    # --null times them anyway: the A/A check of the GPU campaign (benchmarks/null_verdict.py)
    null = run_cli(
        "bench",
        str(policy),
        "--null",
        "--tokens",
        "16",
        "--rounds",
        "2",
        "--reps",
        "1",
        "--routing",
        "uniform",
        "-o",
        str(tmp_path / "null.json"),
    )
    assert null.returncode == 0, null.stderr
    assert "nothing to compare" not in null.stderr and (tmp_path / "null.json").exists()
    said = json.loads((tmp_path / "null.json").read_text())
    assert "per forward pass through every MoE layer" in said["times_are"]


def test_arms_that_differ_are_timed(mixtral_policy):
    from moepolicy.cli.bench import same_step
    from moepolicy.document.reader import read_policy
    from moepolicy.moe_step.arms import build_arms

    assert not same_step(build_arms(read_policy(mixtral_policy).doc), (16, 128))


def test_the_figures_shown_come_from_rounds_that_did_not_decide():
    """Half the rounds decide, the other half give the speed-up shown: a run whose deciding rounds
    favour the policy by chance and whose other rounds do not prints the others' figure, not the
    winner's."""
    from moepolicy.cli.bench import BENCH_ROUNDS, comparison
    from moepolicy.measure.rounds import split_by_cycle

    decide, _ = split_by_cycle(BENCH_ROUNDS, 3)
    times = _times(BENCH_ROUNDS, sigma=0.02, seed=5)
    for by_tokens in times.values():
        for arms in by_tokens.values():
            arms["policy"] = [x / 1.3 if i in decide else x for i, x in enumerate(arms["policy"])]
    rows = comparison(times)
    for row in rows:
        shown = row["vs_vllm"]
        assert shown["gate"]["rounds"] == 12 and shown["rounds"] == 12
        assert shown["rounds_from"] == "report" and shown["gate"]["rounds_from"] == "gate"
        assert shown["verdict"] == "faster"  # the deciding rounds, 1.3x faster
        assert 0.95 < shown["speedup"] < 1.05  # the report rounds: no gain
