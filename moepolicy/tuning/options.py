"""What a tune is asked to do, as frozen values the CLI and the library build alike (no argparse
below the CLI). Every option is checked here, once: a bad value is one line naming the option and
its command-line flag, the value seen and what to pass instead, whoever built the options."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, TypeGuard

from moepolicy.errors import UsageError
from moepolicy.measure.rounds import DEFAULT_ROUNDS, MIN_ROUNDS
from moepolicy.names import TUNED_REGIMES

DEFAULT_STORAGE = "sqlite:///moepolicy-studies.db"
# The timing regime the engines run DeepEP high-throughput in: vLLM runs it eager (CUDA graphs are
# off for DeepEP HT with DP > 1) with a dispatch that blocks the host on its receive counts; SGLang's
# normal (high-throughput) mode likewise runs its prefill eager.
ENGINE_REGIME = "host"
DEFAULT_TRIALS = 24
OVERLAP_GEMMS = ("auto", "persistent", "persistent-clustered", "grouped", "dense")
OVERLAP_CONFINES = ("grid", "green")
OVERLAP_ORDERS = ("gemm-first", "comm-first", "comm-first-no-wait", "mean")
MAX_TRIAL_TIMEOUT_S = 86400.0  # the live watchdog: a day per trial at most
MAX_SEED = 2**32 - 1  # optuna's samplers seed numpy, which takes 0 to 2**32 - 1

# the option's flag where it is not the option's name with dashes
FLAGS = {"buckets": "--tokens", "study": "--study", "trial_timeout_s": "--trial-timeout"}


def flag(field: str) -> str:
    """The command-line flag of option ``field`` (``max_buffer_mb`` -> ``--max-buffer-mb``)."""
    return FLAGS.get(field, "--" + field.replace("_", "-"))


def refuse(field: str, rule: str, value: object, fix: str) -> UsageError:
    """The one-line error for option ``field``: its name and flag, the rule, the value, the fix."""
    return UsageError(f"{field} ({flag(field)}) {rule}, got {value!r}: {fix}", field=field)


def _whole(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(field: str, value: object, low: int, high: Optional[int], fix: str) -> None:
    if not _whole(value) or value < low or (high is not None and value > high):
        rule = (
            f"must be a whole number from {low} to {high}"
            if high is not None
            else f"must be a whole number of at least {low}"
        )
        raise refuse(field, rule, value, fix)


@dataclass(frozen=True)
class OverlapOptions:
    """Choose DeepEP's SM share against the experts' GEMM on the other SMs (live bench only)."""

    gemm: str = "auto"  # the stand-in expert GEMM (OVERLAP_GEMMS)
    confine: str = "grid"  # how the GEMM is held to its SMs (OVERLAP_CONFINES)
    order: str = "gemm-first"  # the launch order the split is chosen for (OVERLAP_ORDERS)
    confirm_rounds: int = DEFAULT_ROUNDS

    def __post_init__(self) -> None:
        for field, value, allowed in (
            ("overlap_gemm", self.gemm, OVERLAP_GEMMS),
            ("overlap_confine", self.confine, OVERLAP_CONFINES),
            ("overlap_order", self.order, OVERLAP_ORDERS),
        ):
            if value not in allowed:
                raise refuse(field, "is not one the overlap search knows", value, _one_of(allowed))
        _check_rounds(self.confirm_rounds)


def _one_of(allowed) -> str:
    return "pass one of " + ", ".join(allowed)


def _check_rounds(rounds: object) -> None:
    _check_int(
        "confirm_rounds",
        rounds,
        MIN_ROUNDS,
        None,
        f"pass at least {MIN_ROUNDS}, the fewest in which every claim of a tune can pass its test "
        f"with Holm's correction over three buckets (default {DEFAULT_ROUNDS})",
    )


@dataclass(frozen=True)
class TuneOptions:
    buckets: tuple[tuple[int, float], ...]  # (tokens per rank, weight)
    # per (SM count, bucket) study; joint trials with ``overlap``; None: trials_for
    trials: Optional[int] = None

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
    regime: str = ENGINE_REGIME  # Workload.regime: what the timings include (tuning.bench.REGIMES)
    # balanced rounds of each protocol phase (tuning.protocol)
    confirm_rounds: int = DEFAULT_ROUNDS
    trial_timeout_s: float = 90.0  # the live bench's watchdog per trial

    def __post_init__(self) -> None:
        self._check_buckets()
        if self.trials is not None:
            _check_int("trials", self.trials, 1, None, "pass 1 or more, or none for the default")
        if self.max_sms is not None:
            _check_int("max_sms", self.max_sms, 2, None, "pass an SM budget of 2 or more")
        self._check_sms()
        _check_int(
            "max_buffer_mb", self.max_buffer_mb, 1, None, "pass the NVLink buffer budget in MB"
        )
        _check_int("seed", self.seed, 0, MAX_SEED, "pass a seed from 0 to 2**32 - 1")
        if not isinstance(self.storage, str) or not self.storage.strip():
            raise refuse("storage", "must be an optuna storage URL", self.storage, DEFAULT_STORAGE)
        if self.study is not None and (not isinstance(self.study, str) or not self.study.strip()):
            raise refuse("study", "must be a study name", self.study, "pass a name, or none")
        _check_rounds(self.confirm_rounds)
        self._check_timeout()
        tuned = [r.value for r in TUNED_REGIMES]
        if self.regime not in tuned:
            raise UsageError(
                f"regime: a tune times {' or '.join(tuned)}, got {self.regime!r} (the run-ahead regime "
                "is timed by 'moepolicy bench POLICY --regime runahead')",
                field="regime",
            )

    def _check_buckets(self) -> None:
        fix = (
            "pass positive token counts per rank, e.g. 128,1024,4096, each with a positive weight"
        )
        if not self.buckets:
            raise refuse("buckets", "needs at least one token bucket", self.buckets, fix)
        for bucket in self.buckets:
            pair = isinstance(bucket, (tuple, list)) and len(bucket) == 2
            tokens, weight = bucket if pair else (None, None)
            ok_weight = isinstance(weight, (int, float)) and math.isfinite(weight) and weight > 0
            if not (_whole(tokens) and tokens > 0 and ok_weight):
                raise refuse("buckets", "needs positive token counts and weights", bucket, fix)

    def _check_sms(self) -> None:
        if not isinstance(self.sms, tuple):
            raise refuse("sms", "takes a tuple of SM counts", self.sms, "pass e.g. (20, 24)")
        for s in self.sms:
            if not _whole(s) or s <= 0 or s % 2:
                raise refuse("sms", "takes even, positive SM counts", s, "pass e.g. 20,24")

    def _check_timeout(self) -> None:
        value = self.trial_timeout_s
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not (number and math.isfinite(value) and 0 < value <= MAX_TRIAL_TIMEOUT_S):
            raise refuse(
                "trial_timeout_s",
                f"must be a number of seconds above 0, at most {MAX_TRIAL_TIMEOUT_S:.0f} (the live "
                "watchdog; nan and inf would turn it off)",
                value,
                "pass e.g. 90",
            )

    @property
    def max_buffer_bytes(self) -> int:
        return self.max_buffer_mb * 1024 * 1024 // 128 * 128
