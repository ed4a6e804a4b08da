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
    from moepolicy.policy_reader import read_policy

    doc = read_policy(mixtral_policy).doc
    policy, vllm, default = build_arms(doc)
    assert [k.order for k in policy.kinds] == ["quant_then_dispatch"]
    assert [k.order for k in vllm.kinds] == ["dispatch_then_quant"]  # vLLM 0.33 sends per-tensor fp8 as bf16
    assert dict(vllm.kinds[0].wire)["dtype"] == "bf16"
    assert policy.kinds[0].consumes == vllm.kinds[0].consumes  # the same experts, fed the same format
    assert vllm.num_sms == 20 and default.kinds == policy.kinds
    assert sum(k.count for k in policy.kinds) == sum(1 for layer in doc.layers if layer.kind == "moe")


def test_bench_runs_the_moe_step_end_to_end_on_the_emulated_transport(mixtral_policy, tmp_path):
    out = tmp_path / "bench.json"
    result = run_cli("bench", str(mixtral_policy), "--tokens", "16", "--routing", "uniform,zipf", "--rounds", "2",
                     "--reps", "1", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert "plumbing only" in result.stdout and "plumbing only" in result.stderr
    raw = json.loads(out.read_text())
    assert raw["transport"] == "emulated" and set(raw["arms"]) == {"policy", "vllm", "deepep-default"}
    assert {(r["routing"], r["tokens"]) for r in raw["comparison"]} == {("uniform", 16), ("zipf", 16)}
    for row in raw["comparison"]:
        assert all(us > 0 for us in row["median_us"].values())
        for base in ("vs_vllm", "vs_deepep-default"):
            assert row[base]["rounds"] == 2 and row[base]["ci95"][0] <= row[base]["speedup"] <= row[base]["ci95"][1]
    for routing in ("uniform", "zipf"):
        assert all(len(xs) == 2 for xs in raw["times_us"][routing]["16"].values())


def test_bench_refuses_what_it_cannot_run_in_one_line(mixtral_policy):
    for args, what in ((("--routing", "bursty"), "--routing"), (("--tokens", "0"), "--tokens"),
                       (("--ranks", "3"), "do not divide")):
        result = run_cli("bench", str(mixtral_policy), *args)
        assert result.returncode != 0 and "Traceback" not in result.stderr and what in result.stderr


def test_zipf_routing_is_skewed_and_uniform_is_not():
    from moepolicy.moe_step.measure import routing

    def spread(kind):
        idx, _ = routing(4096, 64, 4, kind, seed=1)
        counts = torch.bincount(idx.flatten(), minlength=64).float()
        assert (idx.sort(dim=1).values.diff(dim=1) > 0).all()  # k distinct experts per token
        return float(counts.max() / counts.min().clamp(min=1))

    assert spread("uniform") < 1.5 and spread("zipf") > 10
