"""The protocol behind a tune's claims (``tuning.confirm``) against benches whose true times are known
(``moepolicy.testing.claims_sim``): selection, gate and report in fresh benches; the SM count moves
only on one weighted test with no bucket slower beyond noise; chunk claims with Holm's correction; the
figures printed come from rounds that decided nothing."""

import math

import pytest

from moepolicy.errors import TuningError
from moepolicy.testing.claims_sim import (
    BASE_US,
    BUCKETS,
    CHOSEN_SMS,
    ENGINE_SMS,
    WORK,
    Gains,
    KnownBench,
    Noise,
    _point,
    serial_tune,
)
from moepolicy.tuning.confirm import BucketCandidates, ConfirmSettings, run_protocol


def test_a_real_sm_gain_passes_the_gate_and_is_reported_from_fresh_rounds():
    done = serial_tune("iid", seed=1, rounds=15, gains=Gains((1.3, 1.3, 1.3)))
    assert done.num_sms == CHOSEN_SMS and done.gate.moved and done.gate.sms.faster
    assert 1.0 < done.weighted.low < 1.3 < done.weighted.high  # the report rounds' interval
    for c in done.buckets.values():
        assert c.kept.point.num_sms == CHOSEN_SMS and c.vs_engine.low > 1.0
        assert c.report.rounds == 15 and c.vs_engine.family == 3  # simultaneous over the buckets


class PhaseBench(KnownBench):
    """The engine's default is 1.3x slower than 48 SMs while the protocol decides, 1.6x once it
    reports (the 2nd start of the workers: no top configs to select among, the gate, the report): a
    figure printed from the report cannot be the gate's."""

    def __init__(self):
        super().__init__(self.true, Noise("iid", 0.01, 0))
        self.starts = 0

    def restart(self):
        self.starts += 1
        super().restart()

    def true(self, point):
        slow = 1.6 if self.starts >= 2 else 1.3
        return BASE_US[point.tokens] * (slow if point.num_sms == ENGINE_SMS else 1.0)


def test_the_printed_figures_come_from_the_report_rounds_not_the_gate():
    bench = PhaseBench()
    buckets = [
        BucketCandidates(t, w, (), _point(CHOSEN_SMS, t), _point(ENGINE_SMS, t))
        for t, w in BUCKETS
    ]
    done = run_protocol(bench, WORK, buckets, ConfirmSettings(9, "full", 0, choose_chunks=True))
    assert bench.starts == 2
    assert done.gate.sms.speedup == pytest.approx(1.3, rel=0.02)  # what decided
    assert done.weighted.speedup == pytest.approx(1.6, rel=0.02)  # what is printed
    assert all(c.vs_engine.speedup == pytest.approx(1.6, rel=0.03) for c in done.buckets.values())
    # the why (tune's first line, audit's, provenance.why) says the report's figure, never the gate's
    # (the 2.2 protocol printed "x1.300 faster" here, from the rounds that decided)
    assert "report rounds: x1.5" in done.why and "x1.3" not in done.why
    for c in done.buckets.values():  # the per-bucket notes say what the gate decided, no figure
        assert " x1." not in c.selection


def test_a_bucket_slower_beyond_noise_blocks_the_sm_count_and_is_printed_as_a_loss():
    # weighted over the buckets the chosen SM count is faster (the 4096 bucket dominates), but 128 tokens lose 10 %
    done = serial_tune("iid", seed=3, rounds=15, gains=Gains((0.9, 1.0, 1.5)), sigma=0.02)
    assert done.gate.sms.faster and done.gate.losses[128].slower
    assert done.num_sms == ENGINE_SMS and "T=128: slower beyond noise" in done.why
    assert "engine's default kept" in done.why and " x1." not in done.why  # no gate figure


def test_a_net_loss_is_almost_never_kept():
    # x0.95 / x0.95 / x1.03 (a net loss): the case, kept in 55 % of tunes by the 2.1 protocol
    moved = sum(
        serial_tune("iid", seed=s, rounds=15, gains=Gains((0.95, 0.95, 1.03))).num_sms
        != ENGINE_SMS
        for s in range(20)
    )
    assert moved <= 1, moved


def test_where_the_engines_default_is_kept_the_report_holds_its_own_times():
    done = serial_tune("iid", seed=5, rounds=9, gains=Gains((1.0, 1.0, 1.0)), sigma=0.2)
    assert done.num_sms == ENGINE_SMS and "engine's default kept" in done.why
    for tokens, c in done.buckets.items():
        assert c.kept.name == "engine" and c.vs_engine is None and c.vs_default is None
        assert (
            c.times_us["kept"] == c.times_us["engine"] == pytest.approx(BASE_US[tokens], rel=0.3)
        )
        assert c.report.rounds == 9


def test_chunk_claims_are_tested_together_with_holms_correction():
    done = serial_tune("iid", seed=7, rounds=15, gains=Gains(chunks=1.1), chosen=ENGINE_SMS)
    assert (
        done.num_sms == ENGINE_SMS and done.gate.sms is None
    )  # the search proposed the engine's count
    for c in done.buckets.values():
        assert c.kept.name == "top1" and c.kept.point.dispatch[0] == 28  # the truly faster chunks
        assert c.gate["chunks_vs_default"]["correction"] == "Holm over 3 buckets"
        assert c.gate["chunks_vs_default"]["verdict"] == "faster"
        assert "speedup" not in c.gate["chunks_vs_default"]  # the decision's statistics only
        assert c.vs_default.low > 1.0 and c.vs_default.family == 3


def test_too_few_rounds_are_refused():
    bench = KnownBench(lambda p: 100.0, Noise("iid", 0.01, 0))
    buckets = [BucketCandidates(128, 1.0, (), _point(CHOSEN_SMS, 128), _point(ENGINE_SMS, 128))]
    with pytest.raises(TuningError, match="at least 9"):
        run_protocol(bench, WORK, buckets, ConfirmSettings(5))


def test_a_warm_up_pass_is_dropped_after_every_start():
    class SlowStart(KnownBench):
        """No noise; the first measurement after each start of the workers is 1.5x slow."""

        fresh = True

        def restart(self):
            self.fresh = True

        def measure(self, workload, point):
            got = super().measure(workload, point)
            slow, self.fresh = (1.5 if self.fresh else 1.0), False
            return type(got)(got.dispatch_us * slow, 0.0, got.combine_us * slow, "measured")

    bench = SlowStart(lambda p: BASE_US[p.tokens], Noise("iid", 0.0, 0))
    buckets = [
        BucketCandidates(t, w, (), _point(CHOSEN_SMS, t), _point(ENGINE_SMS, t))
        for t, w in BUCKETS
    ]
    done = run_protocol(bench, WORK, buckets, ConfirmSettings(9))
    assert all(math.isclose(c.times_us["engine"], BASE_US[t]) for t, c in done.buckets.items())
    assert not done.gate.moved  # equal times: no round may carry the 1.5x start-up
