"""Every claim a policy can make, under null benches of five noise models (``testing.claims_sim``):
its false-claim rate is at or below the level docs/BENCHMARKS.md states (``deepep`` family 2.5 %,
both orders and the experts 1.25 % each, a whole policy 5 %, a ``moepolicy bench`` run 5 %), each
checked with the power the claim needs: a true rate 1.4 times the stated one fails at least 95 % of
the time, the stated one at most 0.1 % (binomial tails). Also: the gate keeps its power under
outliers, and a printed gain under a small true gain is not inflated beyond simulation error.
``benchmarks/protocol_false_claims.py`` runs the full simulation."""

import math

import pytest

from moepolicy.measure.rounds import DEFAULT_ROUNDS
from moepolicy.testing.claims_sim import (
    ENGINE_SMS,
    NOISE_MODELS,
    Gains,
    binomial_tail,
    inflation,
    rate,
    serial_tune,
)

LEVEL = {"orders": 0.0125, "experts": 0.0125, "policy": 0.05, "bench": 0.05}  # else 0.025
TEST_LEVEL, POWER, TOO_HIGH = 0.001, 0.95, 1.4


def runs_for(level: float) -> tuple[int, int]:
    """The fewest null runs (a multiple of 250) and the count at which the check fails, such that a
    true rate at ``level`` fails at most 0.1 % of the time and one 1.4 times it at least 95 %."""
    for runs in range(1000, 40000, 250):
        fail_at = next(
            k
            for k in range(int(runs * level), runs)
            if binomial_tail(k, runs, level) <= TEST_LEVEL
        )
        if binomial_tail(fail_at, runs, TOO_HIGH * level) >= POWER:
            return runs, fail_at
    raise AssertionError(f"no size up to 40000 runs has the power for {level}")


def test_the_check_has_the_power_its_claim_needs():
    # 2.5 %: 6750 runs, failing at 211 claims (3.1 %); the 1200 runs it had passed a true 3.5 %
    # rate 81 % of the time (issue 44)
    assert runs_for(0.025) == (6750, 211)
    runs, fail_at = runs_for(0.025)
    assert (
        binomial_tail(fail_at, runs, 0.035) >= 0.95
        and binomial_tail(fail_at, runs, 0.025) <= 0.001
    )
    assert runs_for(0.0125)[0] == 13250 and runs_for(0.05)[0] == 3250


@pytest.mark.slow
@pytest.mark.parametrize(
    "policy", ["sm", "chunks", "orders", "v2", "overlap", "experts", "policy", "bench"]
)
def test_no_policy_makes_false_claims_above_its_stated_level(policy):
    level = LEVEL.get(policy, 0.025)
    runs, fail_at = runs_for(level)
    each = runs // len(NOISE_MODELS)
    counts = {kind: rate(policy, kind, each, DEFAULT_ROUNDS, seed0=7000) for kind in NOISE_MODELS}
    assert sum(counts.values()) < fail_at, (counts, runs, fail_at)


def test_the_gate_keeps_its_power_under_rare_outliers():
    """The SM count truly x1.03 faster in every bucket, 3 % noise and one measurement in 50 twice as
    slow: the gate on ranks moves it in most tunes (the mean of the log-ratios, which one slow
    sample decides, moved it in 43 % at x1.03 in issue 44's runs)."""
    moved = sum(
        serial_tune("outliers", s, DEFAULT_ROUNDS, Gains((1.03,) * 3)).num_sms != ENGINE_SMS
        for s in range(100)
    )
    assert moved >= 70, moved


def test_a_small_true_gain_is_printed_without_inflation():
    """True x1.01 under 3 % noise: among the tunes that keep it, the report rounds' printed figure is
    the truth within simulation error, where the gate's (what the 2.1 protocol printed: the rounds
    that decided) is inflated by the selection, here to about twice the gain."""
    found = inflation("iid", gain=1.01, runs=80, rounds=DEFAULT_ROUNDS, sigma=0.03, seed0=100)
    assert found.moved >= 10
    assert (
        abs(math.log(found.report_mean / found.true)) < 0.004
    )  # printed: within 0.4 % of the truth
    assert math.log(found.gate_mean / found.true) > 0.005  # the deciding rounds' figure: inflated


@pytest.mark.parametrize("policy", ["chunks", "v2", "overlap"])
def test_every_kind_of_printed_gain_comes_from_rounds_that_did_not_decide(policy):
    """The chunks', DeepEP v2's and the overlap split's printed figures at a true x1.02: the report's
    mean is the truth within simulation error, the gate rounds' own is not."""
    found = inflation("iid", 1.02, 80, DEFAULT_ROUNDS, sigma=0.03, seed0=300, policy=policy)
    assert found.moved >= 20, found
    assert abs(math.log(found.report_mean / found.true)) < 0.005, found
    assert math.log(found.gate_mean / found.report_mean) > 0.0, found
