"""The contract every bench must meet (live DeepEP or calibrated model), shipped as a test base
class in the style of optuna.testing: subclass it and provide ``bench`` and ``workload`` fixtures."""

from __future__ import annotations

import math

from moepolicy.deepep.configs import ChunkConfig
from moepolicy.tuning.bench import Bench, Measurement, TunePoint, Workload

DEFAULT_EP2 = (ChunkConfig(24, 256, 6, 132), ChunkConfig(10, 256, 6, 132))


class BenchContract:
    def point(self, tokens: int = 1024, sms: int = 24) -> TunePoint:
        return TunePoint(sms, tokens, *DEFAULT_EP2)

    def test_measures_positive_finite_times(self, bench: Bench, workload: Workload):
        m = bench.measure(workload, self.point())
        assert isinstance(m, Measurement)
        for value in (m.dispatch_us, m.dispatch_cached_us, m.combine_us):
            assert math.isfinite(value) and value > 0.5
        assert m.source == bench.source

    def test_full_call_is_not_cheaper_than_the_cached_kernel(
        self, bench: Bench, workload: Workload
    ):
        m = bench.measure(workload, self.point())
        assert m.dispatch_us >= 0.9 * m.dispatch_cached_us  # layout + notify + CPU wait on top

    def test_more_tokens_take_longer(self, bench: Bench, workload: Workload):
        small = bench.measure(workload, self.point(tokens=128)).objective("cached")
        large = bench.measure(workload, self.point(tokens=8192)).objective("cached")
        assert large > small

    def test_envelope_answer_is_none_or_a_reason(self, bench: Bench, workload: Workload):
        answer = bench.in_envelope(workload, "h200")
        assert answer is None or (isinstance(answer, str) and answer)
