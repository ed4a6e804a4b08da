"""What the expert kernel consumes for a layer on the target GPU (the 'exec' facts rules see).

On Hopper, NVFP4/MXFP4 experts run weight-only (bf16 activations); on Blackwell NVFP4 runs W4A4.
The kernel is ``--expert-kernel`` when given, else what vLLM picks for the GPU and scheme.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from moepolicy import datasheets
from moepolicy.schema.capability import KernelMode
from moepolicy.schema.facts import LayerFacts


@dataclass(frozen=True)
class Execution:
    kernel: str
    mode: Optional[KernelMode]
    chosen_by: str

    @property
    def supported(self) -> bool:
        return self.mode is not None


def default_kernel(layer: LayerFacts, arch: str) -> str:
    w, a = layer.weights, layer.activations
    for rule in datasheets.kernel_sheet().defaults:
        if rule.arch and arch not in rule.arch:
            continue
        if rule.weights and w.dtype not in rule.weights:
            continue
        if rule.granularity and w.granularity not in rule.granularity:
            continue
        if rule.acts and a.dtype not in rule.acts:
            continue
        return rule.kernel
    return "triton"


def find_mode(kernel: str, arch: str, layer: LayerFacts) -> Optional[KernelMode]:
    per_arch = datasheets.kernel_sheet().kernels.get(kernel, {})
    modes = per_arch.get(arch) or per_arch.get("any") or []
    for mode in modes:
        if not mode.weights.matches(layer.weights.dtype, layer.weights.granularity):
            continue
        if mode.checkpoint_acts and not mode.checkpoint_acts.matches(
                layer.activations.dtype, layer.activations.granularity):
            continue
        return mode
    return None


def execution_for(layer: LayerFacts, arch: str, kernel: Optional[str]) -> Execution:
    if kernel is None:
        chosen = default_kernel(layer, arch)
        return Execution(chosen, find_mode(chosen, arch, layer), "vLLM's pick for this GPU and scheme")
    return Execution(kernel, find_mode(kernel, arch, layer), "asked for (expert_kernel)")
