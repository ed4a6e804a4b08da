"""Normalised facts about a checkpoint's decoder layers.

Every input format (HF ``fp8``, compressed-tensors, ModelOpt, mxfp4, GPTQ/AWQ, none) is turned into
these models by an adapter in :mod:`moepolicy.checkpoint.formats`; rules see only these facts.
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

QuantDtype = Literal[
    "fp8_e4m3", "fp8_e5m2", "int8", "int4", "nvfp4", "mxfp4", "mxfp8", "none", "unknown"
]
Granularity = Literal["block", "group", "token", "tensor", "channel", "none", "unknown"]
Dynamism = Literal["dynamic", "static", "none", "unknown"]
ScaleFormat = Literal["float32", "ue8m0", "e4m3", "e8m0", "none", "unknown"]
OriginKind = Literal["explicit", "convention", "unknown"]
LayerKind = Literal["moe", "dense"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Origin(_Frozen):
    """Where a fact came from: the config says it, someone's convention implies it, or unknown."""

    kind: OriginKind
    note: str = ""


class TensorQuant(_Frozen):
    """How one tensor (expert weights or expert input activations) is quantized.

    ``group`` is the group length for ``group`` granularity (activations 1×g, weights 1×g) and
    ``block`` the 2-D block for ``block`` weights. ``origin`` maps a field name to its provenance;
    fields not listed share ``origin['*']``.
    """

    dtype: QuantDtype
    granularity: Granularity
    group: Optional[int] = None
    block: Optional[tuple[int, int]] = None
    dynamic: Dynamism = "none"
    scale_format: ScaleFormat = "none"
    origin: dict[str, Origin] = Field(default_factory=dict)

    @property
    def is_quantized(self) -> bool:
        return self.dtype not in ("none", "unknown")

    @property
    def is_known(self) -> bool:
        fields = (self.dtype, self.granularity, self.dynamic, self.scale_format)
        return "unknown" not in fields

    def origin_of(self, field: str) -> Origin:
        return self.origin.get(field) or self.origin.get("*") or Origin(kind="unknown")


NOT_QUANTIZED = TensorQuant(
    dtype="none",
    granularity="none",
    dynamic="none",
    scale_format="none",
    origin={"*": Origin(kind="explicit", note="no quantization applies")},
)


class IgnoreMatch(_Frozen):
    """Which ignore-list entry excluded a layer's experts, under which engine's matching rule."""

    entry: str
    module: str
    mode: str


class LayerFacts(_Frozen):
    """What the checkpoint says about one decoder layer."""

    index: int
    kind: LayerKind
    is_mtp: bool = False
    hidden_size: int
    num_experts: int = 0
    top_k: int = 0
    moe_intermediate_size: Optional[int] = None
    num_shared_experts: int = 0
    quant_method: str = "none"
    weights: TensorQuant = NOT_QUANTIZED
    activations: TensorQuant = NOT_QUANTIZED
    experts_ignored: Optional[IgnoreMatch] = None

    def decision_view(self) -> dict:
        """The fields that can change a decision (provenance notes excluded)."""
        data = self.model_dump(mode="json")
        for part in ("weights", "activations"):
            data[part].pop("origin", None)
        if data["experts_ignored"] is not None:
            data["experts_ignored"] = True
        return data


class ModelFacts(_Frozen):
    """Normalised facts for a whole checkpoint: one entry per decoder layer, MTP layers included."""

    name: str
    source: str
    architecture: str = ""
    model_type: str = ""
    hidden_size: int
    num_hidden_layers: int
    num_mtp_layers: int = 0
    quant_method: str = "none"
    layers: tuple[LayerFacts, ...]
    notes: tuple[str, ...] = ()
    # a group-limited router's (n_group, topk_group): how tokens spread over EP ranks when the expert
    # stage is timed; outside the decision facts (no rule reads it) and the facts' hash
    expert_groups: Optional[tuple[int, int]] = None

    @property
    def moe_layers(self) -> list[LayerFacts]:
        return [layer for layer in self.layers if layer.kind == "moe"]

    @property
    def dense_layers(self) -> list[LayerFacts]:
        return [layer for layer in self.layers if layer.kind == "dense"]

    @property
    def first_moe(self) -> Optional[LayerFacts]:
        moe = self.moe_layers
        return moe[0] if moe else None

    def sha256(self) -> str:
        """Hash of the decision-relevant facts; equal for a trimmed copy and the real checkpoint."""
        payload = [layer.decision_view() for layer in self.layers]
        blob = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()
