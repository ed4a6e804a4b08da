"""The one definition of a reported GPU time (docs/BENCHMARKS.md, "How GPU times are taken"): every
rank times the same repetitions; each repetition counts its slowest rank; the median over the
repetitions is reported. The tuner's measurement and ``bench``'s reduction give the same time for
the same samples, on gloo ranks (the CUDA-event samples are given: the timer's boundary with the
GPU). Spawned ranks: the slow profile."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch", reason="the timer runs torch ranks")

from moepolicy.measure.timing import Timer  # noqa: E402
from moepolicy.testing import a2a_harness as H  # noqa: E402

# rank 1 is slow in repetitions 0-1, rank 0 in 2-3: the step's repetitions take 140, 140, 150, 150
SAMPLES = ([100.0, 100.0, 150.0, 150.0], [140.0, 140.0, 100.0, 100.0])
STEP_US = 145.0  # the median of the per-repetition maxima; the larger per-rank median is only 125


class ScriptedTimer(Timer):
    """The real timer with this rank's CUDA-event samples (its boundary with the GPU) given."""

    def __init__(self, samples: list[float]):
        self.device, self.group, self.collective = torch.device("cpu"), None, True
        self._samples = samples

    def samples(self, fn, reps: int = 30, warmup: int = 5, mode: str = "synced") -> list[float]:
        return list(self._samples)


def _step_times(rank: int, world: int, rendezvous: str, out: str) -> None:
    """The tuner's measurement (``live_bench.measure_point``) and the emulated bench's reduction
    (``timing.step_times``) of the same per-repetition samples, on gloo ranks."""
    import torch.distributed as dist

    from moepolicy.measure.timing import step_times
    from moepolicy.tuning.bench import TunePoint, Workload
    from moepolicy.tuning.live_bench import RankState, measure_point

    dist.init_process_group(
        "gloo", rank=rank, world_size=world, init_method=f"file://{rendezvous}"
    )
    state = RankState(None, rank, torch.device("cpu"), ScriptedTimer(SAMPLES[rank]), reps=4)
    never = SimpleNamespace(dispatch_only=None, combine=None)  # DeepEP's: the samples are given
    state.ops = lambda workload, point: never
    point = TunePoint(20, 1024, (24, 256, 6, 128), (10, 256, 6, 128))
    tuned = measure_point(state, Workload(7168, 256, 8, 2, "fp8"), point)
    bench = step_times(SAMPLES[rank])["median_us"]
    result = {"tuner": [tuned.dispatch_us, tuned.dispatch_cached_us, tuned.combine_us]}
    Path(out, f"rank{rank}.json").write_text(json.dumps({**result, "bench": bench}))
    dist.destroy_process_group()


def test_the_tuner_and_bench_report_a_step_as_its_slowest_rank_per_repetition(tmp_path):
    from moepolicy.measure.ranks import rendezvous_file

    H.run_ranks(_step_times, (2, rendezvous_file(), str(tmp_path)), 2, timeout_s=180)
    for rank in range(2):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got == {"tuner": [STEP_US] * 3, "bench": STEP_US}, got
