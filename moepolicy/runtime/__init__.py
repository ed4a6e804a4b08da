"""The serving-side runtime: load a policy in one call, look layers up in constant time.

Importing this package (or :mod:`moepolicy`) imports neither optuna nor torch.
"""

from moepolicy.deepep.settings import DeepEPSettings
from moepolicy.runtime.loader import load_policy
from moepolicy.runtime.policy import LayerDecision, Policy

__all__ = ["DeepEPSettings", "LayerDecision", "Policy", "load_policy"]
