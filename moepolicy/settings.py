"""Every environment variable moepolicy reads, in one place (tests inject fakes as parameters instead).

| variable | effect |
|---|---|
| ``MOEPOLICY_OFFLINE`` (or ``HF_HUB_OFFLINE``) | a model name not in the catalog is never fetched from the Hugging Face hub |
| ``MOEPOLICY_TRITON_FAST_LAUNCH=0`` | the fp8 quantization kernels launch through Triton's binder (no direct launch) |
"""

from __future__ import annotations

import os


def offline() -> bool:
    """True when the hub must not be contacted for a model name outside the catalog."""
    return bool(os.environ.get("MOEPOLICY_OFFLINE") or os.environ.get("HF_HUB_OFFLINE"))


def triton_fast_launch() -> bool:
    return os.environ.get("MOEPOLICY_TRITON_FAST_LAUNCH", "1") != "0"
