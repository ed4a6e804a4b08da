"""``TuneOptions`` checks every option itself, so the library and the CLI refuse a bad value alike:
one line naming the option and its flag, the value seen and what to pass (before: through the
library, ``trials=0`` and ``max_buffer_mb=0`` ran and said "every trial failed", ``seed=-1`` raised a
bare numpy ValueError)."""

import pytest

import moepolicy
from moepolicy.errors import UsageError
from moepolicy.tuning.options import OverlapOptions, TuneOptions

BUCKETS = ((128, 1.0), (1024, 1.0))


@pytest.fixture(scope="module")
def plan():
    return moepolicy.plan("Qwen3-30B-A3B-FP8", moepolicy.TargetSpec(gpu="h200", ep_size=2))


@pytest.mark.parametrize(
    "option, value, said",
    [
        ("trials", 0, "trials (--trials) must be a whole number of at least 1, got 0"),
        (
            "max_buffer_mb",
            0,
            "max_buffer_mb (--max-buffer-mb) must be a whole number of at least 1",
        ),
        ("seed", -1, "seed (--seed) must be a whole number from 0 to 4294967295, got -1"),
        ("seed", 2**32, "seed (--seed) must be a whole number from 0 to 4294967295"),
        (
            "confirm_rounds",
            5,
            "confirm_rounds (--confirm-rounds) must be a whole number of at least 9",
        ),
        ("trial_timeout_s", float("inf"), "trial_timeout_s (--trial-timeout) must be a number"),
        ("max_sms", 1, "max_sms (--max-sms) must be a whole number of at least 2"),
        ("sms", (15,), "sms (--sms) takes even, positive SM counts, got 15"),
        ("trials", "3", "trials (--trials) must be a whole number of at least 1, got '3'"),
    ],
)
def test_the_library_refuses_a_bad_option_in_one_line_naming_its_flag(plan, option, value, said):
    with pytest.raises(UsageError) as info:
        moepolicy.tune(plan, bench="model", tokens=[128], **{option: value})
    message = str(info.value)
    assert message.startswith(said) and "\n" not in message and ": pass " in message
    assert info.value.field == option


def test_options_built_directly_are_checked_the_same_way():
    with pytest.raises(UsageError, match=r"^buckets \(--tokens\) needs at least one token bucket"):
        TuneOptions(buckets=())
    with pytest.raises(UsageError, match=r"^buckets \(--tokens\) needs positive token counts"):
        TuneOptions(buckets=((128, 0.0),))
    with pytest.raises(UsageError, match=r"^overlap_order \(--overlap-order\) is not one"):
        OverlapOptions(order="sideways")
    with pytest.raises(UsageError, match=r"^confirm_rounds \(--confirm-rounds\)"):
        OverlapOptions(confirm_rounds=3)
    assert TuneOptions(buckets=BUCKETS, trials=1, seed=2**32 - 1).seed == 2**32 - 1


@pytest.mark.parametrize(
    "flag, value, said",
    [
        ("--trials", "0", "--trials must be a whole number of at least 1, got 0: pass 1 or more"),
        ("--seed", "-1", "--seed must be a whole number from 0 to 4294967295, got -1"),
        ("--confirm-rounds", "7", "--confirm-rounds must be a whole number of at least 9, got 7"),
    ],
)
def test_the_cli_says_the_same_with_the_flag_alone(tmp_path, flag, value, said):
    from conftest import run_cli

    result = run_cli(
        "tune",
        "--model",
        "Qwen3-30B-A3B-FP8",
        "--ep-size",
        "2",
        "--bench",
        "model",
        f"{flag}={value}",
        "--storage",
        f"sqlite:///{tmp_path}/s.db",
        "-o",
        str(tmp_path / "p.yaml"),
    )
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert said in last and f"({flag})" not in last, last
