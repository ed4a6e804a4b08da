"""``--model`` of ``validate`` and ``export``, checked as serving checks it.

The vLLM plugin checks the policy against the snapshot vLLM loaded (its folder). A catalog name
(``Qwen3-30B-A3B-FP8``, ``org/name``) would otherwise be read from moepolicy's own copy of its config,
which can differ from the real one (a *partial* copy lacks part of it): where the Hugging Face cache
holds the snapshot vLLM would serve, that snapshot is checked, as the plugin does; else the copy is,
and a line says so (a warning for a partial copy). A folder, a ``config.json`` or a hub id outside the
catalog is read as the plugin reads it already.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from moepolicy.errors import CheckpointError
from moepolicy.runtime.policy import ServedModel
from moepolicy.settings import offline_reason


@dataclass(frozen=True)
class CheckedModel:
    """``model``: what ``load_policy`` is given (None: no ``--model``); ``said``: what was checked,
    in one line (empty where it is what serving reads anyway); ``warn``: said as a warning."""

    model: Union[str, ServedModel, None]
    said: str = ""
    warn: bool = False


def checked_model(spec: Optional[str]) -> CheckedModel:
    """What ``--model spec`` is checked as (see the module's note)."""
    import os

    from moepolicy.checkpoint import catalog
    from moepolicy.checkpoint.hub import cached_snapshot, parse_id

    if not spec or os.path.exists(os.path.expanduser(spec)):
        return CheckedModel(spec)
    try:
        hub_id = parse_id(spec)
    except CheckpointError:
        return CheckedModel(spec)  # load_policy says why, as serving would
    entry = catalog.lookup(spec) if hub_id is None or hub_id.revision is None else None
    if entry is None:
        return CheckedModel(spec)
    snapshot = cached_snapshot(entry.repo_id)
    if snapshot is not None:
        return CheckedModel(
            ServedModel(entry.repo_id, folder=str(snapshot)),
            f"--model {spec}: checked against the snapshot vLLM serves from the Hugging Face cache "
            f"({snapshot}), as the plugin checks it",
        )
    if entry.partial:
        return CheckedModel(
            spec,
            f"--model {spec}: checked against moepolicy's catalog copy of its config, which lacks part "
            "of the real one (partial); the plugin checks the snapshot vLLM serves and may decide "
            f"otherwise: {_own_config(entry.repo_id)}",
            warn=True,
        )
    return CheckedModel(
        spec,
        f"--model {spec}: checked against moepolicy's catalog copy of its config (no snapshot in the "
        "Hugging Face cache); the plugin checks the snapshot vLLM serves",
    )


def _own_config(repo_id: str) -> str:
    """How to check the checkpoint's own config: download it into the cache (validate then reads it),
    or, offline, where no download can work, what can."""
    from moepolicy.checkpoint.hub import real_config_words

    if offline_reason():
        return f"pass {real_config_words(repo_id)}"
    return f"download it first (hf download {repo_id} config.json) or pass its folder"
