"""The two key parts a policy carries and the runtime checks separately.

- decision key: normalised model facts, rule packs, DeepEP capability sheet, GPU arch, expert
  kernel(s), EP layout, backend, engine and opt-ins: anything that can change a layer's order. From
  2.1 the document also records the hash of the data sheets it read (``target.sheets_sha256``, under
  the content key); the runtime compares it with its own sheets as a decision sub-check, and a 2.0
  reader, which does not know the field, still verifies the same keys;
- tuning key: hardware profile, EP size and DeepEP build, and (schema 2.0) the engine schedule and
  timing regime the configs were chosen for and the measured order timings the rules saw: anything
  that can change the tuned configs or a measured decision.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from moepolicy.document.facts_table import resolved_facts


def _digest(parts: dict[str, Any]) -> str:
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def decision_parts(doc: dict[str, Any]) -> dict[str, Any]:
    doc = resolved_facts(doc)
    target = doc["target"]
    kernels = sorted(
        {str(layer.get("facts", {}).get("kernel.name", "none")) for layer in doc["layers"]}
    )
    return {
        "facts_sha256": doc["model"]["facts_sha256"],
        "packs": [[p["name"], p["version"], p["sha256"]] for p in doc["rules"]["packs"]],
        "capability_sheet": target["deep_ep"].get("sheet", ""),
        "gpu_arch": target["arch"],
        "expert_kernel": target["expert_kernel"],
        "layer_kernels": kernels,
        "layout": target["layout"],
        "backend": target["backend"],
        "engine": target["engine"],
        "options": sorted(target.get("options", [])),
        "static_scale": target.get("static_scale", "global-max"),
    }


# absent from 1.x documents: their keys stay
TUNING_FIELDS_V2 = ("schedule", "regime", "measured_orders")


def tuning_parts(doc: dict[str, Any]) -> dict[str, Any]:
    target = doc["target"]
    parts = {
        "gpu": target["gpu"],
        "ep_size": target["ep_size"],
        "gpus_per_node": target["gpus_per_node"],
        "deep_ep": [
            target["deep_ep"]["api"],
            target["deep_ep"].get("sheet", ""),
            target["deep_ep"]["version"],
        ],
    }
    deepep = doc.get("deepep") or {}
    if not str(doc.get("schema_version", "")).startswith("1."):
        parts.update({name: deepep.get(name) for name in TUNING_FIELDS_V2})
    experts = doc.get("experts")
    if experts:  # 2.4: what the expert-kernel comparison found (absent before: older keys stay)
        parts["experts"] = {name: experts.get(name) for name in EXPERTS_TUNING_FIELDS}
    return parts


CONTENT_SECTIONS = ("schema_version", "model", "target", "rules", "deepep", "experts", "layers")
OPTIONAL_SECTIONS = ("experts",)  # absent from older documents: their content checksum stays
# what of the experts section can change an answer: the kernel run, the one found faster, on what
# evidence and with which order verdicts
EXPERTS_TUNING_FIELDS = ("kernel", "faster_kernel", "source", "orders")


def compute_keys(doc: dict[str, Any]) -> dict[str, str]:
    """The decision and tuning keys, plus ``content``: a checksum of everything the runtime uses,
    so a damaged or hand-edited file is noticed (``moepolicy validate --rekey`` after a deliberate edit).
    Over the document tree: a written file's ``layer_facts`` names are resolved first, so the YAML as
    loaded and the tree give the same keys."""
    doc = resolved_facts(doc)
    return {
        "decision": _digest(decision_parts(doc)),
        "tuning": _digest(tuning_parts(doc)),
        "content": _digest(
            {k: doc.get(k) for k in CONTENT_SECTIONS if k in doc or k not in OPTIONAL_SECTIONS}
        ),
    }
