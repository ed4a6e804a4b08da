"""Every claim a policy can make, under null benches of five noise models (``testing.claims_sim``):
its false-claim rate is at or below the level docs/BENCHMARKS.md states (2.5 % per policy and
direction; 5 % for any claim of a ``moepolicy bench`` run), with a tolerance for simulation error; and
a printed gain under a small true gain is not inflated beyond simulation error. A reduced simulation
(benchmarks/protocol_false_claims.py runs the full one); each policy pools its runs over the noise
models."""

import math

import pytest

from moepolicy.measure.rounds import DEFAULT_ROUNDS
from moepolicy.testing.claims_sim import NOISE_MODELS, POLICIES, inflation, rate

RUNS = (
    240  # per noise model: 1200 null runs per policy (power: a true 6.3 % rate fails every policy)
)
LEVEL = {"bench": 0.05}  # any claim in either direction among 12 comparisons; the rest 2.5 %


def consistent_with(count: int, runs: int, level: float) -> bool:
    """Could ``count`` of ``runs`` come from a rate at ``level``? (one-sided binomial test at 0.2 %)"""

    def log_pmf(k: int) -> float:  # in logs: math.comb(1200, k) overflows a float
        return (
            math.lgamma(runs + 1)
            - math.lgamma(k + 1)
            - math.lgamma(runs - k + 1)
            + k * math.log(level)
            + (runs - k) * math.log1p(-level)
        )

    return sum(math.exp(log_pmf(k)) for k in range(count, runs + 1)) > 0.002


@pytest.mark.parametrize("policy", POLICIES)
def test_no_policy_makes_false_claims_above_its_stated_level(policy):
    counts = {kind: rate(policy, kind, RUNS, DEFAULT_ROUNDS, seed0=7000) for kind in NOISE_MODELS}
    level = LEVEL.get(policy, 0.025)
    assert consistent_with(sum(counts.values()), RUNS * len(NOISE_MODELS), level), counts


def test_the_binomial_check_can_fail():
    # the 2.1 protocol's rates (issue 32: 14 % of policies moved the SM count under iid noise) are caught
    assert not consistent_with(17, 120, 0.025) and consistent_with(6, 120, 0.025)
    # at this test's size a true 6.3 % (the old percentile bootstrap's rate) fails, 2.5 % passes
    runs = RUNS * len(NOISE_MODELS)
    assert not consistent_with(round(0.063 * runs), runs, 0.025)
    assert consistent_with(round(0.025 * runs), runs, 0.025)


def test_a_small_true_gain_is_printed_without_inflation():
    """True x1.01 under 3 % noise: among the tunes that keep it, the report rounds' printed figure is
    the truth within simulation error, where the gate's (what the 2.1 protocol printed: the rounds
    that decided) is inflated by the selection, here to about twice the gain."""
    found = inflation("iid", gain=1.01, runs=60, rounds=DEFAULT_ROUNDS, sigma=0.03, seed0=100)
    assert found.moved >= 8
    assert (
        abs(math.log(found.report_mean / found.true)) < 0.004
    )  # printed: within 0.4 % of the truth
    assert math.log(found.gate_mean / found.true) > 0.005  # the deciding rounds' figure: inflated
