"""What the expert kernel consumes for a layer on the target GPU (the 'exec' facts rules see).

On Hopper, NVFP4/MXFP4 experts run weight-only (bf16 activations); on Blackwell NVFP4 runs W4A4.
The kernel is ``--expert-kernel`` when given, else what the engine picks for the GPU, the scheme and
the all-to-all path (the sheet's ``defaults``, read from vLLM 0.33.0's fp8 oracle for vLLM).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from moepolicy import datasheets
from moepolicy.schema.capability import KernelDefault, KernelMode
from moepolicy.schema.facts import LayerFacts


@dataclass(frozen=True)
class Execution:
    kernel: str
    mode: Optional[KernelMode]
    chosen_by: str

    @property
    def supported(self) -> bool:
        return self.mode is not None


@dataclass(frozen=True)
class Deployment:
    """What, besides the GPU and the checkpoint, decides an engine's expert kernel: the engine, the
    all-to-all path (DeepEP high-throughput or low-latency) and DeepEP's API (legacy or v2)."""

    engine: str = "vllm"
    backend: str = "deepep_ht"
    deepep_api: str = "legacy"


def _matches(rule: KernelDefault, layer: LayerFacts, arch: str, where: Deployment) -> bool:
    w, a = layer.weights, layer.activations
    wanted = (
        (rule.arch, arch),
        (rule.weights, w.dtype),
        (rule.granularity, w.granularity),
        (rule.acts, a.dtype),
        (rule.act_granularity, a.granularity),
        (rule.act_dynamic, a.dynamic),
        (rule.engine, where.engine),
        (rule.backend, where.backend),
        (rule.deepep_api, where.deepep_api),
    )
    return all(not allowed or value in allowed for allowed, value in wanted)


def default_rule(
    layer: LayerFacts, arch: str, where: Deployment = Deployment()
) -> Optional[KernelDefault]:
    """The sheet's first ``defaults`` entry that matches (None: none does; the kernel is Triton)."""
    return next(
        (
            rule
            for rule in datasheets.kernel_sheet().defaults
            if _matches(rule, layer, arch, where)
        ),
        None,
    )


def default_kernel(layer: LayerFacts, arch: str, where: Deployment = Deployment()) -> str:
    rule = default_rule(layer, arch, where)
    return rule.kernel if rule is not None else "triton"


def find_mode(kernel: str, arch: str, layer: LayerFacts) -> Optional[KernelMode]:
    return mode_for(
        kernel,
        arch,
        (layer.weights.dtype, layer.weights.granularity),
        (layer.activations.dtype, layer.activations.granularity),
    )


def mode_for(
    kernel: str, arch: str, weights: tuple[str, str], acts: tuple[str, str]
) -> Optional[KernelMode]:
    """The sheet's mode of ``kernel`` on ``arch`` for (dtype, granularity) of the checkpoint's expert
    weights and activations (None: the kernel does not run them there)."""
    per_arch = datasheets.kernel_sheet().kernels.get(kernel, {})
    modes = per_arch.get(arch) or per_arch.get("any") or []
    for mode in modes:
        if not mode.weights.matches(*weights):
            continue
        if mode.checkpoint_acts and not mode.checkpoint_acts.matches(*acts):
            continue
        return mode
    return None


def engine_words(where: Deployment) -> str:
    return f"{'vLLM' if where.engine == 'vllm' else where.engine}'s pick for this GPU, scheme and path"


def execution_for(
    layer: LayerFacts,
    arch: str,
    kernel: Optional[str],
    where: Deployment = Deployment(),
    chosen_by: str = "asked for (expert_kernel)",
) -> Execution:
    if kernel is None:
        chosen = default_kernel(layer, arch, where)
        return Execution(chosen, find_mode(chosen, arch, layer), engine_words(where))
    return Execution(kernel, find_mode(kernel, arch, layer), chosen_by)


def runs_layer(kernel: str, arch: str, layer: LayerFacts) -> bool:
    """Whether ``kernel`` runs this layer's expert weights on ``arch`` (the sheet has a mode)."""
    return find_mode(kernel, arch, layer) is not None
