"""The exact paired test every claim rests on (``measure.rounds``): the signed-rank sign-flip test on
the per-round log-ratios, its Hodges-Lehmann estimate and interval (the test inverted), Holm's
correction, and the one way speed-ups are written."""

import itertools
import math
import random

import pytest

from moepolicy.measure.rounds import (
    Speedup,
    holm,
    interval_words,
    least_rounds,
    paired_speedup,
    signed_rank,
    speedup_words,
    weighted_rounds,
)


def brute_force_p(logs):
    """P(the signed-rank statistic >= the observed one), over all 2**n sign patterns."""
    order = sorted(range(len(logs)), key=lambda i: abs(logs[i]))
    rank = {i: r + 1 for r, i in enumerate(order)}  # no ties in these draws
    observed = sum(rank[i] for i, x in enumerate(logs) if x > 0)
    hits = sum(
        sum(rank[i] for i, s in enumerate(signs) if s > 0) >= observed
        for signs in itertools.product((1, -1), repeat=len(logs))
    )
    return hits / 2 ** len(logs)


def test_the_p_value_is_the_sign_flip_distributions_own():
    rng = random.Random(4)
    for n in (3, 6, 9, 12):
        logs = [rng.gauss(0.01, 0.03) for _ in range(n)]
        found = signed_rank(logs)
        assert found.p_faster == pytest.approx(brute_force_p(logs))
        assert found.p_slower == pytest.approx(brute_force_p([-x for x in logs]))


def test_all_rounds_faster_reach_two_to_the_minus_n_and_no_fewer_than_six_rounds_claim():
    for n in range(1, 10):
        s = paired_speedup([110.0] * n, [100.0] * n)
        assert s.p_faster == pytest.approx(2.0**-n)
        assert s.faster == (n >= 6) and (s.low is None) == (n < 6)
    assert least_rounds(1) == 6 and least_rounds(3) == 7 and least_rounds(12) == 9


def test_the_interval_excludes_one_exactly_when_the_test_claims():
    rng = random.Random(7)
    for _ in range(300):
        n = rng.choice((7, 9, 12, 15))
        base = [100 * math.exp(rng.gauss(0, 0.03)) for _ in range(n)]
        other = [b / math.exp(rng.gauss(rng.choice((0.0, 0.02, -0.02)), 0.03)) for b in base]
        s = paired_speedup(base, other)
        assert s.faster == (s.low > 1.0) and s.slower == (s.high < 1.0)
        assert s.low <= s.speedup <= s.high


def test_one_wild_round_counts_as_one_round():
    """The contender is 3 % faster in 14 of 15 rounds; in one its time doubled (an outlier). The
    signed-rank test claims the gain; the mean of the log-ratios (the test it replaced) was pulled
    below zero by the one round and claimed nothing."""
    base = [100.0] * 15
    contender = [100.0 / 1.03] * 14 + [200.0]
    s = paired_speedup(base, contender)
    assert s.faster and s.p_faster < 0.01
    assert s.speedup == pytest.approx(1.03, rel=1e-6)  # the estimate ignores the wild round too
    mean = sum(math.log(b / c) for b, c in zip(base, contender)) / 15
    assert mean < 0  # what the old figure (a geometric mean) would have printed: a loss


def test_tied_rounds_carry_no_sign():
    s = paired_speedup([100.0] * 9, [100.0] * 9)
    assert (s.p_faster, s.p_slower, s.verdict, s.speedup) == (1.0, 1.0, "within noise", 1.0)
    # tied magnitudes share their mean rank (2 here): the p-value is still the patterns' own
    logs, ranks = [0.01, 0.01, -0.01, 0.02, 0.03, 0.04], [2, 2, 2, 4, 5, 6]
    observed = sum(r for r, x in zip(ranks, logs) if x > 0)
    patterns = list(itertools.product((0, 1), repeat=6))
    hits = sum(sum(r * s for r, s in zip(ranks, signs)) >= observed for signs in patterns)
    assert signed_rank(logs).p_faster == pytest.approx(hits / len(patterns))


def test_the_false_claim_rate_is_at_its_level_whatever_the_noise_shape():
    rng = random.Random(11)
    draws = {
        "normal": lambda: rng.gauss(0, 0.03),
        "heavy": lambda: rng.gauss(0, 0.03) / max(abs(rng.gauss(0, 1)), 0.05),
        "outliers": lambda: rng.gauss(0, 0.03) + (math.log(2) if rng.random() < 0.05 else 0.0),
    }
    for name, draw in draws.items():
        claims = sum(
            paired_speedup(
                [math.exp(draw()) for _ in range(9)], [math.exp(draw()) for _ in range(9)]
            ).faster
            for _ in range(1500)
        )
        assert claims / 1500 <= 0.025 + 3 * math.sqrt(0.025 * 0.975 / 1500), (name, claims)


def test_holm_claims_no_more_than_it_may_and_keeps_the_order():
    strong = paired_speedup([110.0] * 9, [100.0] * 9)  # p = 1/512
    weak = paired_speedup([100, 104, 99, 103, 102, 98, 104, 103, 101], [100.0] * 9)
    tested = holm([weak, strong, strong], "faster", "buckets")
    assert [t.faster for t in tested] == [False, True, True]
    assert (
        tested[0].verdict == "no gain beyond noise"
        and tested[1].correction == "Holm over 3 buckets"
    )
    assert holm([strong], "both")[0].correction == ""  # one comparison: no family
    losses = holm([paired_speedup([100.0] * 9, [110.0] * 9), strong], "slower", "buckets")
    assert losses[0].slower and losses[1].verdict == "no loss beyond noise"
    with pytest.raises(ValueError):
        holm([strong], "sideways")


def test_speed_ups_are_written_one_way_with_the_word_faster_or_slower():
    assert speedup_words(1.25) == "x1.250 faster" and speedup_words(0.8) == "x1.250 slower"
    assert interval_words(1.01, 1.05) == "95% CI x1.010-x1.050 faster"
    assert interval_words(0.8, 0.9) == "95% CI x1.111-x1.250 slower"
    assert interval_words(0.98, 1.02) == "95% CI x1.020 slower to x1.020 faster"
    loss = paired_speedup([100.0] * 9, [110.0] * 9, names=("kept", "the engine's default"))
    assert loss.words().startswith("x1.100 slower than the engine's default: a loss beyond noise")
    assert (
        "x" in paired_speedup([100.0] * 9, [100.0] * 9).words()
        and "within noise" in paired_speedup([100.0] * 9, [100.0] * 9).words()
    )


def test_weighted_rounds_sum_each_round_over_the_buckets():
    assert weighted_rounds([[1.0, 2.0], [10.0, 20.0]], [1.0, 0.5]) == [6.0, 12.0]
    with pytest.raises(ValueError):
        weighted_rounds([[1.0], [1.0, 2.0]], [1.0, 1.0])


def test_a_stored_comparison_carries_its_test():
    doc = paired_speedup([110.0] * 7, [100.0] * 7, names=("kept", "engine")).to_doc()
    assert (
        doc["verdict"] == "faster"
        and doc["test"] == "exact signed-rank sign-flip"
        and doc["p_faster"] == round(1 / 128, 5)
    )
    assert doc["ci95"][0] > 1.0 and "beyond_noise" not in doc
    assert isinstance(paired_speedup([1.0] * 7, [1.0] * 7), Speedup)
