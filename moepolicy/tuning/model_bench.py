"""A cost model fitted to live measurements (``moepolicy/data/tuning/calibration/*.yaml``): the bench without GPUs.

Form (per region and op): ``us = a + rows * (b * row_bytes + c) / num_sms**alpha``, with ``rows`` the
expected received rows (tokens × destination ranks per token), ``alpha`` by grid search and
``a, b, c`` by least squares; chunk sizes away from DeepEP's defaults pay a penalty read off the
measured chunk sweeps. The full call adds the fitted layout/notify/CPU-wait overhead (measured at 20
SMs only, taken as independent of the SM count).

**Calibrated means measured nearby** (:class:`CalibratedEnvelope`): the GPU and EP size of a
calibration file, a hidden size it measured (not one between two it measured), and for each op
(dispatch, combine) an SM count it measured, or one between two measured SM counts, at a token count
inside the range it measured at those SM counts. The calibration of 2026-11-29 measured SM scaling
only at 4096 tokens per rank (dispatch 8-48 SMs, combine 20 and 24) and every 128/1024-token point
at 20 SMs, so an SM count other than 20 is calibrated only for a 4096-token bucket. Outside, the
tuner keeps DeepEP's defaults (``extrapolated``), or does not try the SM count.

**The model's error** is its held-out error (:func:`held_out_errors`): each calibration point left
out, the model refitted without it, its prediction compared with the measurement. A modelled SM
change is claimed only where the modelled speed-up exceeds that error at the chosen point
(``CalibratedEnvelope.error_at``); there is no interval, as a model has no round-to-round noise.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional

from moepolicy._resources import data_dir
from moepolicy.tuning.bench import (
    Bench,
    Envelope,
    Measurement,
    TunePoint,
    Workload,
    check_measurement,
    TrialFailed,
)

# the ops the objective sums (the full call's overhead: see the module's doc)
OPS = ("dispatch", "combine")


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
        return self.a + rows * (self.b * row_bytes + self.c) / sms**self.alpha


def _lstsq(xs, ys):
    import numpy as np

    coef, *_ = np.linalg.lstsq(np.array(xs, dtype=float), np.array(ys, dtype=float), rcond=None)
    return [max(float(v), 0.0) for v in coef]


def _fit(samples: list[tuple[float, float, int, float]], alpha: Optional[float] = None) -> Fit:
    """samples: (rows, row_bytes, sms, us)."""
    best = None
    for alpha_try in [alpha] if alpha else [a / 20 for a in range(10, 23)]:
        xs = [[1.0, r * rb / s**alpha_try, r / s**alpha_try] for r, rb, s, _ in samples]
        a, b, c = _lstsq(xs, [us for *_, us in samples])
        fit = Fit(alpha_try, a, b, c)
        err = sum(
            (math.log(max(fit(r, rb, s), 1e-3)) - math.log(us)) ** 2 for r, rb, s, us in samples
        )
        if best is None or err < best[0]:
            best = (err, fit)
    assert best is not None  # at least one alpha was tried
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
    # (op, hidden, num_sms, tokens lo, hi) measured
    cells: tuple[tuple[str, int, int, int, int], ...] = ()
    # (op, hidden, tokens, num_sms, held-out error)
    errors: tuple[tuple[str, int, int, int, float], ...] = ()


def _row_bytes(hidden: int, dtype: str) -> float:
    return hidden * 2.0 if dtype == "bf16" else hidden + 4.0 * math.ceil(hidden / 128)


@dataclass(frozen=True)
class Sample:
    """One calibration measurement the fits use: op (dispatch = the cached-handle kernel), shape, time."""

    op: str
    hidden: int
    tokens: int
    dtype: str
    sms: int
    rows: float
    row_bytes: float
    us: float


def calibration_samples(points: list[dict], ep: int) -> tuple[list[Sample], list[float]]:
    """The samples the dispatch and combine fits use (combine at DeepEP's default send chunk 10), and
    the full call's measured overheads over the cached kernel (same shape and SM count)."""
    samples, cached, full = [], {}, {}
    for p in points:
        rows = p["tokens"] * destination_ranks(p["experts"], p["top_k"], ep)
        rb = _row_bytes(p["hidden"], p["dtype"])
        for s, us in zip(p["num_sms"], p["us"]):
            key = (p["hidden"], p["tokens"], p["dtype"], s)
            if p["op"] == "dispatch" and p["region"] == "cached":
                samples.append(
                    Sample("dispatch", p["hidden"], p["tokens"], p["dtype"], s, rows, rb, us)
                )
                cached[key] = us
            elif p["op"] == "dispatch" and p["region"] == "full":
                full[key] = us
            elif p["op"] == "combine" and p.get("nvl_send", 10) == 10:
                samples.append(
                    Sample("combine", p["hidden"], p["tokens"], p["dtype"], s, rows, rb, us)
                )
    return samples, [full[k] - cached[k] for k in full if k in cached]


def fit_ops(samples: list[Sample]) -> tuple[Fit, Fit]:
    """The dispatch fit (its exponent by grid search) and the combine fit with the same exponent."""
    dfit = _fit([(x.rows, x.row_bytes, x.sms, x.us) for x in samples if x.op == "dispatch"])
    cfit = _fit(
        [(x.rows, x.row_bytes, x.sms, x.us) for x in samples if x.op == "combine"],
        alpha=dfit.alpha,
    )
    return dfit, cfit


def held_out_errors(samples: list[Sample]) -> list[tuple[Sample, float]]:
    """Leave-one-point-out: each sample left out, both fits refitted on the rest (the exponent too),
    the relative error of the prediction for the sample left out."""
    out = []
    for i, x in enumerate(samples):
        dfit, cfit = fit_ops(samples[:i] + samples[i + 1 :])
        fit = dfit if x.op == "dispatch" else cfit
        out.append((x, abs(fit(x.rows, x.row_bytes, x.sms) - x.us) / x.us))
    return out


def _cells(samples: list[Sample]) -> tuple[tuple[str, int, int, int, int], ...]:
    """Per op, hidden and SM count, the range of token counts measured there."""
    spans: dict[tuple[str, int, int], list[int]] = {}
    for x in samples:
        spans.setdefault((x.op, x.hidden, x.sms), []).append(x.tokens)
    return tuple(sorted((op, h, s, min(t), max(t)) for (op, h, s), t in spans.items()))


@lru_cache(maxsize=None)
def load_calibrations(folder: Optional[str] = None) -> tuple[Calibration, ...]:
    # the sheets' readers (YAML, Pydantic) load when a sheet is read
    from moepolicy.datasheets import read_yaml

    root = Path(folder) if folder else data_dir("tuning") / "calibration"
    by_key: dict[tuple[str, int], list] = {}
    for path in sorted(root.glob("*.yaml")):
        raw = read_yaml(path)
        prov = raw["provenance"]
        by_key.setdefault((prov["gpu"], int(prov["ep_size"])), []).append(
            (path.name, raw["points"])
        )
    out = []
    for (gpu, ep), files in by_key.items():
        every = [p for _, pts in files for p in pts]
        samples, overheads = calibration_samples(every, ep)
        dfit, cfit = fit_ops(samples)
        hiddens = sorted({p["hidden"] for p in every})
        sms = sorted({s for p in every for s in p["num_sms"]})
        tokens = sorted({p["tokens"] for p in every})
        errors = tuple(
            (x.op, x.hidden, x.tokens, x.sms, round(err, 4)) for x, err in held_out_errors(samples)
        )
        out.append(
            Calibration(
                gpu,
                ep,
                (hiddens[0], hiddens[-1]),
                dfit,
                cfit,
                sum(overheads) / len(overheads) if overheads else 50.0,
                tuple(name for name, _ in files),
                (sms[0], sms[-1]),
                (tokens[0], tokens[-1]),
                _cells(samples),
                errors,
            )
        )
    return tuple(out)


@dataclass(frozen=True)
class CalibratedEnvelope(Envelope):
    """Where the calibration measured, op by op (see the module's doc), and the model's held-out
    error there."""

    cells: tuple[tuple[str, int, int, int, int], ...] = ()
    errors: tuple[tuple[str, int, int, int, float], ...] = ()

    @property
    def hiddens(self) -> tuple[int, ...]:
        return tuple(sorted({h for _, h, *_ in self.cells}))

    def problem(self, workload: Workload, tokens: list[int]) -> Optional[str]:
        if workload.hidden not in self.hiddens:
            return (
                f"hidden {workload.hidden} was never measured (the calibration measured hidden "
                f"{' and '.join(map(str, self.hiddens))} only)"
            )
        if workload.regime != self.regime:
            return f"the calibration was timed in the {self.regime} regime, not {workload.regime}"
        outside = [t for t in tokens if not self.calibrated_sms(workload.hidden, t)]
        if outside:
            lo, hi = self.tokens
            return f"token bucket {outside[0]} is outside the calibrated {lo}-{hi} tokens per rank"
        return None

    def _span(self, op: str, hidden: int, sms: int) -> Optional[tuple[int, int]]:
        """The token counts calibrated for ``op`` at ``sms``: measured there, or (between two
        measured SM counts) measured at both neighbours."""
        measured = {s: (lo, hi) for o, h, s, lo, hi in self.cells if o == op and h == hidden}
        if sms in measured:
            return measured[sms]
        below = [s for s in measured if s < sms]
        above = [s for s in measured if s > sms]
        if not below or not above:
            return None
        (lo1, hi1), (lo2, hi2) = measured[max(below)], measured[min(above)]
        lo, hi = max(lo1, lo2), min(hi1, hi2)
        return (lo, hi) if lo <= hi else None

    def covers(self, hidden: int, tokens: int, sms: int) -> bool:
        spans = [self._span(op, hidden, sms) for op in OPS]
        return all(span is not None and span[0] <= tokens <= span[1] for span in spans)

    def calibrated_sms(
        self, hidden: int, tokens: int, candidates: Optional[list[int]] = None
    ) -> list[int]:
        """The SM counts (of ``candidates``, else every measured one) calibrated at ``tokens``."""
        pool = candidates if candidates is not None else sorted({s for *_, s, _, _ in self.cells})
        return [s for s in pool if self.covers(hidden, tokens, s)]

    def error_at(self, hidden: int, tokens: int, sms: int) -> Optional[float]:
        """The model's held-out error at a calibrated point: the largest leave-one-out error of the
        samples of this hidden size and token count at this SM count (or at the measured SM counts
        either side of it), over both ops. None outside the calibration."""
        if not self.covers(hidden, tokens, sms):
            return None
        near = []
        for op in OPS:
            at = sorted(
                {s for o, h, t, s, _ in self.errors if o == op and h == hidden and t == tokens}
            )
            if sms in at:
                near += [(op, sms)]
            else:
                near += (
                    [(op, max(s for s in at if s < sms)), (op, min(s for s in at if s > sms))]
                    if (any(s < sms for s in at) and any(s > sms for s in at))
                    else []
                )
        errors = [
            e for o, h, t, s, e in self.errors if h == hidden and t == tokens and (o, s) in near
        ]
        return max(errors) if errors else None


def _dispatch_penalty(send: int, recv: int) -> float:
    # measured on 2 x H200 (2026-11-29): send chunk 8 was 20-50 % slower than the default 24 at EP2; small rings stall senders.
    return (
        1.0
        + 0.35 * max(0, 24 - send) / 16
        + 0.04 * max(0, 256 - recv) / 128
        + 0.10 * max(0.0, send / (recv / 4) - 1)
    )


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
        # a pause per measurement, as a live trial takes time (tests interrupt tunes)
        self.delay_s = delay_s
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
        envelope = self.envelope(workload)
        assert envelope is not None  # calibrated here
        return envelope.problem(workload, [])

    def envelope(self, workload: Workload) -> Optional[Envelope]:
        """Where the calibration measured (:class:`CalibratedEnvelope`). Its timings are CUDA events
        around each call right after a barrier (the host's launch cost counts: the host regime). Chunk
        effects are hand-set from two sweeps, not fitted, so a modelled tune does not choose chunks."""
        cal = self._calibration(workload)
        if cal is None:
            return None
        return CalibratedEnvelope(
            cal.sms_range,
            cal.tokens_range,
            cal.hidden_range,
            regime="host",
            chunks_fitted=False,
            cells=cal.cells,
            errors=cal.errors,
        )

    def measure(self, workload: Workload, point: TunePoint) -> Measurement:
        if self.delay_s:  # lets tests interrupt or kill a tune mid-study
            time.sleep(self.delay_s)
        cal = self._calibration(workload)
        if cal is None:
            raise TrialFailed(f"model bench has no calibration for EP{workload.ep_size}")
        rows = point.tokens * destination_ranks(
            workload.num_experts, workload.top_k, workload.ep_size
        )
        rb = _row_bytes(workload.hidden, workload.payload)
        cached = cal.dispatch(rows, rb, point.num_sms) * _dispatch_penalty(
            point.dispatch[0], point.dispatch[1]
        )
        combine = cal.combine(
            rows, _row_bytes(workload.hidden, "bf16"), point.num_sms
        ) * _combine_penalty(point.combine[0], point.combine[1], workload.hidden)
        return check_measurement(
            Measurement(
                dispatch_us=cached + cal.full_overhead_us,
                dispatch_cached_us=cached,
                combine_us=combine,
                source="modelled",
            )
        )
