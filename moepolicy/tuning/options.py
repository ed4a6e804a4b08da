"""What a tune is asked to do, as frozen values the CLI builds (no argparse below the CLI)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from moepolicy.errors import UsageError
from moepolicy.measure.rounds import DEFAULT_ROUNDS
from moepolicy.names import TUNED_REGIMES

DEFAULT_STORAGE = "sqlite:///moepolicy-studies.db"
DEFAULT_TRIALS = 24
OVERLAP_GEMMS = ("auto", "persistent", "persistent-clustered", "grouped", "dense")
OVERLAP_CONFINES = ("grid", "green")


@dataclass(frozen=True)
class OverlapOptions:
    """Choose DeepEP's SM share against the experts' GEMM on the other SMs (live bench only)."""

    gemm: str = "auto"  # the stand-in expert GEMM (OVERLAP_GEMMS)
    confine: str = "grid"  # how the GEMM is held to its SMs (OVERLAP_CONFINES)
    order: str = "gemm-first"  # the launch order the split is chosen for (tuning.overlap.ORDERS)
    confirm_rounds: int = DEFAULT_ROUNDS


@dataclass(frozen=True)
class TuneOptions:
    buckets: tuple[tuple[int, float], ...]  # (tokens per rank, weight)
    trials: Optional[int] = (
        None  # per (SM count, bucket) study; joint trials with ``overlap``; None: trials_for
    )

    def trials_for(self, chunks_fitted: bool) -> int:
        """The trials asked for, else 24, or 1 (DeepEP's default alone) on a bench whose chunk effects
        are not fitted: searching chunks there would choose among hand-set constants."""
        if self.trials is not None:
            return self.trials
        return DEFAULT_TRIALS if chunks_fitted else 1

    max_sms: Optional[int] = None  # SM budget for communication; None: the Pareto knee
    sms: tuple[int, ...] = ()  # explicit SM counts; empty: the search space's grid
    max_buffer_mb: int = 2048
    storage: str = DEFAULT_STORAGE
    study: Optional[str] = None  # default: from model and target
    seed: int = 0
    command: str = ""  # the command line, already redacted, recorded in the document
    overlap: Optional[OverlapOptions] = None
    regime: str = "host"  # Workload.regime: what the timings include (tuning.bench.REGIMES)
    confirm_rounds: int = DEFAULT_ROUNDS  # rotated rounds of each protocol phase (tuning.confirm)
    trial_timeout_s: float = 90.0  # the live bench's watchdog per trial

    def __post_init__(self) -> None:
        tuned = [r.value for r in TUNED_REGIMES]
        if self.regime not in tuned:
            raise UsageError(
                f"regime: a tune times {' or '.join(tuned)}, got {self.regime!r} (the run-ahead regime "
                "is timed by 'moepolicy bench POLICY --regime runahead')"
            )

    @property
    def max_buffer_bytes(self) -> int:
        return self.max_buffer_mb * 1024 * 1024 // 128 * 128
