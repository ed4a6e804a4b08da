"""What an engine's launch serves for a policy: the model it names and the revision, for every export.

A policy records the model's name (``org/name``, or a local checkpoint's folder name) and its facts;
the plan (or tune) command it records (``generated.command``) says what ``--model`` was read: a
local folder, a Hugging Face cache folder, or a hub id with a revision (``org/name@rev``). A launch
serves what was read: the folder (a cache repository folder, ``models--org--name``, as the snapshot
its ``refs/main`` names: vLLM loads a snapshot, not the repository folder), or the id with
``--revision``; else the id, or a placeholder where only a folder could serve it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from moepolicy.document.model import PolicyDoc
from moepolicy.errors import CheckpointError


@dataclass(frozen=True)
class LaunchModel:
    """``model``: what the launch names; ``revision``: the hub revision the plan read (None: the
    default branch); ``note``: what it is and how the vLLM plugin matches it."""

    model: str
    revision: Optional[str]
    note: str

    def revision_args(self) -> list[str]:
        """``--revision REV`` (the same flag in vLLM and SGLang), or nothing for the default branch."""
        return ["--revision", self.revision] if self.revision else []


def served_model(doc: PolicyDoc) -> LaunchModel:
    """What a launch serves for ``doc`` (see the module's note)."""
    # the checkpoint reader: only when a launch needs the model's id or folder (here and below)
    from moepolicy.checkpoint import catalog

    name = doc.model.name
    matches = (
        f"the plugin matches the served model by its config's facts ({doc.model.facts_sha256[:12]}), "
        "not by name"
    )
    revision = planned_revision(doc)
    said = f" at revision {revision}, as planned" if revision else ""
    entry = catalog.lookup(name)
    if entry is not None:
        return LaunchModel(
            entry.repo_id, revision, matches if not said else f"{said[1:]}; {matches}"
        )
    folder = planned_folder(doc)
    if folder is not None:
        return LaunchModel(
            folder, None, f"the checkpoint folder the policy was planned from; {matches}"
        )
    if "/" in name and not name.startswith(("/", ".", "~")) and name.count("/") == 1:
        return LaunchModel(name, revision, f"served by Hugging Face id{said}; {matches}")
    return LaunchModel(
        f"<the folder of checkpoint {name}>",
        None,
        f"planned from a local checkpoint ({name}): serve its folder, any copy with the same config; {matches}",
    )


def planned_models(doc: PolicyDoc) -> list[str]:
    """The ``--model`` values of the command recorded in the policy (none when it records none)."""
    command = (doc.generated or {}).get("command")  # free-form: a hand edit may put anything there
    if not isinstance(command, str) or not command:
        return []
    try:
        words = shlex.split(command)
    except ValueError:
        return []
    given = [w.split("=", 1)[1] for w in words if w.startswith("--model=")]
    return given + [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--model"]


def planned_revision(doc: PolicyDoc) -> Optional[str]:
    """The revision of the hub id the plan read (``org/name@rev``, the policy's own ``org/name``)."""
    from moepolicy.checkpoint.hub import parse_id

    for spec in planned_models(doc):
        try:
            hub_id = parse_id(spec)
        except CheckpointError:  # a revision no hub accepts: the plan could not have read it
            continue
        if hub_id is not None and hub_id.revision and hub_id.repo_id == doc.model.name:
            return hub_id.revision
    return None


def planned_folder(doc: PolicyDoc) -> Optional[str]:
    """The ``--model`` folder the recorded command read, when it still exists and holds a checkpoint
    with the policy's facts: the folder itself, or for a Hugging Face cache repository folder the
    snapshot its ``refs/main`` names."""
    from moepolicy.checkpoint import read_model
    from moepolicy.checkpoint.hub import repo_snapshot

    for spec in planned_models(doc):
        path = Path(spec).expanduser()
        if not path.is_dir():
            continue
        if not (path / "config.json").exists():
            path = repo_snapshot(path) or path
        try:
            if read_model(str(path), hub=False).sha256() == doc.model.facts_sha256:
                return str(path.resolve())
        except Exception:  # noqa: BLE001 (an unreadable folder is simply not the one)
            continue
    return None
