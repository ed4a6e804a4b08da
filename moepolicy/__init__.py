"""moepolicy: per-layer quantize-before/after-dispatch policies and tuned DeepEP configs.

The runtime entry point is :func:`load_policy`; importing this package imports neither optuna nor
torch (serving processes import it).
"""

from __future__ import annotations

from moepolicy._version import __version__

__all__ = ["__version__", "load_policy"]


def __getattr__(name: str):
    if name == "load_policy":
        from moepolicy.runtime.loader import load_policy

        return load_policy
    raise AttributeError(f"module 'moepolicy' has no attribute {name!r}")
