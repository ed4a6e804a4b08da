"""What vLLM serves, as the key check reads it: the folder vLLM loaded the config from (a local
checkpoint, or the Hugging Face cache snapshot of a Hugging Face id, catalog or not), else the config
vLLM parsed (``hf_config``). Read offline: the cache is looked up, never fetched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from moepolicy.runtime.policy import ServedModel
from moepolicy.settings import hub_cache_dir


def served_cache_dir(download_dir: Optional[str] = None) -> Path:
    """The Hugging Face cache vLLM reads: ``--download-dir`` when given, else the hub cache as
    moepolicy's CLI finds it (``settings.hub_cache_dir``: the environment is read now, not at import)."""
    return Path(download_dir).expanduser() if download_dir else hub_cache_dir()


def cached_snapshot(repo_id: str, revision: Optional[str], cache: Optional[Path]) -> Optional[str]:
    """The snapshot folder holding ``repo_id``'s config.json in the cache (None: not cached)."""
    if cache is None or "/" not in repo_id:
        return None
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(
            repo_id=repo_id,
            filename="config.json",
            cache_dir=str(cache),
            revision=revision or None,
        )
    except Exception:  # noqa: BLE001 (a malformed id or cache: not found)
        return None
    return str(Path(found).parent) if isinstance(found, str) else None


def served_model(model_config: Any, download_dir: Optional[str] = None) -> ServedModel:
    """The :class:`ServedModel` for vLLM's ``model_config``."""
    name = str(getattr(model_config, "model", "") or "")
    if name and Path(name).expanduser().is_dir():
        return ServedModel(name, folder=str(Path(name).expanduser()))
    folder = cached_snapshot(
        name, getattr(model_config, "revision", None), served_cache_dir(download_dir)
    )
    if folder is not None:
        return ServedModel(name, folder=folder)
    hf_config = getattr(model_config, "hf_config", None)
    to_dict = getattr(hf_config, "to_dict", None)
    if callable(to_dict):
        return ServedModel(name, config=to_dict())
    return ServedModel(name)
