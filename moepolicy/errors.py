"""One exception root with a few meaningful leaves.

Messages state the rule, the value seen and the fix. The CLI prints ``str(error)`` as one line and
exits with the leaf's ``exit_code``; nothing here ever reaches a user as a traceback.
"""

from __future__ import annotations


class MoePolicyError(Exception):
    """Root of every error moepolicy raises on purpose. Its message is always one line."""

    exit_code = 1

    def __init__(self, message: object = "", *, field: str | None = None) -> None:
        super().__init__(one_line(str(message)))
        # the input the message starts with, in library words (``ep_size``); the CLI names its flag
        self.field = field


class UsageError(MoePolicyError):
    """A command-line argument is missing or contradicts another one."""

    exit_code = 2


class CheckpointError(MoePolicyError):
    """A checkpoint config is missing, malformed, or lacks a field a plan needs."""

    exit_code = 3


class RulePackError(MoePolicyError):
    """A rule pack or capability sheet failed validation when it was loaded."""

    exit_code = 4


class InfeasibleError(MoePolicyError):
    """The target cannot serve the model at all (DeepEP would refuse or trap)."""

    exit_code = 5


class PolicyError(MoePolicyError):
    """A policy file is missing or unreadable, damaged, of an unsupported version, does not match its key, or would not apply in serving."""

    exit_code = 6


class TuningError(MoePolicyError):
    """The tuner cannot go on (a study that does not match, no usable bench: no GPU or DeepEP for --bench live)."""

    exit_code = 7


def one_line(message: str) -> str:
    """Fold a message onto one line, as the CLI contract asks."""
    return " ".join(str(message).split())


class OutputError(MoePolicyError):
    """An output path cannot be written (no such folder, not a regular file, read-only, disk full)."""

    exit_code = 8


class MeasurementError(MoePolicyError):
    """A benchmark could not measure (no GPU or DeepEP to run on, a rank failed or died)."""

    exit_code = 9


def carry(exc: BaseException, **notes: str) -> None:
    """Attach ``notes`` (``moepolicy_outcome``, ``moepolicy_stream``) to ``exc`` on its way to the
    CLI's handler, which reads them with ``getattr`` (any exception may carry them, or none)."""
    for name, value in notes.items():
        setattr(exc, name, value)
