"""The policy-level false-claim rate of the protocol before issue 44 (iid noise, 3 %, 15 rounds)."""

import sys
from moepolicy.testing import claims_sim as S
from moepolicy.tuning.confirm import time_both_orders
from moepolicy.tuning.expert_choice import ChoiceInputs, Communication, choose_experts
from moepolicy.measure.routing import ExpertShape
from moepolicy.testing.fakes import KnownExpertBench


def experts(seed):
    arms = (
        "deepgemm/quant_then_dispatch",
        "deepgemm/dispatch_then_quant",
        "flashinfer_cutlass/no_quant",
    )
    true = {(a, t): 100.0 for a in arms for t, _ in S.BUCKETS}
    bench = KnownExpertBench(true, sigma=0.03, seed=seed, runs=("deepgemm", "flashinfer_cutlass"))
    ins = ChoiceInputs(
        ExpertShape(2048, 768, 128, 8, 2),
        S.BUCKETS,
        "flashinfer_cutlass",
        ("flashinfer_cutlass", "deepgemm"),
        rounds=16,
        communication_words="equal",
    )
    c = choose_experts(ins, bench, lambda t, w: Communication(50.0, 50.0, 0.0))
    return c.faster_kernel != "unmeasured" or any(
        t.verdict != "unmeasured" for _, ts in c.orders for t in ts
    )


def orders(seed):
    bench = S.KnownBench(
        lambda key: S.BASE_US[key[1].tokens] if isinstance(key, tuple) else S.BASE_US[key.tokens],
        S.Noise("iid", 0.03, seed),
    )
    return any(
        t.verdict != "unmeasured"
        for t in time_both_orders(bench, S.WORK, {t: S._point(20, t) for t, _ in S.BUCKETS}, 15)
    )


n = int(sys.argv[1])
counts = {"sm": 0, "chunks": 0, "orders": 0, "experts": 0, "any": 0}
for seed in range(n):
    d = S.serial_tune("iid", seed, 15)
    sm = d.num_sms != 20 or any(t.slower for t in d.gate.losses.values())
    ch = any(c.kept.name.startswith("top") for c in d.buckets.values())
    o, e = orders(seed + 10**6), experts(seed + 2 * 10**6)
    for k, v in (
        ("sm", sm),
        ("chunks", ch),
        ("orders", o),
        ("experts", e),
        ("any", sm or ch or o or e),
    ):
        counts[k] += v
print(n, {k: f"{v}/{n} = {v / n:.2%}" for k, v in counts.items()})
