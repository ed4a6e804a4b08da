#!/usr/bin/env python3
"""How often the re-measurement protocol claims a gain, against a bench whose noise is known
(``moepolicy.testing.fakes.NoisyBench``), beside naive best-of-3 single samples. CPU only.

    python benchmarks/protocol_false_claims.py
"""

from __future__ import annotations


def main() -> int:
    from moepolicy.deepep.configs import ChunkConfig
    from moepolicy.testing.fakes import NoisyBench
    from moepolicy.tuning.bench import TunePoint, Workload
    from moepolicy.tuning.confirm import MIN_ROUNDS, ConfirmSettings, confirm_bucket

    work = Workload(2048, 128, 8, 2, "fp8")

    def point(send, sms=24):
        return TunePoint(sms, 1024, ChunkConfig(send, 256, 6, 128), ChunkConfig(10, 256, 6, 128))

    default, engine, top = point(24), point(24, sms=20), [point(28), point(30), point(32)]

    def times(gain: float) -> dict:
        return {default: 500.0, engine: 600.0, top[0]: 500.0 / gain, top[1]: 500.0, top[2]: 500.0}

    def claims(gain: float, sigma: float, runs: int, drift: float = 0.0) -> int:
        return sum(confirm_bucket(NoisyBench(times(gain), sigma, s, drift), work, top, default, engine,
                                  ConfirmSettings(MIN_ROUNDS, "full", s)).kept.name != "default" for s in range(runs))

    naive = 0
    for s in range(100):
        bench = NoisyBench(times(1.0), 0.10, s)
        d = bench.measure(work, default).objective()
        naive += min(bench.measure(work, p).objective() for p in top) < d
    print(f"4 equal configs, 10% noise, {MIN_ROUNDS} rounds: protocol claims {claims(1.0, 0.10, 100)}/100; "
          f"best-of-3 single samples beat the default {naive}/100")
    print(f"a 1% gain under 15% noise: claimed {claims(1.01, 0.15, 60)}/60")
    print(f"a 15% faster dispatch, 3% noise: kept {claims(1.15, 0.03, 30)}/30")
    print(f"equal configs, 0.5% drift per measurement, 2% noise: claimed {claims(1.0, 0.02, 30, 0.005)}/30")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
