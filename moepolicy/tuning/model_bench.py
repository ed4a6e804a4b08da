"""A cost model fitted to live measurements (``moepolicy/data/tuning/calibration/*.yaml``): the bench without GPUs.

Form (per region and op): ``us = a + rows * (b * row_bytes + c) / num_sms**alpha``, with ``rows`` the
expected received rows (tokens × destination ranks per token), ``alpha`` by grid search and
``a, b, c`` by least squares; chunk sizes away from DeepEP's defaults pay a penalty read off the
measured chunk sweeps. The full call adds the fitted layout/notify/CPU-wait overhead. Inside the
measured envelope (same GPU and EP size, hidden within the calibrated range) answers are
``modelled``; outside, the tuner uses DeepEP's defaults labelled ``extrapolated``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional

from moepolicy._resources import data_dir
from moepolicy.tuning.bench import Bench, Envelope, Measurement, TunePoint, Workload, check_measurement


def destination_ranks(num_experts: int, top_k: int, ep_size: int) -> float:
    """Expected ranks a token is sent to under uniform routing (top-k of E without replacement)."""
    local = num_experts // ep_size
    miss = math.comb(num_experts - local, top_k) / math.comb(num_experts, top_k)
    return ep_size * (1 - miss)


@dataclass(frozen=True)
class Fit:
    alpha: float
    a: float
    b: float
    c: float

    def __call__(self, rows: float, row_bytes: float, sms: int) -> float:
        return self.a + rows * (self.b * row_bytes + self.c) / sms ** self.alpha


def _lstsq(xs, ys):
    import numpy as np

    coef, *_ = np.linalg.lstsq(np.array(xs, dtype=float), np.array(ys, dtype=float), rcond=None)
    return [max(float(v), 0.0) for v in coef]


def _fit(samples: list[tuple[float, float, int, float]], alpha: Optional[float] = None) -> Fit:
    """samples: (rows, row_bytes, sms, us)."""
    best = None
    for alpha_try in ([alpha] if alpha else [a / 20 for a in range(10, 23)]):
        xs = [[1.0, r * rb / s ** alpha_try, r / s ** alpha_try] for r, rb, s, _ in samples]
        a, b, c = _lstsq(xs, [us for *_, us in samples])
        fit = Fit(alpha_try, a, b, c)
        err = sum((math.log(max(fit(r, rb, s), 1e-3)) - math.log(us)) ** 2 for r, rb, s, us in samples)
        if best is None or err < best[0]:
            best = (err, fit)
    return best[1]


@dataclass(frozen=True)
class Calibration:
    gpu: str
    ep_size: int
    hidden_range: tuple[int, int]
    dispatch: Fit
    combine: Fit
    full_overhead_us: float
    files: tuple[str, ...]
    sms_range: tuple[int, int] = (8, 48)
    tokens_range: tuple[int, int] = (128, 4096)


def _row_bytes(hidden: int, dtype: str) -> float:
    return hidden * 2.0 if dtype == "bf16" else hidden + 4.0 * math.ceil(hidden / 128)


@lru_cache(maxsize=None)
def load_calibrations(folder: Optional[str] = None) -> tuple[Calibration, ...]:
    from moepolicy.datasheets import read_yaml

    root = Path(folder) if folder else data_dir("tuning") / "calibration"
    by_key: dict[tuple[str, int], list] = {}
    for path in sorted(root.glob("*.yaml")):
        raw = read_yaml(path)
        prov = raw["provenance"]
        by_key.setdefault((prov["gpu"], int(prov["ep_size"])), []).append((path.name, raw["points"]))
    out = []
    for (gpu, ep), files in by_key.items():
        disp, comb, cached, full = [], [], {}, {}
        for _, points in files:
            for p in points:
                rows = p["tokens"] * destination_ranks(p["experts"], p["top_k"], ep)
                rb = _row_bytes(p["hidden"], p["dtype"])
                for s, us in zip(p["num_sms"], p["us"]):
                    key = (p["hidden"], p["tokens"], p["dtype"], s)
                    if p["op"] == "dispatch" and p["region"] == "cached":
                        disp.append((rows, rb, s, us))
                        cached[key] = us
                    elif p["op"] == "dispatch" and p["region"] == "full":
                        full[key] = us
                    elif p["op"] == "combine" and p.get("nvl_send", 10) == 10:
                        comb.append((rows, rb, s, us))
        dfit = _fit(disp)
        cfit = _fit(comb, alpha=dfit.alpha)
        overheads = [full[k] - cached[k] for k in full if k in cached]
        every = [p for _, pts in files for p in pts]
        hiddens = sorted({p["hidden"] for p in every})
        sms = sorted({s for p in every for s in p["num_sms"]})
        tokens = sorted({p["tokens"] for p in every})
        out.append(Calibration(gpu, ep, (hiddens[0], hiddens[-1]), dfit, cfit,
                               sum(overheads) / len(overheads) if overheads else 50.0,
                               tuple(name for name, _ in files), (sms[0], sms[-1]), (tokens[0], tokens[-1])))
    return tuple(out)


def _dispatch_penalty(send: int, recv: int) -> float:
    # measured on 2 x H200 (2026-11-29): send chunk 8 was 20-50 % slower than the default 24 at EP2; small rings stall senders.
    return 1.0 + 0.35 * max(0, 24 - send) / 16 + 0.04 * max(0, 256 - recv) / 128 + 0.10 * max(0.0, send / (recv / 4) - 1)


def _combine_penalty(send: int, recv: int, hidden: int) -> float:
    # measured on 2 x H200 (2026-11-29): combine send chunk 12 vs default 10: -11 % at hidden 2048, +1.4 % at hidden 7168.
    best = 12 if hidden <= 4096 else 10
    return 1.0 + 0.03 * abs(send - best) + 0.04 * max(0, 256 - recv) / 128


class ModelBench(Bench):
    name = "model"
    source = "modelled"
    noise_free = True

    def __init__(self, gpu: str, calibration_folder: Optional[str] = None, delay_s: float = 0.0):
        self.gpu = gpu
        self.delay_s = delay_s  # a pause per measurement, as a live trial takes time (tests interrupt tunes)
        self.calibrations = load_calibrations(calibration_folder)

    def identity(self) -> str:
        return f"model bench for {self.gpu} ({', '.join(f for c in self.calibrations for f in c.files)})"

    def _calibration(self, workload: Workload) -> Optional[Calibration]:
        for cal in self.calibrations:
            if cal.gpu == self.gpu and cal.ep_size == workload.ep_size:
                return cal
        return None

    def in_envelope(self, workload: Workload, gpu: str) -> Optional[str]:
        cal = self._calibration(workload)
        if cal is None:
            have = ", ".join(f"{c.gpu} EP{c.ep_size}" for c in self.calibrations) or "none"
            return f"no calibration for {gpu} EP{workload.ep_size} (calibrated: {have})"
        return self.envelope(workload).problem(workload, [])

    def envelope(self, workload: Workload) -> Optional[Envelope]:
        """The calibration's ranges. Its timings are CUDA events around each call right after a
        barrier (the host's launch cost counts: the host regime). Chunk effects are hand-set from two
        sweeps, not fitted, so a modelled tune does not choose chunks."""
        cal = self._calibration(workload)
        if cal is None:
            return None
        return Envelope(cal.sms_range, cal.tokens_range, cal.hidden_range, regime="host", chunks_fitted=False)

    def measure(self, workload: Workload, point: TunePoint) -> Measurement:
        if self.delay_s:  # lets tests interrupt or kill a tune mid-study
            time.sleep(self.delay_s)
        cal = self._calibration(workload)
        if cal is None:
            from moepolicy.tuning.bench import TrialFailed

            raise TrialFailed(f"model bench has no calibration for EP{workload.ep_size}")
        rows = point.tokens * destination_ranks(workload.num_experts, workload.top_k, workload.ep_size)
        rb = _row_bytes(workload.hidden, workload.payload)
        cached = cal.dispatch(rows, rb, point.num_sms) * _dispatch_penalty(point.dispatch[0], point.dispatch[1])
        combine = cal.combine(rows, _row_bytes(workload.hidden, "bf16"), point.num_sms) * _combine_penalty(
            point.combine[0], point.combine[1], workload.hidden)
        return check_measurement(Measurement(dispatch_us=cached + cal.full_overhead_us, dispatch_cached_us=cached,
                                             combine_us=combine, source="modelled"))
