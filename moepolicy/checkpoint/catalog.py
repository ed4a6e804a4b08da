"""The built-in catalog: trimmed copies of real checkpoint configs, shipped with their source notes."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from moepolicy._resources import data_dir


@dataclass(frozen=True)
class CatalogEntry:
    """One catalog model: ``org/name`` and the folder holding its config files."""

    repo_id: str
    folder: Path

    @property
    def short_name(self) -> str:
        return self.repo_id.split("/", 1)[-1]

    @property
    def partial(self) -> bool:
        """The copy lacks part of the real config (SOURCE.md: ``complete quantization_config: False``):
        plans from it can differ from plans from the checkpoint (GLM-4.6-FP8-dynamic: no weight
        strategy, so every MoE layer falls back)."""
        return PARTIAL_MARK in _source_text(self.folder)


PARTIAL_MARK = "complete quantization_config: False"


def _source_text(folder: Path) -> str:
    try:
        return (folder / "SOURCE.md").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""


@lru_cache(maxsize=1)
def entries() -> tuple[CatalogEntry, ...]:
    root = data_dir("catalog")
    found = []
    for folder in sorted(root.iterdir()):
        if (folder / "config.json").is_file() and "__" in folder.name:
            org, name = folder.name.split("__", 1)
            found.append(CatalogEntry(repo_id=f"{org}/{name}", folder=folder))
    return tuple(found)


def lookup(name: str) -> CatalogEntry | None:
    """Find ``name`` as ``org/name`` or as the bare ``name`` (case-insensitive)."""
    wanted = name.strip().lower()
    for entry in entries():
        if wanted in (entry.repo_id.lower(), entry.short_name.lower()):
            return entry
    return None


def close_names(name: str, limit: int = 3) -> list[str]:
    """Catalog names that look like ``name``, for an 'unknown model' message."""
    pool = {e.short_name.lower(): e.short_name for e in entries()}
    pool.update({e.repo_id.lower(): e.repo_id for e in entries()})
    hits = difflib.get_close_matches(name.lower(), list(pool), n=limit * 2, cutoff=0.5)
    seen: list[str] = []
    for hit in hits:
        short = pool[hit].split("/", 1)[-1]
        if short not in seen:
            seen.append(short)
    if not seen:  # substring fallback: 'qwen3' should still suggest the Qwen3 family
        seen = [e.short_name for e in entries() if name.lower() in e.repo_id.lower()]
    return seen[:limit]
