"""Where the package's data folders are: inside the installed package, else the source tree."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

_PKG = Path(__file__).resolve().parent


@lru_cache(maxsize=None)
def data_dir(name: str) -> Path:
    """Return the folder ``name`` (``policies``, ``tuning`` or ``catalog``).

    A wheel carries them under ``moepolicy/_data``; a source checkout (editable install, tests run
    from the tree) has them at the repository's top level.
    """
    for candidate in (_PKG / "_data" / name, _PKG.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"moepolicy data folder '{name}' is missing from the installation")
