"""What this node offers a policy: the DeepEP build's APIs (by sheet), the vLLM release, the GPUs.

``moepolicy doctor`` renders it; run on a serving node, it names the ``--deep-ep-version``,
``--gpu`` and EP layout to plan with away from the cluster, and whether the vLLM plugin supports the
installed vLLM. It reads versions from package metadata; it imports ``deep_ep`` (to read its
features) and nothing of vLLM.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from typing import Optional

from moepolicy import datasheets
from moepolicy.deepep.probe import import_features, offers
from moepolicy.names import checked_vllm_release
from moepolicy.target import visible_gpu

# the vLLM all-to-all backends each DeepEP API serves
BACKENDS_OF_API = {
    "legacy": ("deepep_high_throughput", "deepep_low_latency"),
    "v2": ("deepep_v2",),
}


@dataclass(frozen=True)
class DeepEPFound:
    installed: bool
    version: Optional[str]  # the distribution's version ('2.1.0'), where package metadata has one
    sheets: tuple[str, ...] = ()  # one per API the build offers, legacy first
    apis: tuple[str, ...] = ()


@dataclass(frozen=True)
class VllmFound:
    version: Optional[str]
    checked: bool  # a release the plugin is checked against


@dataclass(frozen=True)
class GpusFound:
    names: tuple[str, ...]
    profile: Optional[str]  # the GPU sheet's name (--gpu), None where none matches

    @property
    def count(self) -> int:
        return len(self.names)


@dataclass(frozen=True)
class NodeReport:
    moepolicy: str
    deep_ep: DeepEPFound
    vllm: VllmFound
    gpus: GpusFound

    def plan_flags(self) -> list[str]:
        """The flags that plan for this node elsewhere (the sheet of the legacy API first: vLLM's
        default DeepEP backend)."""
        flags = []
        if self.gpus.profile:
            flags += ["--gpu", self.gpus.profile]
        if self.deep_ep.sheets:
            flags += ["--deep-ep-version", self.deep_ep.sheets[0]]
        return flags


def _distribution_version(*names: str) -> Optional[str]:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _deep_ep() -> DeepEPFound:
    features = import_features()
    if features is None:
        return DeepEPFound(False, None)
    sheets = sorted(
        (s for s in datasheets.deepep_sheets().values() if offers(features, s)),
        key=lambda s: (s.api != "legacy", s.name),
    )
    return DeepEPFound(
        True,
        _distribution_version("deep_ep", "deep-ep"),
        tuple(s.name for s in sheets),
        tuple(s.api for s in sheets),
    )


def _vllm() -> VllmFound:
    version = _distribution_version("vllm")
    return VllmFound(version, version is not None and checked_vllm_release(version) is not None)


def inspect_node() -> NodeReport:
    from moepolicy._version import __version__
    from moepolicy.hardware import nvml_gpus

    names = nvml_gpus()
    profile, _ = visible_gpu() if names else (None, 0)
    return NodeReport(__version__, _deep_ep(), _vllm(), GpusFound(tuple(names), profile))
