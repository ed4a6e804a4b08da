"""Where the package's data lives: ``moepolicy/data/`` (rule packs, data sheets, the policy JSON
Schema, the tuner's spaces and calibration, the model catalog), shipped inside the package."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

DATA = Path(__file__).resolve().parent / "data"


def data_dir(name: str) -> Path:
    """The data folder ``name``: ``rules``, ``sheets``, ``tuning`` or ``catalog``."""
    path = DATA / name
    if not path.is_dir():
        raise FileNotFoundError(
            f"moepolicy data folder '{name}' is missing from the installation ({path})"
        )
    return path


def data_file(name: str) -> Path:
    """A file directly under ``moepolicy/data`` (``policy.schema.json``)."""
    return DATA / name


def sheet_files(deepep_sheet: str) -> list[Path]:
    """The data sheets a plan for a target on ``deepep_sheet`` reads: that DeepEP capability sheet
    (``deepep-legacy-29d31c0`` is ``sheets/deepep/legacy-29d31c0.yaml``), the expert kernels, the GPUs."""
    sheets = data_dir("sheets")
    return [
        sheets / "deepep" / f"{deepep_sheet.removeprefix('deepep-')}.yaml",
        sheets / "expert_kernels.yaml",
        sheets / "gpus.yaml",
    ]


def sheets_sha256(
    deepep_sheet: str, read: Optional[Callable[[Path], Optional[bytes]]] = None
) -> str:
    """One hash of those sheets' bytes (the decision key's ``sheets_sha256``); light: no YAML parsed.
    ``read`` gives a file's bytes, or None for a missing one (the runtime passes a bounded reader)."""
    import hashlib

    read = read or (lambda path: path.read_bytes() if path.is_file() else None)
    digest = hashlib.sha256()
    for path in sheet_files(deepep_sheet):
        data = read(path)
        digest.update(path.name.encode() + b"\0" + (b"missing" if data is None else data) + b"\0")
    return digest.hexdigest()
