"""Resolve a model argument to the raw JSON of its config files.

A model is named by a catalog name (``Qwen3-30B-A3B-FP8`` or ``Qwen/Qwen3-30B-A3B-FP8``), a path to
a ``config.json``, or a folder holding ``config.json`` and, where the checkpoint has one,
``hf_quant_config.json``. A name that is not in the catalog is fetched from the Hugging Face hub
(those two small files only) when ``MOEPOLICY_OFFLINE`` is unset and the hub answers.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from moepolicy.checkpoint import catalog
from moepolicy.errors import CheckpointError

_HUB = "https://huggingface.co/{repo}/resolve/main/{file}"
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


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


MAX_CONFIG_BYTES = 16 * 1024 * 1024  # config.json files are kilobytes; a quant config with long ignore lists, megabytes


def _read_json(path: Path) -> dict[str, Any]:
    from moepolicy.files import read_bounded

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
        raise CheckpointError(f"{path}: expected a JSON object at the top, got {type(data).__name__}")
    return data


def _from_folder(folder: Path, name: str, source: str) -> RawCheckpoint:
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{folder}: no config.json in this folder")
    quant_path = folder / "hf_quant_config.json"
    quant = _read_json(quant_path) if quant_path.is_file() else None
    return RawCheckpoint(
        name=name, source=source, config=_read_json(config_path), hf_quant_config=quant,
        config_path=str(config_path), hf_quant_path=str(quant_path),
    )


def _name_from_path(config_path: Path) -> str:
    """A local checkpoint's name: its folder's, as the user named it (``org__name`` → ``org/name``);
    never the config's ``_name_or_path``, which is often the uploader's own path."""
    parent = config_path.resolve().parent.name
    return parent.replace("__", "/", 1) if "__" in parent else parent


def _fetch_from_hub(repo_id: str) -> Optional[RawCheckpoint]:
    from moepolicy.settings import offline

    if offline():
        return None
    files: dict[str, dict[str, Any]] = {}
    for filename in ("config.json", "hf_quant_config.json"):
        url = _HUB.format(repo=repo_id, file=filename)
        try:
            with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 (fixed https host)
                files[filename] = json.loads(response.read().decode("utf-8"))
        except (urllib.error.URLError, OSError, ValueError, TimeoutError):
            if filename == "config.json":
                return None
    return RawCheckpoint(
        name=repo_id, source=f"hub:{repo_id}", config=files["config.json"],
        hf_quant_config=files.get("hf_quant_config.json"),
        config_path=f"{repo_id}/config.json", hf_quant_path=f"{repo_id}/hf_quant_config.json",
    )


def resolve(spec: str, hub: bool = True) -> RawCheckpoint:
    """Turn a model argument into a :class:`RawCheckpoint`, or raise :class:`CheckpointError`."""
    if not spec or not str(spec).strip():
        raise CheckpointError("no model given: pass a catalog name, a config.json or a model folder")
    path = Path(spec).expanduser()
    if path.is_dir():
        return _from_folder(path, _name_from_path(path / "config.json"), str(path))
    if path.is_file():
        config = _read_json(path)
        sibling = path.parent / "hf_quant_config.json"
        quant = _read_json(sibling) if sibling.is_file() else None
        return RawCheckpoint(
            name=_name_from_path(path), source=str(path), config=config,
            hf_quant_config=quant, config_path=str(path), hf_quant_path=str(sibling),
        )
    entry = catalog.lookup(spec)
    if entry is not None:
        return _from_folder(entry.folder, entry.repo_id, f"catalog:{entry.repo_id}")
    if spec.endswith(".json") or os.sep in spec and not _REPO_ID.match(spec):
        raise CheckpointError(f"{spec}: no such file or folder")
    if hub and _REPO_ID.match(spec):
        fetched = _fetch_from_hub(spec)
        if fetched is not None:
            return fetched
    close = catalog.close_names(spec)
    hint = f"; close catalog names: {', '.join(close)}" if close else ""
    raise CheckpointError(
        f"unknown model '{spec}': not a file, a folder or a catalog name"
        + (", and the Hugging Face hub could not be reached" if hub else " (the hub is not asked here)")
        + f"{hint} (see 'moepolicy models')"
    )
