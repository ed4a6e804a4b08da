"""The re-measurement protocol against a bench whose noise is known: a gain smaller than the noise is
not claimed (beyond the interval's nominal 2.5 % false-claim rate, and in practice less, as selection
and report use separate rounds); a real one is; a drift of the machine over the rounds is not a gain."""

import pytest

from moepolicy.deepep.configs import ChunkConfig
from moepolicy.errors import TuningError
from moepolicy.testing.fakes import NoisyBench
from moepolicy.tuning.bench import TunePoint, Workload
from moepolicy.tuning.confirm import MIN_ROUNDS, ConfirmSettings, confirm_bucket, paired_speedup

WORK = Workload(2048, 128, 8, 2, "fp8")


def point(sms, send, tokens=1024):
    return TunePoint(sms, tokens, ChunkConfig(send, 256, 6, 128), ChunkConfig(10, 256, 6, 128))


DEFAULT, ENGINE = point(24, 24), point(20, 24)
TOP = [point(24, 28), point(24, 30), point(24, 32)]


def times(gain_of_top1: float, base: float = 500.0) -> dict:
    out = {DEFAULT: base, ENGINE: base * 1.2, TOP[1]: base, TOP[2]: base}
    out[TOP[0]] = base / gain_of_top1
    return out


def test_a_real_gain_beyond_the_noise_is_claimed_with_its_interval():
    bench = NoisyBench(times(1.15), sigma=0.03, seed=1)
    confirmed = confirm_bucket(bench, WORK, TOP, DEFAULT, ENGINE, ConfirmSettings(rounds=9, region="full", seed=0))
    assert confirmed.kept.name == "top1" and confirmed.kept.point == TOP[0]
    assert confirmed.vs_default.beyond_noise and confirmed.vs_default.low > 1.0
    assert confirmed.vs_default.low < (100 + 500) / (100 + 500 / 1.15) < confirmed.vs_default.high * 1.02
    assert confirmed.vs_engine.beyond_noise and confirmed.vs_engine.speedup > confirmed.vs_default.speedup
    assert bench.starts == 2  # selection and report each in a fresh bench


def test_no_gain_is_claimed_where_the_configs_are_equal_under_noise():
    claims = 0
    for seed in range(100):
        bench = NoisyBench(times(1.0), sigma=0.10, seed=seed)
        confirmed = confirm_bucket(bench, WORK, TOP, DEFAULT, ENGINE, ConfirmSettings(rounds=MIN_ROUNDS, region="full", seed=seed))
        if confirmed.kept.name != "default":
            claims += 1
            assert confirmed.vs_default.beyond_noise  # a kept config always carries its claim
        else:
            assert confirmed.vs_default.speedup == 1.0 and not confirmed.vs_default.beyond_noise
    assert claims <= 5, claims  # best-of-3 single samples would "win" about 3 times in 4


def test_a_gain_smaller_than_the_noise_is_not_claimed():
    claims = sum(confirm_bucket(NoisyBench(times(1.01), sigma=0.15, seed=s), WORK, TOP, DEFAULT, ENGINE,
                                ConfirmSettings(rounds=MIN_ROUNDS, region="full", seed=s)).kept.name != "default" for s in range(60))
    assert claims <= 4, claims


def test_a_machine_slowing_down_over_the_rounds_is_not_a_gain():
    # 0.5 % slower with every call: 40 % slower by the end; interleaving puts it on every config alike
    claims = sum(confirm_bucket(NoisyBench(times(1.0), sigma=0.02, seed=s, drift_per_call=0.005), WORK, TOP,
                                DEFAULT, ENGINE, ConfirmSettings(rounds=MIN_ROUNDS, region="full", seed=s)).kept.name != "default"
                 for s in range(30))
    assert claims <= 2, claims
    real = confirm_bucket(NoisyBench(times(1.10), sigma=0.02, seed=3, drift_per_call=0.005), WORK, TOP, DEFAULT,
                          ENGINE, ConfirmSettings(rounds=MIN_ROUNDS, region="full", seed=3))
    assert real.kept.name == "top1" and real.vs_default.beyond_noise


def test_too_few_rounds_are_refused():
    with pytest.raises(TuningError, match="at least 7"):
        confirm_bucket(NoisyBench(times(1.2), 0.01, 0), WORK, TOP, DEFAULT, ENGINE, ConfirmSettings(rounds=3, region="full", seed=0))


def test_paired_speedup_pairs_rounds_and_bounds_its_interval():
    base = [100.0, 200.0, 150.0, 120.0, 180.0, 90.0, 110.0]
    fast = [b / 1.25 for b in base]  # the same rounds, 1.25x faster each: no spread in the ratio
    ratio = paired_speedup(base, fast)
    assert ratio.speedup == pytest.approx(1.25) and ratio.low == pytest.approx(1.25)
    unpaired_spread = max(base) / min(base)
    assert ratio.high / ratio.low < unpaired_spread  # pairing removes the rounds' own drift
    with pytest.raises(ValueError):
        paired_speedup(base, fast[:3])
