"""Check a loaded policy's two key parts against what this process can observe.

Each sub-check is matched, mismatched or unchecked; GPU and DeepEP facts come only from modules the
process already imported or from NVML, never by importing torch or deep_ep.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from moepolicy.document.reader import PolicyView


@dataclass(frozen=True)
class SubCheck:
    part: str  # decision | tuning
    name: str
    status: str  # matched | mismatched | unchecked
    detail: str

    def render(self) -> str:
        return f"{self.part}.{self.name}: {self.status} ({self.detail})"


def _read_from(source: str) -> str:
    """Where a plain name's facts were read, in words: the catalog, the Hugging Face cache, a path."""
    if source.startswith("catalog:"):
        return "moepolicy's catalog"
    if source.startswith("hub:"):
        return f"the Hugging Face cache, {source[len('hub:') :]}"
    return f"the local path {source}"


def _served_facts(model, engine: str):
    """The served model's facts and where they were read: a :class:`ServedModel` from its folder
    (local or a Hugging Face cache snapshot) or from the config the engine parsed; a plain name from
    a local folder or the catalog (never the network: a serving process does not fetch)."""
    from moepolicy.checkpoint import read_model
    from moepolicy.runtime.policy import ServedModel

    if not isinstance(model, ServedModel):
        facts = read_model(str(model), engine=engine, hub=False)
        return facts, _read_from(facts.source)
    import dataclasses

    from moepolicy.checkpoint.reader import facts_from_raw
    from moepolicy.checkpoint.source import RawCheckpoint, resolve

    if model.folder:
        raw = dataclasses.replace(resolve(model.folder, hub=False), name=model.name)
        return facts_from_raw(raw, engine=engine), f"the served folder {model.folder}"
    if model.config is not None:
        raw = RawCheckpoint(
            name=model.name,
            source=f"served:{model.name}",
            config=dict(model.config),
            hf_quant_config=dict(model.quant_config) if model.quant_config else None,
        )
        return facts_from_raw(raw, engine=engine), "the config the engine loaded"
    facts = read_model(model.name, engine=engine, hub=False)
    return facts, _read_from(facts.source)


def _facts_check(doc: PolicyView, model) -> SubCheck:
    if model is None:
        return SubCheck("decision", "model_facts", "unchecked", "no model given to load_policy")
    from moepolicy.errors import CheckpointError

    try:  # a serving process never reaches the network for this
        facts, where = _served_facts(model, doc.target.engine)
    except CheckpointError as exc:  # a model that cannot be resolved cannot be shown to match
        return SubCheck("decision", "model_facts", "mismatched", f"model could not be read: {exc}")
    sha = facts.sha256()
    if sha == doc.model.facts_sha256:
        return SubCheck(
            "decision", "model_facts", "matched", f"{facts.name} facts {sha[:12]} (from {where})"
        )
    return SubCheck(
        "decision",
        "model_facts",
        "mismatched",
        f"{facts.name} facts {sha[:12]} (from {where}) != policy's {doc.model.facts_sha256[:12]} "
        f"({doc.model.name})",
    )


def _arch_check(doc: PolicyView) -> SubCheck:
    from moepolicy.hardware import current_arch

    arch, how = current_arch()
    if arch is None:
        return SubCheck("decision", "gpu_arch", "unchecked", how)
    status = "matched" if arch == doc.target.arch else "mismatched"
    return SubCheck("decision", "gpu_arch", status, f"{arch} from {how}; policy {doc.target.arch}")


def _layout_check(
    doc: PolicyView, ep_size: Optional[int], layout: Optional[str] = None
) -> SubCheck:
    """The EP layout: as the engine says it runs (``layout``), else inferred from ``ep_size`` and
    the policy's GPUs per node (which cannot see EP 8 served on 2 nodes of 4 GPUs)."""
    if layout is not None:
        status = "matched" if layout == doc.target.layout else "mismatched"
        return SubCheck(
            "decision",
            "ep_layout",
            status,
            f"the engine runs {layout}; policy {doc.target.layout}",
        )
    if ep_size is None:
        return SubCheck("decision", "ep_layout", "unchecked", "no ep_size given")
    layout = "intranode" if ep_size <= doc.target.gpus_per_node else "internode"
    status = "matched" if layout == doc.target.layout else "mismatched"
    return SubCheck(
        "decision",
        "ep_layout",
        status,
        f"EP{ep_size} with {doc.target.gpus_per_node}/node is {layout}; policy {doc.target.layout}",
    )


def _packs_check(doc: PolicyView, places: Sequence[Path]) -> SubCheck:
    """Each rule pack the plan used, against its file now: a built-in pack in moepolicy's data, a
    user pack by its name in ``places`` (what the caller named, the policy's folder), never at a
    path the policy gives; what is found does not depend on the working folder."""
    import hashlib

    from moepolicy._resources import data_dir
    from moepolicy.files import read_bounded
    from moepolicy.document.reader import MAX_PACK_BYTES, find_user_pack
    from moepolicy.errors import PolicyError

    changed, missing, checked = [], [], 0
    builtin = data_dir("rules")
    for ref in doc.rules.packs:
        if not _is_name(ref.name):
            return SubCheck(
                "decision", "rule_packs", "mismatched", f"pack name {ref.name!r} is not a name"
            )
        if (builtin / f"{ref.name}.yaml").is_file():
            try:
                sha = hashlib.sha256(
                    read_bounded(builtin / f"{ref.name}.yaml", MAX_PACK_BYTES, PolicyError)
                ).hexdigest()
            except PolicyError:
                continue
        else:
            found = find_user_pack(ref.name, getattr(ref, "path", None), places)
            if found is None:
                missing.append(ref.name)
                continue
            sha = found.sha256
        checked += 1
        if sha != ref.sha256:
            changed.append(ref.name)
    if changed:
        return SubCheck(
            "decision", "rule_packs", "mismatched", f"changed since the plan: {', '.join(changed)}"
        )
    if missing:  # not a mismatch: a pack need not be deployed beside the policy
        return SubCheck(
            "decision",
            "rule_packs",
            "unchecked",
            f"{checked} pack(s) unchanged; user pack(s) {', '.join(missing)} not found beside the policy "
            "or where load_policy was told (rules=)",
        )
    if checked == 0:
        return SubCheck("decision", "rule_packs", "unchecked", "no pack found to compare")
    return SubCheck("decision", "rule_packs", "matched", f"{checked} pack(s) unchanged")


def _is_name(text: object) -> bool:
    import re

    from moepolicy.document.constraints import NAME_PATTERN

    return isinstance(text, str) and re.fullmatch(NAME_PATTERN, text) is not None


def _sheets_check(doc: PolicyView) -> SubCheck:
    """The data sheets the plan was made from, hashed as they are now (by name only, reads bounded)."""
    from moepolicy._resources import sheets_sha256

    recorded = getattr(doc.target, "sheets_sha256", None)
    if not recorded:
        return SubCheck(
            "decision",
            "data_sheets",
            "unchecked",
            "the policy does not record its sheets (before 2.1)",
        )
    name = doc.target.deep_ep.sheet
    if not _is_name(name):
        return SubCheck(
            "decision", "data_sheets", "mismatched", f"sheet {name!r} is not a sheet's name"
        )
    status = "matched" if sheets_sha256(name, _bounded_or_none) == recorded else "mismatched"
    detail = (
        "unchanged since the plan"
        if status == "matched"
        else (
            "the DeepEP, expert-kernel or GPU sheet changed since the plan (re-plan with this moepolicy)"
        )
    )
    return SubCheck("decision", "data_sheets", status, detail)


def _bounded_or_none(path: Path) -> Optional[bytes]:
    from moepolicy.errors import PolicyError
    from moepolicy.files import file_kind, read_bounded
    from moepolicy.document.reader import MAX_PACK_BYTES

    if file_kind(path) is None:
        return None
    try:
        return read_bounded(path, MAX_PACK_BYTES, PolicyError)
    except PolicyError:
        return b"unreadable"


def _ep_check(doc: PolicyView, ep_size: Optional[int]) -> SubCheck:
    if ep_size is None:
        return SubCheck("tuning", "ep_size", "unchecked", "no ep_size given")
    status = "matched" if ep_size == doc.target.ep_size else "mismatched"
    return SubCheck("tuning", "ep_size", status, f"EP{ep_size}; policy EP{doc.target.ep_size}")


def _gpu_check(doc: PolicyView) -> SubCheck:
    from moepolicy.hardware import nvml_gpus

    names = nvml_gpus()
    if not names:
        return SubCheck("tuning", "gpu", "unchecked", "NVML not available")
    name = names[0].lower()
    status = "matched" if doc.target.gpu in name.replace("-", " ").split() else "mismatched"
    return SubCheck("tuning", "gpu", status, f"{names[0]}; policy {doc.target.gpu}")


def _deepep_check(doc: PolicyView) -> SubCheck:
    """The imported DeepEP against the policy's sheet, by the API the policy runs on (a 2.x build
    offers the legacy Buffer and ElasticBuffer): matched where the build offers that sheet's API, or
    another sheet of the same API with the same answers (capabilities, limits, defaults). A decision
    check: the decisions rest on what the build can carry."""
    from moepolicy.deepep.probe import imported_features, matching_sheet, offered_sheets

    features = imported_features()
    if features is None:
        return SubCheck("decision", "deep_ep", "unchecked", "deep_ep not imported in this process")
    from moepolicy.datasheets import deepep_sheets

    sheets = deepep_sheets()
    recorded = sheets.get(doc.target.deep_ep.sheet)
    api = recorded.api if recorded is not None else None
    found = matching_sheet(features, sheets, api)
    offered = ", ".join(offered_sheets(features, sheets)) or "no known API"
    if found is None or recorded is None:
        status, detail = "mismatched", f"imported deep_ep offers {offered}"
    elif found.name == recorded.name:
        status, detail = "matched", f"imported deep_ep offers {found.name}"
    elif found.answers() == recorded.answers():
        status = "matched"
        detail = (
            f"imported deep_ep offers {found.name}, whose {api} API answers as {recorded.name}"
        )
    else:
        status = "mismatched"
        detail = f"imported deep_ep offers {offered}; its {api} API answers otherwise"
    return SubCheck("decision", "deep_ep", status, f"{detail}; policy {doc.target.deep_ep.sheet}")


def _schedule_check(doc: PolicyView, schedule: Optional[str]) -> SubCheck:
    tuned = getattr(doc.deepep, "schedule", "serial")
    if schedule is None:
        return SubCheck(
            "tuning", "schedule", "unchecked", f"no schedule given; policy tuned for {tuned}"
        )
    status = "matched" if schedule == tuned else "mismatched"
    return SubCheck(
        "tuning", "schedule", status, f"engine runs {schedule}; policy tuned for {tuned}"
    )


def check_keys(
    doc: PolicyView,
    *,
    ep_size: Optional[int],
    model,
    schedule: Optional[str] = None,
    pack_places: Sequence[Path] = (),
    layout: Optional[str] = None,
) -> list[SubCheck]:
    return [
        _facts_check(doc, model),
        _arch_check(doc),
        _layout_check(doc, ep_size, layout),
        _packs_check(doc, pack_places),
        _sheets_check(doc),
        _ep_check(doc, ep_size),
        _gpu_check(doc),
        _deepep_check(doc),
        _schedule_check(doc, schedule),
    ]


def summarise(checks: list[SubCheck], part: str, required: str) -> str:
    mine = [c for c in checks if c.part == part]
    if any(c.status == "mismatched" for c in mine):
        return "mismatched"
    main = [c for c in mine if c.name == required]
    return "matched" if main and main[0].status == "matched" else "unchecked"
