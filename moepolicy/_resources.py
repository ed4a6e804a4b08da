"""Where the package's data lives: ``moepolicy/data/`` (rule packs, data sheets, the policy JSON
Schema, the tuner's spaces and calibration, the model catalog), shipped inside the package."""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"


def data_dir(name: str) -> Path:
    """The data folder ``name``: ``rules``, ``sheets``, ``tuning`` or ``catalog``."""
    path = DATA / name
    if not path.is_dir():
        raise FileNotFoundError(f"moepolicy data folder '{name}' is missing from the installation ({path})")
    return path


def data_file(name: str) -> Path:
    """A file directly under ``moepolicy/data`` (``policy.schema.json``)."""
    return DATA / name
