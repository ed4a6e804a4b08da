"""The names every layer shares, as string enums: orders, wire dtypes, timing regimes, DeepEP
backends and serving engines.

Members compare equal to their strings (``Order.QUANT_THEN_DISPATCH == "quant_then_dispatch"``), so
documents, rule packs and YAML keep plain strings; code names them through these enums. (The facts
rules may test are another vocabulary: ``moepolicy.rules.vocabulary``.)
"""

from __future__ import annotations

from enum import Enum
from typing import Literal


class _Name(str, Enum):
    def __str__(self) -> str:
        return self.value

    @classmethod
    def values(cls) -> tuple[str, ...]:
        return tuple(member.value for member in cls)


class Order(_Name):
    """Where a layer's activations are quantized relative to DeepEP's dispatch."""

    QUANT_THEN_DISPATCH = (
        "quant_then_dispatch"  # on the sender: the wire carries the quantized payload
    )
    DISPATCH_THEN_QUANT = "dispatch_then_quant"  # bf16 on the wire, quantized by the receiver
    IN_KERNEL_QUANT = "in_kernel_quant"  # DeepEP's low-latency kernel quantizes while sending
    NO_QUANT = "no_quant"  # the experts take bf16 (weight-only or unquantized checkpoints)
    NONE = "none"  # no dispatch: a dense layer
    FUSED = "fused"  # the expert kernel dispatches itself (DeepGEMM Mega MoE)


# The orders as a Literal written out, for the document's fields: a type checker reads only a Literal
# spelled statically (tests/test_names.py holds it to the enum, member for member and in order).
OrderName = Literal[
    "quant_then_dispatch", "dispatch_then_quant", "in_kernel_quant", "no_quant", "none", "fused"
]


# the vLLM releases the plugin is checked against (its source pins per release:
# moepolicy/integrations/vllm/pins.py); what the exports and docs name
CHECKED_VLLM_RELEASES = ("0.33", "0.34")


def checked_vllm_release(version: str) -> "str | None":
    """The checked release (``0.34``) a vLLM version (``0.34.1``, ``0.34.0rc1``) belongs to, or None."""
    for release in CHECKED_VLLM_RELEASES:
        if version == release or version.startswith(release + "."):
            return release
    return None


# a measured fact's value where no order was measured faster beyond noise: the rules' order stands
UNMEASURED = "unmeasured"

QUANTIZED_ORDERS = (
    Order.QUANT_THEN_DISPATCH,
    Order.IN_KERNEL_QUANT,
)  # a quantized payload crosses the wire


class WireDtype(_Name):
    """What DeepEP carries for a layer's activations."""

    BF16 = "bf16"
    FP8_E4M3 = "fp8_e4m3"
    NVFP4 = "nvfp4"
    NONE = "none"


WireDtypeName = Literal["bf16", "fp8_e4m3", "nvfp4", "none"]  # the enum's values, as OrderName


class Regime(_Name):
    """What a timing includes (``measure.timing``'s launch modes): the host's launches and waits from
    an idle GPU (``host``, an upper bound on an eager engine), the GPU's own time (``gpu``, a
    CUDA-graph engine), or consecutive layers with the host running ahead except where DeepEP's
    dispatch makes it wait (``runahead``, an eager engine's forward pass; ``bench`` only)."""

    HOST = "host"
    GPU = "gpu"
    RUNAHEAD = "runahead"


TUNED_REGIMES = (
    Regime.HOST,
    Regime.GPU,
)  # what a policy's configs can be tuned in (its ``regime``)
# each regime as ``measure.timing.Timer``'s launch mode
LAUNCH_MODE = {
    Regime.HOST.value: "synced",
    Regime.GPU.value: "queued",
    Regime.RUNAHEAD.value: "runahead",
}


class Backend(_Name):
    """DeepEP's kernels: high-throughput (normal) or low-latency."""

    DEEPEP_HT = "deepep_ht"
    DEEPEP_LL = "deepep_ll"


class Engine(_Name):
    """The serving engine whose conventions a policy follows."""

    VLLM = "vllm"
    SGLANG = "sglang"
