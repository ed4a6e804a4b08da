"""The serving-side runtime: load a policy in one call, look layers up in constant time.

Importing this package (or :mod:`moepolicy`) imports neither optuna nor torch.
"""

from moepolicy.runtime.loader import load_policy
from moepolicy.runtime.policy import DeepEPSettings, LayerDecision, Policy

__all__ = ["DeepEPSettings", "LayerDecision", "Policy", "load_policy"]
