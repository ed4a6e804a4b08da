"""Checkpoint config → normalised per-layer facts.

``read_model(spec, engine=...)`` accepts a catalog name, a ``config.json`` path, a model folder (a
Hugging Face cache snapshot included) or a Hugging Face id (``org/name[@revision]``).
"""

from moepolicy.checkpoint.reader import read_model
from moepolicy.checkpoint.source import RawCheckpoint, resolve

__all__ = ["RawCheckpoint", "read_model", "resolve"]
