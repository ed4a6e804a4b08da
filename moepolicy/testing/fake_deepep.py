"""A fake DeepEP worker for the supervised live bench: no GPU, answers with the model bench, and
misbehaves on request so the watchdog, restarts and FAIL trials can be tested in CI.

``FakeWorker({2: "hang", 4: "die", 6: "raise", 7: "nan"})``: what to do on the bench's n-th
measurement (hang past the watchdog, kill the process as a device trap would, raise as a DeepEP host
assert does, or answer nonsense: ``nan``, ``negative``, ``tiny``). ``fake_worker`` misbehaves never.
"""

from __future__ import annotations

import os
import time
from typing import Mapping, Optional


class FakeWorker:
    """A worker process's target (picklable): the faults to inject, by measurement number."""

    def __init__(self, faults: Optional[Mapping[int, str]] = None):
        self.faults = dict(faults or {})

    def __call__(self, rank, world, rendezvous, buffer_bytes, commands, results, reps) -> None:
        _serve(rank, commands, results, self.faults)


fake_worker = FakeWorker()


def _serve(rank: int, commands, results, faults: Mapping[int, str]) -> None:
    """The live bench's own command loop (``serve_commands``) with a model-bench measurement."""
    from moepolicy.tuning.bench import Measurement
    from moepolicy.tuning.live_bench import serve_commands
    from moepolicy.tuning.model_bench import ModelBench

    bench = ModelBench("h200")

    def misbehave(token):
        fault = faults.get(token)
        if fault == "hang":
            time.sleep(3600)
        if fault == "die":
            os._exit(134)  # a device trap: the process dies and strands its peers
        if fault == "raise" and rank == 0:
            raise RuntimeError("injected host assert (x_scales->dim() == 2)")
        return fault

    def measure(token, workload, point):
        fault = misbehave(token)
        if rank != 0:
            return None
        m = bench.measure(workload, point)
        if fault == "nan":
            m = Measurement(float("nan"), m.dispatch_cached_us, m.combine_us, "measured")
        if fault == "negative":
            m = Measurement(-m.dispatch_us, m.dispatch_cached_us, m.combine_us, "measured")
        if fault == "tiny":
            m = Measurement(1e-3, 1e-3, 1e-3, "measured")
        return m

    def overlap(token, workload, point, gemm_shape):
        misbehave(token)
        return modelled_overlap(bench, workload, point, gemm_shape) if rank == 0 else None

    def v2(token, workload, point, tokens):
        misbehave(token)
        return modelled_v2(bench, workload, point, tokens) if rank == 0 else None

    serve_commands(rank, commands, results, {"measure": measure, "overlap": overlap, "v2": v2})


# a stand-in for DeepEP v2's analytical SM count (DeepEP computes it from the traffic; not modelled)
FAKE_ANALYTICAL_SMS = 24


def modelled_v2(bench, workload, point, tokens: int) -> float:
    """DeepEP v2 dispatch + combine as the model bench times the legacy kernels at that SM count
    (the analytical count a fixed stand-in; prefer-overlap off takes at least 64): a plumbing stand-in."""
    from moepolicy.datasheets import NEWEST_SHEET, deepep_sheet
    from moepolicy.deepep.configs import default_configs
    from moepolicy.tuning.bench import TunePoint

    sms = point.num_sms or (
        FAKE_ANALYTICAL_SMS if point.prefer_overlap else max(FAKE_ANALYTICAL_SMS, 64)
    )
    sms = min(sms, 48)  # inside the model bench's calibration
    default = default_configs(deepep_sheet(NEWEST_SHEET), workload.ep_size)
    return bench.measure(workload, TunePoint(sms, tokens, *default)).objective("full")


def modelled_overlap(bench, workload, point, gemm_shape, sm_count: int = 132) -> dict:
    """A stand-in overlap answer: the comm time from the model bench, a GEMM that scales with its
    SMs, imperfect overlap. Only for exercising the coordination on CPUs."""
    m = bench.measure(workload, point)
    comm = m.dispatch_us + m.combine_us
    gemm = (
        2
        * gemm_shape.rows
        * gemm_shape.hidden
        * gemm_shape.out
        / (6e6 * (sm_count - point.num_sms))
    )
    overlapped = max(comm, gemm) + 0.15 * min(comm, gemm)
    waited = (
        point.num_sms <= 24
    )  # as measured on H200: DeepEP enqueued after the GEMM waits for it
    gemm_first = comm + gemm if waited else overlapped

    def spread(v):
        return {"median_us": v, "min_us": v * 0.98, "max_us": v * 1.02, "reps": 5}

    return {
        "comm": spread(comm),
        "gemm": spread(gemm),
        "serial": spread(comm + gemm),
        "overlapped": spread(gemm_first),
        "overlapped_comm_end": spread(gemm_first if waited else comm * 1.1),
        "overlapped_gemm_end": spread(gemm * 1.05),
        "overlapped_comm_first": spread(overlapped),
        "comm_first_comm_end": spread(comm * 1.1),
        "comm_first_gemm_end": spread(gemm * 1.05),
        "comm_no_wait": spread(comm * 0.95),
        "overlapped_comm_first_no_wait": spread(overlapped * 0.97),
        "comm_first_no_wait_comm_end": spread(comm),
        "comm_first_no_wait_gemm_end": spread(gemm),
        "deepep_waited_for_gemm": waited,
        "floor_us": max(comm, gemm),
        "comm_sms": point.num_sms,
        "gemm_sms": sm_count - point.num_sms,
        "gemm_fp8": True,
        "gemm_tflop": 0.0,
        "gemm_kind": "modelled GEMM (fake DeepEP workers)",
    }
