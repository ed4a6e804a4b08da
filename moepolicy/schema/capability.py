"""Schemas for the data sheets in ``moepolicy/data/sheets/``: GPU profiles, DeepEP capabilities, expert kernels."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

Evidence = Literal["measured", "code", "inferred"]
Layout = Literal["intranode", "internode"]


class _Sheet(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GpuProfile(_Sheet):
    arch: Literal["sm80", "sm90", "sm100"]
    sm_count: int = Field(gt=0)
    nvlink_domain: int = Field(gt=0)
    memory_gib: int = Field(gt=0)
    note: str = ""


class GpuSheet(_Sheet):
    schema_: str = Field(alias="schema")
    gpus: dict[str, GpuProfile]


class CapabilityEntry(_Sheet):
    supported: bool
    evidence: Evidence
    source: str


class DeepEPLimits(_Sheet):
    max_ranks: int
    gpus_per_node: int
    intranode_ranks: list[int]
    internode_rdma_ranks: list[int]
    max_local_experts: int
    intranode_max_local_experts: int
    ht_max_topk: int
    ht_row_bytes_multiple: int
    ht_intranode_row_bytes_multiple: int
    ht_intranode_tma_bytes: Optional[int]
    ht_internode_tma_bytes: Optional[int]
    ht_internode_combine_hidden_multiple: int
    ht_requires_hidden_multiple_128: bool
    ll_hidden_sizes: list[int]
    ll_max_topk: int
    ll_fp8_hidden_multiple: int
    ll_hidden_multiple: int
    needs_sm90_for_fp8: bool


class DeepEPDefaults(_Sheet):
    num_sms: int
    dispatch: dict[int, tuple[int, int, int, int]]
    combine: dict[int, tuple[int, int, int, int]]
    config_fallback: tuple[int, int, int, int]


class Probe(_Sheet):
    requires: list[str]
    forbids: list[str]


class DeepEPSheet(_Sheet):
    """One DeepEP build generation: what it carries, its limits, its default configs."""

    schema_: str = Field(alias="schema")
    name: str
    api: Literal["legacy", "v2"]
    version: str
    commit: str
    probe: Probe
    capabilities: dict[str, dict[Layout, CapabilityEntry]]
    limits: DeepEPLimits
    defaults: DeepEPDefaults

    def capability(self, cap_id: str, layout: str) -> Optional[CapabilityEntry]:
        # a layout outside Layout (a caller's str) finds nothing, as get() means it to
        return self.capabilities.get(cap_id, {}).get(layout)  # type: ignore[call-overload]

    def answers(self) -> tuple:
        """What can change a decision or a configuration: the API, each capability's support (and
        whether it is only inferred, which the default rules do not use), the limits and the default
        configs. Two sheets with the same answers plan the same policy; sources and the
        measured/code distinction do not change it."""
        caps = tuple(
            sorted(
                (cap, layout, e.supported, e.evidence == "inferred")
                for cap, per_layout in self.capabilities.items()
                for layout, e in per_layout.items()
            )
        )
        return (self.api, caps, self.limits, self.defaults)


class TensorPattern(_Sheet):
    dtype: list[str] = Field(default_factory=list)
    granularity: list[str] = Field(default_factory=list)

    def matches(self, dtype: str, granularity: str) -> bool:
        return (not self.dtype or dtype in self.dtype) and (
            not self.granularity or granularity in self.granularity
        )


class KernelActivations(_Sheet):
    dtype: Literal["fp8_e4m3", "int8", "nvfp4", "mxfp8", "bf16"]
    granularity: list[Literal["group", "token", "tensor"]] = Field(default_factory=list)
    group: Optional[int] = None
    scale_dtype: Literal["float32", "ue8m0", "e4m3", "e8m0", "none"] = "none"
    scale_layout: Literal["row", "col_tma", "swizzled", "none"] = "none"


class KernelMode(_Sheet):
    weights: TensorPattern
    checkpoint_acts: Optional[TensorPattern] = None
    activations: KernelActivations
    evidence: Evidence
    source: str
    # the kernel does dispatch, expert GEMMs and combine in one (DeepGEMM Mega MoE): no DeepEP order applies
    fuses_communication: bool = False


class KernelDefault(_Sheet):
    arch: list[str] = Field(default_factory=list)
    weights: list[str] = Field(default_factory=list)
    granularity: list[str] = Field(default_factory=list)
    acts: list[str] = Field(default_factory=list)
    # the engine's choice also depends on the activations' scheme and the all-to-all path
    act_granularity: list[str] = Field(default_factory=list)
    act_dynamic: list[str] = Field(default_factory=list)
    engine: list[str] = Field(default_factory=list)
    backend: list[str] = Field(default_factory=list)
    deepep_api: list[str] = Field(default_factory=list)
    kernel: str
    source: str = ""


class KernelSheet(_Sheet):
    schema_: str = Field(alias="schema")
    kernels: dict[str, dict[str, list[KernelMode]]]
    defaults: list[KernelDefault]
