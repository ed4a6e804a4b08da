"""Resolve a model argument to the raw JSON of its config files.

A model is named by a catalog name (``Qwen3-30B-A3B-FP8`` or ``Qwen/Qwen3-30B-A3B-FP8``), a path to
a ``config.json``, a folder holding ``config.json`` and, where the checkpoint has one,
``hf_quant_config.json`` (a snapshot of the Hugging Face cache included), or a Hugging Face id
(``org/name[@revision]``) read through huggingface_hub (:mod:`moepolicy.checkpoint.hub`): those two
small files only, from the HF cache, downloaded first unless offline.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from moepolicy.checkpoint import catalog, hub
from moepolicy.errors import CheckpointError
from moepolicy.files import read_bounded
from moepolicy.settings import offline_reason, offline


@dataclass(frozen=True)
class RawCheckpoint:
    """The two config files of a checkpoint, as parsed JSON, and where they came from."""

    name: str
    source: str
    config: dict[str, Any]
    hf_quant_config: Optional[dict[str, Any]] = None
    config_path: str = "config.json"
    hf_quant_path: str = "hf_quant_config.json"
    notes: tuple[str, ...] = field(default_factory=tuple)


MAX_CONFIG_BYTES = hub.MAX_CONFIG_BYTES  # one bound, before a download and for every read


def _read_json(path: Path) -> dict[str, Any]:
    try:
        text = read_bounded(path, MAX_CONFIG_BYTES, CheckpointError).decode("utf-8")
    except UnicodeDecodeError:
        raise CheckpointError(f"{path}: is not UTF-8 text; expected a JSON config") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CheckpointError(
            f"{path}: malformed JSON at line {exc.lineno} column {exc.colno} ({exc.msg})"
        ) from None
    except (RecursionError, ValueError) as exc:
        raise CheckpointError(f"{path}: unreadable JSON ({type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise CheckpointError(
            f"{path}: expected a JSON object at the top, got {type(data).__name__}"
        )
    return data


def _from_folder(folder: Path, name: str, source: str) -> RawCheckpoint:
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{folder}: no config.json in this folder")
    quant_path = folder / "hf_quant_config.json"
    quant = _read_json(quant_path) if quant_path.is_file() else None
    return RawCheckpoint(
        name=name,
        source=source,
        config=_read_json(config_path),
        hf_quant_config=quant,
        config_path=str(config_path),
        hf_quant_path=str(quant_path),
    )


def _name_from_path(config_path: Path) -> str:
    """A local checkpoint's name: ``org/name`` for a snapshot of the Hugging Face cache
    (``models--org--name/snapshots/<commit>``), else its folder's, as the user named it (``org__name`` →
    ``org/name``); never the config's ``_name_or_path``, which is often the uploader's own path. The
    folder is taken as written (a cache snapshot's files are links into ``blobs/``)."""
    folder = Path(os.path.abspath(config_path)).parent
    from_cache = hub.snapshot_repo_id(folder)
    if from_cache is not None:
        return from_cache
    parent = folder.resolve().name
    return parent.replace("__", "/", 1) if "__" in parent else parent


def _from_hub(hub_id: hub.HubId, network: bool, why_offline: str) -> RawCheckpoint:
    files = hub.fetch(hub_id, network=network, why_offline=why_offline)
    quant = _read_json(files.quant) if files.quant is not None else None
    return RawCheckpoint(
        name=hub_id.repo_id,
        source=f"hub:{hub_id.repo_id}@{files.commit}",
        config=_read_json(files.config),
        hf_quant_config=quant,
        config_path=str(files.config),
        hf_quant_path=str(files.quant or files.config.parent / "hf_quant_config.json"),
        notes=files.notes,
    )


def _why_offline(hub_allowed: bool) -> str:
    if not hub_allowed:
        return "a serving process never asks the network for a model"
    reason = offline_reason()
    return f"{reason}: the hub was not asked" if reason else ""


def _from_local(path: Path) -> Optional[RawCheckpoint]:
    """A folder (a model folder, a cache snapshot, or a cache repo folder ``models--org--name``) or a
    ``config.json`` path; None when ``path`` is neither."""
    if path.is_dir():
        snapshot = hub.repo_snapshot(path) if not (path / "config.json").exists() else None
        folder = snapshot or path
        return _from_folder(folder, _name_from_path(folder / "config.json"), str(path))
    if path.is_file():
        config = _read_json(path)
        sibling = path.parent / "hf_quant_config.json"
        quant = _read_json(sibling) if sibling.is_file() else None
        return RawCheckpoint(
            name=_name_from_path(path),
            source=str(path),
            config=config,
            hf_quant_config=quant,
            config_path=str(path),
            hf_quant_path=str(sibling),
        )
    return None


def _close_names(spec: str, limit: int = 3) -> list[str]:
    """The catalog's short names and the Hugging Face cache's ids closest to a bare name, closest
    first (a cached id by its name part)."""
    import difflib

    found = catalog.close_names(spec, limit=limit * 2)
    found += [r for r in hub.close_ids(spec, limit=limit * 2) if catalog.lookup(r) is None]

    def likeness(candidate: str) -> float:
        name = candidate.split("/", 1)[-1].lower()
        return difflib.SequenceMatcher(None, spec.lower(), name).ratio()

    return sorted(dict.fromkeys(found), key=likeness, reverse=True)[:limit]


def resolve(spec: str, hub: bool = True) -> RawCheckpoint:
    """Turn a model argument into a :class:`RawCheckpoint`, or raise :class:`CheckpointError`.

    In order: a folder or ``config.json``; a catalog name (the catalog stays first for its names); a
    Hugging Face id ``org/name[@revision]`` through huggingface_hub. With ``hub`` False (the runtime)
    or offline (``MOEPOLICY_OFFLINE``, ``HF_HUB_OFFLINE``) an id is read from the Hugging Face cache
    only, never from the network.
    """
    return _resolve(spec, hub)


def _resolve(spec: str, hub_allowed: bool) -> RawCheckpoint:
    if not spec or not str(spec).strip():
        raise CheckpointError(
            "no model given: pass a catalog name, a Hugging Face id (org/name), a config.json "
            "or a model folder"
        )
    local = _from_local(Path(spec).expanduser())
    if local is not None:
        return local
    if spec.endswith(".json"):
        raise CheckpointError(f"{spec}: no such file")
    hub_id = hub.parse_id(spec)
    entry = catalog.lookup(spec) if hub_id is None or hub_id.revision is None else None
    if entry is not None:
        return _from_folder(entry.folder, entry.repo_id, f"catalog:{entry.repo_id}")
    if hub_id is not None:
        network = hub_allowed and not offline()
        return _from_hub(hub_id, network, _why_offline(hub_allowed))
    if os.sep in spec:
        raise CheckpointError(f"{spec}: no such file or folder")
    close = _close_names(spec)
    hint = f"; did you mean: {', '.join(close)}" if close else ""
    raise CheckpointError(
        f"unknown model '{spec}': not a file, a folder, a catalog name or a Hugging Face id (org/name){hint} "
        "(see 'moepolicy models')"
    )
