"""Interrupts held back across storage steps are never held forever: a step that does not end (a
database server that stopped answering) must not swallow Ctrl-C."""

import signal
import time

import pytest

from moepolicy.tuning import interrupts
from moepolicy.tuning.interrupts import deferred


def test_a_held_interrupt_is_delivered_when_the_block_ends():
    with pytest.raises(KeyboardInterrupt):
        with deferred():
            signal.raise_signal(signal.SIGINT)
            done = True  # the block runs to its end first
    assert done


def test_a_second_interrupt_is_delivered_at_once_inside_the_block():
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with deferred():
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
            reached.append("after")
    assert reached == []


def test_an_interrupt_is_held_at_most_hold_max_s(monkeypatch):
    monkeypatch.setattr(interrupts, "HOLD_MAX_S", 0.3)
    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        with deferred():
            signal.raise_signal(signal.SIGINT)
            time.sleep(30)  # a storage call that never answers
    assert time.monotonic() - began < 10


def test_an_interrupt_into_a_block_already_past_hold_max_s_is_delivered_at_once(monkeypatch):
    monkeypatch.setattr(interrupts, "HOLD_MAX_S", 0.2)
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with deferred():
            time.sleep(0.3)
            signal.raise_signal(signal.SIGINT)
            reached.append("after")
    assert reached == []
