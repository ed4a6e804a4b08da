"""The target a policy is made for: GPU, EP layout, backend, expert kernel, engine, DeepEP build.

These are inputs with defaults; :func:`resolve_target` fills the defaults and says where each came
from, so the CLI can print the target it used on its first stderr line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from moepolicy import datasheets
from moepolicy.names import Backend as Backends, Engine
from moepolicy.deepep.probe import import_features, matching_sheet
from moepolicy.errors import UsageError
from moepolicy.schema.capability import DeepEPSheet, GpuProfile

OPT_INS = ("inferred-capabilities", "per-sender-scales")


@dataclass(frozen=True)
class Target:
    gpu: str
    profile: GpuProfile
    ep_size: int
    gpus_per_node: int
    backend: str
    expert_kernel: Optional[str]  # None: what vLLM picks, per layer scheme
    engine: str
    deepep: DeepEPSheet
    deepep_evidence: str
    options: frozenset[str] = field(default_factory=frozenset)
    static_scale: str = "global-max"

    @property
    def layout(self) -> str:
        return "intranode" if self.ep_size <= self.gpus_per_node else "internode"

    @property
    def arch(self) -> str:
        return self.profile.arch

    def describe(self, kernel: str) -> str:
        return (
            f"target: gpu={self.gpu} ({self.arch}, {self.profile.sm_count} SMs), "
            f"ep_size={self.ep_size} ({self.layout}, {self.gpus_per_node}/node), "
            f"backend={self.backend}, expert_kernel={kernel}, engine={self.engine}, "
            f"deep_ep={self.deepep.name} [{self.deepep_evidence}]"
        )


def visible_gpu() -> tuple[Optional[str], int]:
    """(profile name, count) of the visible CUDA GPUs via NVML, without importing torch."""
    from moepolicy.hardware import nvml_gpus

    names = nvml_gpus()
    if not names:
        return None, 0
    lowered = names[0].lower()
    for profile in datasheets.gpu_sheet().gpus:
        if profile in lowered.replace("nvidia", "").split() or f" {profile}" in lowered:
            return profile, len(names)
    return None, len(names)


def _deepep_sheet(version: Optional[str], probe: bool) -> tuple[DeepEPSheet, str]:
    if version:
        return datasheets.deepep_sheet(version), "asked for (deep_ep_version)"
    if probe:
        features = import_features()
        if features is not None:
            sheet = matching_sheet(features, datasheets.deepep_sheets())
            if sheet is not None:
                return sheet, "probed from the installed deep_ep"
            return datasheets.deepep_sheet(datasheets.NEWEST_SHEET), (
                "installed deep_ep matched no sheet; newest sheet used"
            )
    return datasheets.deepep_sheet(datasheets.NEWEST_SHEET), "newest sheet (deep_ep not installed)"


@dataclass(frozen=True)
class TargetSpec:
    """What a user asks for (CLI flags, or a policy's target section): ``resolve_target`` checks it and
    fills in the rest (the visible GPU, DeepEP's installed build)."""

    gpu: Optional[str] = None
    ep_size: Optional[int] = None
    gpus_per_node: Optional[int] = None
    backend: str = "deepep_ht"
    expert_kernel: Optional[str] = None
    engine: str = "vllm"
    deep_ep_version: Optional[str] = None
    options: tuple[str, ...] = ()
    static_scale: str = "global-max"


def resolve_target(
    spec: TargetSpec = TargetSpec(), *, probe: bool = True, default_ep: Optional[int] = None
) -> Target:
    """The target ``spec`` names, checked (one-line errors naming the field); with ``probe``, the
    visible GPU and the installed deep_ep fill in what ``spec`` leaves out."""
    gpu, ep_size, gpus_per_node, backend = spec.gpu, spec.ep_size, spec.gpus_per_node, spec.backend
    expert_kernel, engine, options, static_scale = (
        spec.expert_kernel,
        spec.engine,
        spec.options,
        spec.static_scale,
    )
    detected, count = visible_gpu() if probe and gpu is None else (None, 0)
    gpu_name = (gpu or detected or "h200").lower()
    profile = datasheets.gpu_profile(gpu_name)
    ep = ep_size if ep_size is not None else default_ep
    if ep is None:
        raise UsageError("ep_size is required (no live GPUs to take it from)", field="ep_size")
    if ep < 1:
        raise UsageError(f"ep_size must be a positive integer, got {ep}", field="ep_size")
    per_node = gpus_per_node if gpus_per_node is not None else 8
    if per_node < 1:
        raise UsageError(
            f"gpus_per_node must be a positive integer, got {per_node}", field="gpus_per_node"
        )
    if backend not in Backends.values():
        raise UsageError(
            f"backend must be deepep_ht or deepep_ll, got {backend!r}", field="backend"
        )
    if engine not in Engine.values():
        raise UsageError(f"engine must be vllm or sglang, got {engine!r}", field="engine")
    if static_scale not in ("global-max", "per-expert"):
        raise UsageError(
            f"static_scale must be global-max or per-expert, got {static_scale!r}",
            field="static_scale",
        )
    bad = [o for o in options if o not in OPT_INS]
    if bad:
        raise UsageError(
            f"options {bad[0]!r} is unknown; known: {', '.join(OPT_INS)}", field="options"
        )
    if expert_kernel is not None and expert_kernel not in datasheets.kernel_sheet().kernels:
        import difflib

        known = list(datasheets.kernel_sheet().kernels)
        near = difflib.get_close_matches(expert_kernel, known, n=1)
        hint = f" (did you mean '{near[0]}'?)" if near else ""
        raise UsageError(
            f"expert_kernel {expert_kernel!r} is unknown{hint}; known: {', '.join(known)}",
            field="expert_kernel",
        )
    sheet, evidence = _deepep_sheet(spec.deep_ep_version, probe)
    return Target(
        gpu=gpu_name,
        profile=profile,
        ep_size=ep,
        gpus_per_node=per_node,
        backend=backend,
        expert_kernel=expert_kernel,
        engine=engine,
        deepep=sheet,
        deepep_evidence=evidence,
        options=frozenset(options),
        static_scale=static_scale,
    )


def target_from_doc(target_doc) -> Target:
    """Rebuild the :class:`Target` a policy was planned for (explain's replay)."""
    kernel = target_doc.expert_kernel
    return resolve_target(
        TargetSpec(
            gpu=target_doc.gpu,
            ep_size=target_doc.ep_size,
            gpus_per_node=target_doc.gpus_per_node,
            backend=target_doc.backend,
            expert_kernel=None if kernel.startswith("auto") or kernel == "none" else kernel,
            engine=target_doc.engine,
            deep_ep_version=target_doc.deep_ep.sheet or target_doc.deep_ep.version,
            options=tuple(target_doc.options),
            static_scale=target_doc.static_scale,
        ),
        probe=False,
    )
