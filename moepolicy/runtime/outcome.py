"""What a serving process would do with a policy, said where the policy is checked (``validate``,
``export``): :func:`load_policy` itself is run, so the prediction is its decision, made by the same key
checks (:mod:`moepolicy.runtime.keycheck`) against the rule packs and sheets installed here.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping, Optional

APPLIED, DECISIONS_ONLY, SAFE = "applied", "decisions_only", "safe"

# where a sub-check left unchecked here would be checked (by the flag, or only in the serving process)
_HOW_TO_CHECK = {"model_facts": "--model", "ep_layout": "--ep-size", "ep_size": "--ep-size"}


@dataclass(frozen=True)
class ServingOutcome:
    """``state``: applied (decisions and DeepEP configs), decisions_only (DeepEP's defaults), or safe
    (bf16 on the wire everywhere); ``reason`` is load_policy's own when it falls back."""

    state: str
    reason: Optional[str]
    report: Mapping[str, str]
    details: tuple[str, ...]

    @property
    def falls_back(self) -> bool:
        return self.state != APPLIED

    def _named(self, status: str) -> list[str]:
        """Sub-check names (``rule_packs``) with ``status``, from load_policy's details."""
        return [
            line.split(":", 1)[0].split(".", 1)[-1]
            for line in self.details
            if f": {status} (" in line
        ]

    def summary(self, engine: Optional[str] = None) -> str:
        """One line: what serving does with the policy. ``engine``: ``vllm`` (the plugin), ``runtime``
        (``load_policy`` in one's own serving code) or None (both, where they differ)."""
        if self.state == SAFE:
            stale = any(name in (self.reason or "") for name in ("rule_packs", "data_sheets"))
            runtime = "load_policy gives the safe policy (bf16 on the wire on every layer, DeepEP's default configs)"
            plugin = "the vLLM plugin applies nothing (vLLM runs as it is)"
            what = {"vllm": plugin, "runtime": runtime}.get(engine or "", f"{runtime}; {plugin}")
            return f"serving would fall back: {what}: {self.reason}" + (
                "; plan and serve with the same moepolicy: re-plan with this one" if stale else ""
            )
        if self.state == DECISIONS_ONLY:
            runtime = "load_policy runs DeepEP's default configs"
            plugin = "the vLLM plugin leaves DeepEP's SM count, buffers and configs to vLLM"
            what = {"vllm": plugin, "runtime": runtime}.get(engine or "", f"{runtime}; {plugin}")
            return (
                f"serving would keep the decisions, not the policy's DeepEP settings ({what}): "
                f"{self.reason}; plan (or tune) again for the target it serves to use its own"
            )
        unchecked = self._named("unchecked")
        flags = [
            flag
            for flag in ("--model", "--ep-size")
            if any(_HOW_TO_CHECK.get(name) == flag for name in unchecked)
        ]
        rest = [name for name in unchecked if name not in _HOW_TO_CHECK]
        parts = [f"matched here: {', '.join(self._named('matched')) or 'nothing'}"]
        parts += (
            [f"pass {' and '.join(flags)} to check the served model and EP size"] if flags else []
        )
        parts += [f"checked only where it serves: {', '.join(rest)}"] if rest else []
        return f"serving applies this policy ({'; '.join(parts)})"


def predict(
    path: str | Path,
    *,
    ep_size: Optional[int] = None,
    model: Optional[str] = None,
    schedule: Optional[str] = None,
) -> ServingOutcome:
    """What ``load_policy(path, ep_size=..., model=..., schedule=...)`` decides in this process."""
    from moepolicy.runtime.loader import load_policy

    with _silenced("moepolicy"):  # the caller says it in one line
        policy = load_policy(path, ep_size=ep_size, model=model, schedule=schedule)
    state = (
        SAFE if not policy.keeps_decisions else DECISIONS_ONLY if policy.is_fallback else APPLIED
    )
    return ServingOutcome(
        state, policy.fallback_reason, dict(policy.report), tuple(policy.report_details)
    )


@contextmanager
def _silenced(name: str) -> Iterator[None]:
    logger = logging.getLogger(name)
    drop = logging.Filter(name + ".__none__")  # passes no record of this logger
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)
