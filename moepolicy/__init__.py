"""moepolicy: per-layer quantize-before/after-dispatch policies and tuned DeepEP configs.

The front door (``moepolicy.api``)::

    import moepolicy
    plan = moepolicy.plan("Qwen3-30B-A3B-FP8", moepolicy.TargetSpec(gpu="h200", ep_size=8))
    moepolicy.write_policy(moepolicy.tune(plan, bench="model"), "policy.yaml")
    policy = moepolicy.load_policy("policy.yaml", model="Qwen/Qwen3-30B-A3B-FP8", ep_size=8)

Names are imported on first use: importing this package imports neither optuna nor torch nor the
planner (serving processes import it for :func:`load_policy` alone).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from moepolicy._version import __version__

_WHERE = {
    "plan": "moepolicy.api",
    "tune": "moepolicy.api",
    "write_policy": "moepolicy.api",
    "policy_document": "moepolicy.api",
    "load_policy": "moepolicy.runtime.loader",
    "Plan": "moepolicy.planner",
    "TargetSpec": "moepolicy.target",
    "TuneOptions": "moepolicy.tuning.options",
    "MoePolicyError": "moepolicy.errors",
    "PolicyError": "moepolicy.errors",
}

__all__ = ["__version__", *_WHERE]

if TYPE_CHECKING:  # for type checkers and editors; at run time names load on first use
    from moepolicy.api import plan as plan
    from moepolicy.api import policy_document as policy_document
    from moepolicy.api import tune as tune
    from moepolicy.api import write_policy as write_policy
    from moepolicy.errors import MoePolicyError as MoePolicyError
    from moepolicy.errors import PolicyError as PolicyError
    from moepolicy.planner import Plan as Plan
    from moepolicy.runtime.loader import load_policy as load_policy
    from moepolicy.target import TargetSpec as TargetSpec
    from moepolicy.tuning.options import TuneOptions as TuneOptions


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'moepolicy' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
