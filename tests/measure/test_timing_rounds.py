"""``rounds.balanced_rounds``, under ``interleaved_rounds`` (the expert GEMM's launch-config pick and
``benchmarks/bench_dispatch.py``): every name timed once per round, each round starting one name further
along. A scripted timer plays the GPU."""

import statistics

import pytest

from moepolicy.measure.rounds import balanced_rounds

# measure.timing imports torch, measure.rounds does not: only the timing tests skip without torch
TIMING_NEEDS_TORCH = "moepolicy.measure.timing imports torch (the CPU build is enough)"


class ScriptedTimer:
    """Each name has a true time; the first timing of a round reads ``first_penalty`` slower (a
    pause before it), and ``lucky``'s first timing ever reads 1 us."""

    def __init__(self, true_us, first_penalty=0.0, lucky=None):
        self.true_us, self.first_penalty, self.lucky = true_us, first_penalty, lucky
        self.calls = []

    def __call__(self, name):
        first_of_round = len(self.calls) % len(self.true_us) == 0
        first_ever = name not in self.calls
        self.calls.append(name)
        if name == self.lucky and first_ever:
            return 1.0
        return self.true_us[name] + (self.first_penalty if first_of_round else 0.0)


def fastest(rounds):
    medians = {name: statistics.median(xs) for name, xs in rounds.items()}
    return min(medians, key=medians.get), medians


def test_every_name_is_timed_once_per_round_and_the_median_ignores_a_lucky_timing():
    timer = ScriptedTimer({"a": 100.0, "b": 90.0, "c": 95.0}, lucky="a")
    rounds = balanced_rounds(["a", "b", "c"], timer, rounds=5)
    assert {name: len(xs) for name, xs in rounds.items()} == {"a": 5, "b": 5, "c": 5}
    assert rounds["a"][0] == 1.0  # the lucky timing is kept, and outvoted
    assert fastest(rounds) == ("b", {"a": 100.0, "b": 90.0, "c": 95.0})


def test_the_order_keeps_the_first_in_line_from_always_paying_the_pause():
    true = {"a": 90.0, "b": 100.0, "c": 95.0}
    timer = ScriptedTimer(true, first_penalty=20.0)
    rounds = balanced_rounds(["a", "b", "c"], timer, rounds=5)
    firsts = [timer.calls[3 * r] for r in range(5)]
    assert max(firsts.count(name) for name in "abc") == 2
    assert fastest(rounds) == ("a", true)  # each was first in at most 2 of 5 rounds
    # one timing each, as the pick did before: the penalty on the first in line picks the wrong one
    assert (
        fastest(
            balanced_rounds(["a", "b", "c"], ScriptedTimer(true, first_penalty=20.0), rounds=1)
        )[0]
        == "c"
    )


def test_bad_arguments_say_what_was_wrong():
    with pytest.raises(ValueError, match="rounds >= 1"):
        balanced_rounds(["a"], lambda name: 1.0, rounds=0)
    with pytest.raises(ValueError, match="0 names"):
        balanced_rounds([], lambda name: 1.0, rounds=3)


def test_the_slowest_rank_is_taken_per_repetition_not_per_median():
    pytest.importorskip("torch", reason=TIMING_NEEDS_TORCH)
    from moepolicy.measure.timing import slowest_per_rep

    # rank 1 is slow in repetitions 0-1, rank 0 in 2-3: each repetition's step waits for its slowest rank
    rank0 = {"gemm": [100.0, 100.0, 150.0, 150.0], "comm": [50.0, 60.0, 50.0, 60.0]}
    rank1 = {"gemm": [140.0, 140.0, 100.0, 100.0], "comm": [55.0, 55.0, 55.0, 55.0]}
    out = slowest_per_rep([rank0, rank1])
    assert out == {"comm": [55.0, 60.0, 55.0, 60.0], "gemm": [140.0, 140.0, 150.0, 150.0]}
    # the median of the per-repetition maxima (145) is above either rank's median (125 and 120)
    assert statistics.median(out["gemm"]) > max(
        statistics.median(rank0["gemm"]), statistics.median(rank1["gemm"])
    )


def test_ranks_that_timed_different_repetitions_are_refused():
    pytest.importorskip("torch", reason=TIMING_NEEDS_TORCH)
    from moepolicy.measure.timing import slowest_per_rep

    with pytest.raises(ValueError, match="same repetitions"):
        slowest_per_rep([{"gemm": [1.0, 2.0]}, {"gemm": [1.0]}])
    with pytest.raises(ValueError, match="same repetitions"):
        slowest_per_rep([{"gemm": [1.0]}, {"comm": [1.0]}])


def test_one_process_keeps_its_own_timings():
    torch = pytest.importorskip("torch", reason=TIMING_NEEDS_TORCH)

    from moepolicy.measure.timing import Timer

    samples = {"gemm": [1.0, 2.0]}
    assert Timer(torch.device("cpu")).slowest_rank_per_rep(samples) is samples


@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_over_a_cycle_every_name_follows_every_name_as_often(k):
    """Carry-over: a timing that depends on what ran just before it (a cache, an SM count's launch
    state) falls on every name alike. With the warm-up pass, over each cycle of 2k rounds every name
    follows every other name, and itself, twice, and sits in every position twice (the rotation this
    replaced always put the same name before each: ``b`` after ``a``, ``c`` after ``b``)."""
    names = [chr(ord("a") + i) for i in range(k)]
    calls = []
    balanced_rounds(names, lambda name: calls.append(name) or 1.0, rounds=2 * k, warm_up=True)
    follows = {}
    for before, after in zip(calls[k - 1 :], calls[k:]):  # the warm-up's last name leads
        follows[(before, after)] = follows.get((before, after), 0) + 1
    assert follows == {(x, y): 2 for x in names for y in names}
    for position in range(k):
        column = [calls[k + r * k + position] for r in range(2 * k)]
        assert sorted(column) == sorted(names * 2)


def test_a_carry_over_from_one_config_favours_none():
    """A call right after ``a`` is 3 % slower (``a`` leaves the caches cold): with the rotation,
    ``b`` followed ``a`` in 2 rounds of 3 and ``c`` in 1, so ``b`` read slower than ``c``; balanced,
    every name follows ``a`` as often and pays the same."""
    calls = []

    def timed(name):
        slow = 1.03 if calls and calls[-1] == "a" else 1.0
        calls.append(name)
        return 100.0 * slow

    got = balanced_rounds(["a", "b", "c"], timed, rounds=12, warm_up=True)
    means = {name: statistics.fmean(xs) for name, xs in got.items()}
    assert max(means.values()) - min(means.values()) < 1e-9, means


def test_a_split_by_cycle_keeps_each_halfs_predecessors_balanced():
    """Each half of a bench run (deciding rounds, report rounds) is whole cycles of the balanced
    design: every name follows every other equally often within it, and first equally often; even
    and odd rounds would not keep that (one name would always follow the same one)."""
    from collections import Counter

    from moepolicy.measure.rounds import round_orders, split_by_cycle

    orders = round_orders(3)
    first, second = split_by_cycle(4 * len(orders), 3)
    assert sorted(first + second) == list(range(4 * len(orders))) and len(first) == len(second)
    for half in (first, second):
        follows = Counter(pair for r in half for pair in zip(orders[r % 6], orders[r % 6][1:]))
        starts = Counter(orders[r % 6][0] for r in half)
        assert len(set(follows.values())) == 1 and len(follows) == 6
        assert len(set(starts.values())) == 1
    even = [r for r in range(24) if r % 2 == 0]
    follows = Counter(pair for r in even for pair in zip(orders[r % 6], orders[r % 6][1:]))
    assert len(set(follows.values())) > 1  # what the even rounds alone would have kept: unbalanced
