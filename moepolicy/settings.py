"""Every environment variable moepolicy reads, in one place (tests inject fakes as parameters instead).

| variable | effect |
|---|---|
| ``MOEPOLICY_OFFLINE`` | never ask the network for a model: a Hugging Face id is read from the HF cache only |
| ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) | the same, as huggingface_hub means it ("1", "ON", "YES", "TRUE") |
| ``HF_ENDPOINT``, ``HF_TOKEN`` | read by huggingface_hub for model ids (the hub, the token) |
| ``HF_HUB_CACHE``, ``HUGGINGFACE_HUB_CACHE``, ``HF_HOME``, ``XDG_CACHE_HOME`` | the Hugging Face cache, by huggingface_hub's rule, read when it is looked in (``hub_cache_dir``) |
| ``MOEPOLICY_CACHE_DIR`` | where moepolicy keeps its own cache (the rule-pack lint); default ``$XDG_CACHE_HOME/moepolicy`` or ``~/.cache/moepolicy`` |
| ``MOEPOLICY_TRITON_FAST_LAUNCH=0`` | the fp8 quantization kernels launch through Triton's binder (no direct launch) |
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

_HF_TRUE = {"1", "ON", "YES", "TRUE"}  # huggingface_hub's own reading of a boolean variable
_OFF = {"", "0", "false", "no", "off"}


def moepolicy_offline() -> bool:
    """``MOEPOLICY_OFFLINE`` is set to anything but empty, 0, false, no or off."""
    return os.environ.get("MOEPOLICY_OFFLINE", "").strip().lower() not in _OFF


def hf_offline() -> bool:
    """huggingface_hub's offline mode: ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) is true."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in _HF_TRUE


def offline() -> bool:
    """True when the network must not be asked for a model (the Hugging Face cache is still read)."""
    return moepolicy_offline() or hf_offline()


def offline_reason() -> str:
    """Which variable keeps the network from being asked ("MOEPOLICY_OFFLINE is set"), or ''."""
    if moepolicy_offline():
        return "MOEPOLICY_OFFLINE is set"
    return "HF_HUB_OFFLINE is set" if hf_offline() else ""


def hub_endpoint() -> Optional[str]:
    """``HF_ENDPOINT`` as set now (None: huggingface_hub's default, https://huggingface.co)."""
    value = os.environ.get("HF_ENDPOINT", "").strip().rstrip("/")
    return value or None


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache as huggingface_hub finds it (its ``constants.py``), from the
    environment as set now (huggingface_hub reads it once, when imported): ``HF_HUB_CACHE``, else the
    legacy ``HUGGINGFACE_HUB_CACHE``, else ``HF_HOME/hub``, else ``huggingface/hub`` under
    ``XDG_CACHE_HOME`` or ``~/.cache``. The one reading: the CLI, the runtime and the vLLM plugin."""
    hub = _set("HF_HUB_CACHE") or _set("HUGGINGFACE_HUB_CACHE")
    if hub is None:
        home = _set("HF_HOME") or os.path.join(_set("XDG_CACHE_HOME") or "~/.cache", "huggingface")
        hub = os.path.join(home, "hub")
    return Path(os.path.expandvars(os.path.expanduser(hub)))


def _set(name: str) -> Optional[str]:
    """The variable's value, None where unset or blank."""
    return os.environ.get(name, "").strip() or None


def cache_dir() -> Path:
    """moepolicy's own cache folder (it may not exist yet)."""
    explicit = os.environ.get("MOEPOLICY_CACHE_DIR", "").strip()
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(xdg) if xdg else Path.home() / ".cache") / "moepolicy"


def triton_fast_launch() -> bool:
    return os.environ.get("MOEPOLICY_TRITON_FAST_LAUNCH", "1") != "0"
