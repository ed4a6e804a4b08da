"""Which expert stage ``moepolicy bench`` runs between dispatch and combine, and what it is called.

DeepGEMM's (``measure.expert_stage``: vLLM's block-fp8 experts on Hopper, at the model's expert
shapes) wherever it can run for the policy: DeepEP on GPUs, DeepGEMM importable on an SM90 card, the
experts fed block-fp8 rows with float32 1x128 scales, and the model's intermediate size readable
from its config. Anywhere else the bench runs a stand-in of two matmuls per local expert, named as
such; a stand-in's times are never compared (its hundreds of small ops per layer dilute every ratio
toward 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from moepolicy.errors import MoePolicyError
from moepolicy.moe_step.arms import Arm

DEEPGEMM, STAND_IN = "deepgemm", "stand-in"  # the expert stages a bench runs
STAND_IN_INTERMEDIATE_EMULATED = 32  # the emulated transport checks plumbing: tiny matmuls do


@dataclass(frozen=True)
class BenchExperts:
    """The expert stage a bench runs: ``stage`` (DEEPGEMM or STAND_IN), one expert's intermediate
    size, what it is in words, and (DeepGEMM) the arms whose engine would build another kernel."""

    stage: str
    intermediate: int
    what: str
    other_kernels: str = ""

    @property
    def comparable(self) -> bool:
        """Whether the arms' times may be compared: only with a real expert kernel."""
        return self.stage == DEEPGEMM


def _stand_in(why: str, hidden: int, emulated: bool) -> BenchExperts:
    inter = STAND_IN_INTERMEDIATE_EMULATED if emulated else max(hidden // 3, 128)
    return BenchExperts(
        STAND_IN,
        inter,
        f"the expert stage is a stand-in (two matmuls per local expert, not an expert kernel: {why})",
    )


def _block_fp8(consumes: tuple[tuple[str, Any], ...]) -> bool:
    wire = dict(consumes)
    return (
        wire.get("dtype") == "fp8_e4m3"
        and wire.get("scale.granularity") in ("block", "group")
        and wire.get("scale.group") == 128
        and wire.get("scale.dtype", "float32") == "float32"
    )


def _block_fp8_weights(doc, layers: Sequence[int]) -> bool:
    facts = {layer.index: layer.facts for layer in doc.layers}
    return all(
        facts[i].get("ckpt.weight_dtype") == "fp8_e4m3"
        and facts[i].get("ckpt.weight_granularity") == "block"
        for i in layers
    )


def _unfed(doc, arms: Sequence[Arm]) -> Optional[str]:
    """Why DeepGEMM's SM90 stage cannot take what some arm's experts consume (None: it can): block-fp8
    rows with float32 1x128 scales, or bf16 rows of a block-fp8 checkpoint (the stage quantizes them
    1x128 itself, as FlashInfer's and vLLM's DeepGEMM experts do with bf16 on the wire)."""
    for arm in arms:
        for kind in arm.kinds:
            bf16 = dict(kind.consumes).get("dtype") == "bf16"
            if _block_fp8(kind.consumes) or (bf16 and _block_fp8_weights(doc, kind.layers)):
                continue
            wire = ", ".join(f"{k} {v}" for k, v in kind.consumes)
            return (
                f"the {arm.name} arm's experts consume {wire}; DeepGEMM's SM90 stage takes "
                "block-fp8 rows with float32 1x128 scales (or bf16 rows of a block-fp8 checkpoint)"
            )
    return None


def _intermediate(name: str) -> tuple[Optional[int], str]:
    """The model's expert intermediate size from its config (offline), or why it is not known."""
    from moepolicy.checkpoint.reader import read_model

    try:
        facts = read_model(name, hub=False)
    except MoePolicyError as exc:
        return None, f"the model's expert shapes are not readable here ({exc})"
    moe = facts.moe_layers
    if not moe or moe[0].moe_intermediate_size is None:
        return None, f"{name}'s config names no MoE intermediate size"
    return moe[0].moe_intermediate_size, ""


def _other_kernels(doc, arms: Sequence[Arm]) -> str:
    """The arms whose engine would build another expert kernel than DeepGEMM (they run it here)."""
    from moepolicy.measure.expert_stage import kernel_status

    engine_default = next(
        (layer.facts.get("kernel.default") for layer in doc.layers if layer.kind == "moe"), None
    )
    kernels = {"policy": doc.target.expert_kernel, "deepep-default": doc.target.expert_kernel}
    kernels["vllm"] = engine_default or doc.target.expert_kernel
    others = sorted({k for name, k in kernels.items() if k != DEEPGEMM and name in _names(arms)})
    if not others:
        return ""
    said = "; ".join(f"{s.kernel}: {s.detail}" for s in kernel_status(others))
    who = ", ".join(n for n in _names(arms) if kernels[n] != DEEPGEMM)
    return (
        f"the {who} arm(s) would run {', '.join(others)} under the engine; here every arm's experts "
        f"are DeepGEMM's, so the bench compares orders, wires and DeepEP settings, not expert "
        f"kernels ({said})"
    )


def _names(arms: Sequence[Arm]) -> tuple[str, ...]:
    return tuple(arm.name for arm in arms)


def bench_experts(doc, arms: Sequence[Arm], transport: str) -> BenchExperts:
    """The expert stage a bench of ``doc`` (a validated ``PolicyDoc``) runs over ``transport``
    (``deepep`` or ``emulated``), and why where it is the stand-in."""
    hidden = doc.model.hidden_size
    if transport == "emulated":
        return _stand_in("the emulated transport on CPU checks plumbing only", hidden, True)
    unfed = _unfed(doc, arms)
    if unfed:
        return _stand_in(unfed, hidden, False)
    intermediate, why = _intermediate(doc.model.name)
    if intermediate is None:
        return _stand_in(why, hidden, False)
    from moepolicy.measure.expert_stage import kernel_status, stage_shape_ok
    from moepolicy.measure.routing import ExpertShape

    shape = ExpertShape(hidden, intermediate, doc.model.num_experts, doc.model.top_k, 1)
    bad = stage_shape_ok(shape)
    if bad:
        return _stand_in(bad, hidden, False)
    (status,) = kernel_status((DEEPGEMM,))
    if not status.runs:
        return _stand_in(status.detail, hidden, False)
    return BenchExperts(
        DEEPGEMM,
        intermediate,
        f"the expert stage is DeepGEMM's ({status.detail}; intermediate {intermediate})",
        _other_kernels(doc, arms),
    )
