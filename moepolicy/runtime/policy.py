"""Immutable runtime views of a policy: per-layer decisions and DeepEP settings."""

from __future__ import annotations

import bisect
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from moepolicy.deepep.settings import DeepEPSettings
from moepolicy.errors import PolicyError
from moepolicy.wire import Wire


@dataclass(frozen=True)
class BucketOrder:
    """A layer's order for token counts up to ``max_tokens`` (None: every larger count)."""

    max_tokens: Optional[int]
    order: str
    wire: Wire


@dataclass(frozen=True)
class LayerDecision:
    index: int
    kind: str
    order: str
    wire: Wire
    numerics: str
    rule: str
    reason: str
    combine: str = "bf16"  # what combine sends back
    orders: tuple[BucketOrder, ...] = ()  # per token bucket, where measurement found a crossover

    def __post_init__(self) -> None:
        bounds = tuple(
            b.max_tokens if b.max_tokens is not None else sys.maxsize for b in self.orders
        )
        object.__setattr__(self, "_bounds", bounds)

    @property
    def quantize_before_dispatch(self) -> bool:
        return self.order == "quant_then_dispatch"

    def bucket_order(self, num_tokens: int) -> "BucketOrder":
        """The order and wire for a batch of ``num_tokens`` tokens per rank.

        ``num_tokens`` must be a count every rank agrees on (the engine passes the maximum across
        its data-parallel ranks): ranks that disagree on the wire corrupt or hang the dispatch.
        """
        if not self.orders:
            return BucketOrder(None, self.order, self.wire)
        i = bisect.bisect_left(self._bounds, num_tokens)  # type: ignore[attr-defined]  # set by __post_init__, no field
        return self.orders[min(i, len(self.orders) - 1)]

    def order_for(self, num_tokens: int) -> str:
        """``order`` for a batch of ``num_tokens`` per rank (agreed across ranks; see ``bucket_order``)."""
        return self.bucket_order(num_tokens).order if self.orders else self.order


BF16_WIRE = Wire("bf16")
SAFE_RULE = "safe-fallback"


def safe_layer(index: int, reason: str) -> LayerDecision:
    return LayerDecision(
        index=index,
        kind="moe",
        order="dispatch_then_quant",
        wire=BF16_WIRE,
        numerics="approximate",
        rule=SAFE_RULE,
        reason=reason,
    )


@dataclass(frozen=True)
class ServedModel:
    """The model a serving process really loaded, for the decision key's facts check: its name as
    served (a Hugging Face id or a path), and where its config came from: the folder vLLM read it
    from (a local checkpoint or a Hugging Face cache snapshot), else the config vLLM parsed (its
    ``hf_config`` as a dict, with ``hf_quant_config.json`` where known)."""

    name: str
    folder: Optional[str] = None
    config: Optional[Mapping[str, Any]] = None
    quant_config: Optional[Mapping[str, Any]] = None

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class PolicyTarget:
    """What a serving plugin needs from the document besides the decisions, read once at load:
    the target it was made for, its content key, the expert kernel each layer was decided for and
    which layers are MTP layers."""

    backend: str
    deepep_api: str
    ep_size: int
    arch: str
    expert_kernel: str
    schedule: str
    content_key: str
    num_hidden_layers: int
    layer_kernels: Mapping[int, str] = field(default_factory=dict)
    mtp_layers: frozenset[int] = frozenset()

    @staticmethod
    def from_doc(data: Mapping[str, Any]) -> "PolicyTarget":
        """From a validated policy document (the runtime reader's dict)."""
        target, layers = data["target"], data["layers"]
        kernels = {
            entry["index"]: (entry.get("facts") or {}).get("kernel.name")
            or target["expert_kernel"]
            for entry in layers
            if entry["kind"] == "moe"
        }
        mtp = frozenset(
            entry["index"] for entry in layers if (entry.get("facts") or {}).get("layer.is_mtp")
        )
        return PolicyTarget(
            backend=target["backend"],
            deepep_api=target["deep_ep"]["api"],
            ep_size=target["ep_size"],
            arch=target["arch"],
            expert_kernel=target["expert_kernel"],
            schedule=data["deepep"].get("schedule") or "serial",
            content_key=data["key"]["content"],
            num_hidden_layers=data["model"]["num_layers"],
            layer_kernels=kernels,
            mtp_layers=mtp,
        )


@dataclass(frozen=True)
class LoadReport:
    """How a policy was loaded: from where, for which model, what the key checks said (``report``:
    decision/tuning → matched | mismatched | unchecked; ``details``: one line per sub-check), the
    loader's warnings, and why it fell back (None: the policy is in force)."""

    source: str
    report: Mapping[str, str]
    details: tuple[str, ...] = ()
    model_name: str = ""
    warnings: tuple[str, ...] = ()
    fallback_reason: Optional[str] = None


class Policy:
    """What a serving process asks: ``layer(i)``, ``deepep``, and whether it fell back."""

    __slots__ = ("_layers", "deepep", "loaded", "target")

    def __init__(
        self,
        layers: tuple[LayerDecision, ...],
        deepep: DeepEPSettings,
        loaded: LoadReport,
        target: Optional[PolicyTarget] = None,
    ):
        self._layers = layers
        self.deepep = deepep
        self.loaded = loaded
        self.target = target  # None for the safe policy (no document)

    @property
    def is_fallback(self) -> bool:
        return self.loaded.fallback_reason is not None

    @property
    def fallback_reason(self) -> Optional[str]:
        return self.loaded.fallback_reason

    @property
    def keeps_decisions(self) -> bool:
        """Whether the layers' decisions are the policy's own: also after a tuning-key mismatch or
        a partial result, which fall back only to DeepEP's default settings (``deepep.is_default``);
        never for the safe policy."""
        return True

    @property
    def report(self) -> Mapping[str, str]:
        return self.loaded.report

    @property
    def report_details(self) -> tuple[str, ...]:
        return self.loaded.details

    @property
    def source(self) -> str:
        return self.loaded.source

    @property
    def model_name(self) -> str:
        return self.loaded.model_name

    @property
    def warnings(self) -> tuple[str, ...]:
        return self.loaded.warnings

    def layer(self, index: int) -> LayerDecision:
        """Constant-time lookup. An index the policy does not hold raises :class:`PolicyError` (an
        off-by-one must not quietly send bf16): the caller decides what such a layer does."""
        decision = self.get(index)
        if decision is None:
            raise PolicyError(
                f"layer {index!r} is not in this policy (it holds layers 0-{len(self._layers) - 1}); "
                "use policy.get(index) for layers it may not hold"
            )
        return decision

    def get(self, index: int) -> Optional[LayerDecision]:
        """``layer(index)``, or None for an index the policy does not hold."""
        if (
            isinstance(index, int)
            and not isinstance(index, bool)
            and 0 <= index < len(self._layers)
        ):
            return self._layers[index]
        return None

    @property
    def num_layers(self) -> int:
        return len(self._layers)

    def __repr__(self) -> str:
        state = f"fallback: {self.fallback_reason}" if self.is_fallback else "in force"
        return f"<Policy {self.model_name or self.source} {self.num_layers} layers, {state}>"


class SafePolicy(Policy):
    """bf16 on the wire and the engine's own handling after dispatch, for any layer index (a
    fallback holds no layers of its own: every index gets the safe decision)."""

    @property
    def keeps_decisions(self) -> bool:
        return False

    def get(self, index: int) -> Optional[LayerDecision]:
        return safe_layer(index, self.fallback_reason or "safe policy")
