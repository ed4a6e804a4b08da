"""``launch_pick.fastest``: the launch config the expert GEMM stand-in runs with on each SM count is
chosen from interleaved, repeated timings, not from one (a scripted timer plays the GPU)."""

import pytest

from moepolicy.measure.launch_pick import fastest


class ScriptedTimer:
    """Each candidate has a true time; the first timing after a pause (the first of a round) reads
    ``first_penalty`` slower, and one candidate's first timing ever reads ``lucky`` fast."""

    def __init__(self, true_us, first_penalty=0.0, lucky=None):
        self.true_us, self.first_penalty, self.lucky = true_us, first_penalty, lucky
        self.calls, self.seen = [], set()

    def __call__(self, cfg):
        first_of_round = len(self.calls) % len(self.true_us) == 0
        self.calls.append(cfg)
        t = self.true_us[cfg] + (self.first_penalty if first_of_round else 0.0)
        if cfg == self.lucky and cfg not in self.seen:
            t = 1.0
        self.seen.add(cfg)
        return t


def test_the_lowest_median_wins_not_one_lucky_timing():
    timer = ScriptedTimer({"a": 100.0, "b": 90.0, "c": 95.0}, lucky="a")
    best, medians = fastest(["a", "b", "c"], timer, rounds=5)
    assert best == "b" and medians == {"a": 100.0, "b": 90.0, "c": 95.0}
    assert len(timer.calls) == 15


def test_rotated_order_keeps_the_first_in_line_from_always_paying_the_pause():
    # the true best, "a", is first in the list; in one fixed order it would pay +20 us every round and lose
    true = {"a": 90.0, "b": 100.0, "c": 95.0}
    timer = ScriptedTimer(true, first_penalty=20.0)
    best, medians = fastest(["a", "b", "c"], timer, rounds=5)
    assert timer.calls[:6] == ["a", "b", "c", "b", "c", "a"]
    assert best == "a" and medians == true  # each was first in at most 2 of 5 rounds
    one_round = fastest(["a", "b", "c"], ScriptedTimer(true, first_penalty=20.0), rounds=1)
    assert one_round[0] == "c"  # what a single timing per candidate would have picked


def test_bad_arguments_say_what_was_wrong():
    with pytest.raises(ValueError, match="rounds >= 1"):
        fastest(["a"], lambda c: 1.0, rounds=0)
    with pytest.raises(ValueError, match="0 candidates"):
        fastest([], lambda c: 1.0, rounds=3)
