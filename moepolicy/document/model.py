"""The policy document (contract: "The policy document"; ``docs/POLICY.md``), validated with Pydantic.

Models allow unknown keys so that a reader can accept a newer minor version; the loader lists them
(:func:`unknown_keys`) and warns, or refuses under ``strict``. Schema 2.0 adds per-bucket orders, the
rules' decision without measured facts, combine precision, the ``fused`` order, the engine schedule
and timing regime the configs were chosen for, measured order timings and a partial-result marker;
1.x documents still load (each new field's default is what 1.x meant). Schema 2.1 adds the NVFP4 wire
(``nvfp4`` with ``e4m3`` scales) and ``deepep.v2``. Schema 2.2 keeps a modelled tune's figures
under ``modelled`` (``measured`` holds only measurements of the config kept), the search's selected
minima under ``search``, and records the paired test behind each measured order timing; 2.1
documents' ``measured`` (with its ``confirm``) still reads. Schema 2.4 adds the ``experts``
section: the expert kernel a tune compared with the engine's pick, with its figures.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from moepolicy import names
from moepolicy.document import constraints as rules
from moepolicy.document.evidence import (
    Evidence,
    Measured,
    MeasuredDoc,
    ModelledDoc,
    OverlapDoc,
    ProvenanceDoc,
    SearchDoc,
)


SCHEMA_VERSION = rules.SCHEMA_VERSION
# the shared names (moepolicy.names) as Literals: the document and its JSON Schema keep plain strings
Order = names.OrderName


class _Doc(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, defer_build=True)


class ScaleDoc(_Doc):
    granularity: Literal["block", "token", "tensor"]
    group: Optional[int] = Field(default=None, gt=0)
    dtype: Literal["float32", "ue8m0", "e4m3"]  # 2.1: e4m3 (NVFP4's 1x16 block scales)
    layout: Literal["row", "stride0"] = "row"


class WireDoc(_Doc):
    dtype: names.WireDtypeName  # 2.1: nvfp4
    scale: Optional[ScaleDoc] = None


class CombineDoc(_Doc):
    """What combine sends back: bf16 (every engine today), or a low-precision combine."""

    dtype: Literal["bf16", "fp8_e4m3", "nvfp4", "logfmt"] = "bf16"


class DecisionDoc(_Doc):
    """One decision without the layer's index and facts (an alternative the runtime may take)."""

    order: Order
    wire: WireDoc
    numerics: Literal["exact", "approximate"]
    rule: str
    reason: str


class BucketOrderDoc(_Doc):
    """The order for token counts up to ``max_tokens`` (the last entry: every larger count)."""

    max_tokens: Optional[int] = Field(default=None, gt=0, le=10_000_000)
    order: Order
    wire: WireDoc
    rule: str


class LayerDoc(_Doc):
    index: int = Field(ge=0, le=100_000)
    kind: Literal["moe", "dense"]
    order: Order
    wire: WireDoc
    numerics: Literal["exact", "approximate"]
    rule: str
    reason: str
    facts: dict[str, Any] = Field(default_factory=dict)
    # 2.0: combine precision; per token bucket orders where measurement found a crossover (decided
    # by the rules from each bucket's measured facts); the rules' decision without measured facts,
    # which the runtime takes when the tuning key does not match
    combine: CombineDoc = Field(default_factory=CombineDoc)
    orders: Optional[list[BucketOrderDoc]] = Field(default=None, min_length=2)
    unmeasured: Optional[DecisionDoc] = None

    @model_validator(mode="after")
    def _consistent(self) -> "LayerDoc":
        problem = rules.layer_problem(self.kind, self.order, self.wire.dtype)
        for entry in self.orders or ():
            problem = problem or rules.layer_problem(self.kind, entry.order, entry.wire.dtype)
        if self.orders:
            problem = problem or rules.buckets_problem([entry.max_tokens for entry in self.orders])
        if self.unmeasured is not None:
            problem = problem or rules.layer_problem(
                self.kind, self.unmeasured.order, self.unmeasured.wire.dtype
            )
        if problem:
            raise ValueError(problem)
        return self


class ModelDoc(_Doc):
    name: str
    facts_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    hidden_size: int = Field(gt=0)
    num_layers: int = Field(gt=0)
    num_experts: int = Field(ge=0)
    top_k: int = Field(ge=0)


def _name(**kwargs: Any) -> Any:
    """A data sheet's or rule pack's name: never a path (the runtime looks the file up by name)."""
    return Field(pattern=rules.NAME_PATTERN, max_length=rules.NAME_MAX_LENGTH, **kwargs)


class DeepEPBuildDoc(_Doc):
    api: Literal["legacy", "v2"]
    version: str
    evidence: str
    # the DeepEP capability sheet's name (``deepep-legacy-29d31c0``); empty before 2.0
    sheet: str = Field(
        default="", pattern=f"^$|{rules.NAME_PATTERN}", max_length=rules.NAME_MAX_LENGTH
    )


class TargetDoc(_Doc):
    gpu: str
    arch: Literal["sm80", "sm90", "sm100"] = "sm90"
    sm_count: int = Field(default=132, gt=0)
    ep_size: int = Field(gt=0, le=65536)
    gpus_per_node: int = Field(gt=0, le=65536)
    layout: Literal["intranode", "internode"] = "intranode"
    backend: Literal["deepep_ht", "deepep_ll"]
    expert_kernel: str
    engine: Literal["vllm", "sglang"]
    deep_ep: DeepEPBuildDoc
    options: list[str] = Field(default_factory=list)
    static_scale: Literal["global-max", "per-expert"] = "global-max"
    # 2.1: the sheets read
    sheets_sha256: Optional[str] = Field(default=None, pattern=r"^[0-9a-f]{64}$")


class PackRefDoc(_Doc):
    """A rule pack the plan used: its name, version and sha256; a user pack also its file's name
    (never a path: the runtime and ``explain`` look for it where they are told, and beside the policy)."""

    name: str = _name()
    version: str
    sha256: str
    path: Optional[str] = _name(default=None)


class RulesDoc(_Doc):
    packs: list[PackRefDoc] = Field(min_length=1)


class ChunkDoc(_Doc):
    """One DeepEP ``Config``'s chunk fields (names as deep_ep.Config and SGLang's JSON use them)."""

    num_max_nvl_chunked_send_tokens: int = Field(gt=0, le=65536)
    num_max_nvl_chunked_recv_tokens: int = Field(gt=0, le=65536)
    num_max_rdma_chunked_send_tokens: int = Field(
        default=rules.CHUNK_DEFAULTS["num_max_rdma_chunked_send_tokens"], gt=0, le=65536
    )
    num_max_rdma_chunked_recv_tokens: int = Field(
        default=rules.CHUNK_DEFAULTS["num_max_rdma_chunked_recv_tokens"], gt=0, le=65536
    )

    @model_validator(mode="after")
    def _deepep_asserts(self) -> "ChunkDoc":
        problem = rules.chunk_problem(*self.as_tuple())
        if problem:
            raise ValueError(problem)
        return self

    def as_tuple(self) -> tuple[int, int, int, int]:
        return (
            self.num_max_nvl_chunked_send_tokens,
            self.num_max_nvl_chunked_recv_tokens,
            self.num_max_rdma_chunked_send_tokens,
            self.num_max_rdma_chunked_recv_tokens,
        )


class BucketDoc(_Doc):
    max_tokens: Optional[int] = Field(default=None, gt=0, le=10_000_000)
    dispatch: ChunkDoc
    combine: ChunkDoc
    measured: Optional[Measured] = None  # measurements of the config kept (live benches)
    modelled: Optional[ModelledDoc] = None  # 2.2: the model bench's answers (never ``measured``)
    # 2.2: the search's selected minima (what proposed, no claim)
    search: Optional[SearchDoc] = None

    def kept_name(self) -> Optional[str]:
        """The config kept, as the protocol named it (``default``, ``engine``, a candidate), where
        the evidence says."""
        evidence = self.modelled or self.measured
        return evidence.kept if isinstance(evidence, (MeasuredDoc, ModelledDoc)) else None


class PartialDoc(_Doc):
    """An interrupted tune: what it holds is not a complete answer (``load_policy`` does not use it)."""

    reason: str


class OrderTimingDoc(_Doc):
    """Both orders of one token bucket, timed (a measured fact the rules see as ``measured.faster_order``).
    2.2: the medians of rotated rounds, with the paired test: quantizing first's speed-up, its 95 %
    interval and the order faster beyond noise (``neither``: the rules' order stands)."""

    tokens: int = Field(gt=0, le=10_000_000)
    quant_then_dispatch_us: float = Field(gt=0)
    dispatch_then_quant_us: float = Field(gt=0)
    rounds: Optional[int] = Field(default=None, gt=0)
    quant_first_speedup: Optional[float] = Field(default=None, gt=0)
    ci95: Optional[list[float]] = Field(default=None, min_length=2, max_length=2)
    faster: Optional[Literal["quant_then_dispatch", "dispatch_then_quant", "neither"]] = None
    correction: Optional[str] = None


class DeepEPV2Doc(_Doc):
    """2.1: DeepEP v2 (ElasticBuffer) settings: its SM count (0 = its analytical count) and two options."""

    num_sms: int = Field(default=0, ge=0, le=1024)
    prefer_overlap_with_compute: bool = True
    allow_multiple_reduction: bool = True

    @field_validator("num_sms")
    @classmethod
    def _even_or_analytical(cls, value: int) -> int:
        problem = rules.v2_num_sms_problem(value)
        if problem:
            raise ValueError(problem)
        return value


class DeepEPDoc(_Doc):
    num_sms: int = Field(gt=0, le=1024)
    num_nvl_bytes: int = Field(ge=0, le=2**40)
    num_rdma_bytes: int = Field(ge=0, le=2**40)
    buckets: list[BucketDoc] = Field(min_length=1)
    provenance: ProvenanceDoc
    overlap: Optional[OverlapDoc] = None  # tune --overlap: the communication/GEMM SM split
    # 2.0: the engine schedule the configs were chosen for (serial: DeepEP then the experts' GEMM on
    # every SM; overlapped: beside it, as DBO/TBO), the timing regime (host: the host's launch and
    # waits included, as eager engines run; gpu: GPU time, as CUDA-graph engines run), both orders'
    # measured times, and the partial-result marker of an interrupted tune
    schedule: Literal["serial", "overlapped"] = "serial"
    regime: Literal["host", "gpu"] = "host"
    v2: Optional[DeepEPV2Doc] = None  # 2.1: only for a DeepEP v2 target
    low_latency: Optional[dict[str, int]] = None
    partial: Optional[PartialDoc] = None
    measured_orders: Optional[list[OrderTimingDoc]] = None
    # (fields in the order the document is written)

    @field_validator("num_sms")
    @classmethod
    def _even(cls, value: int) -> int:
        problem = rules.num_sms_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("num_nvl_bytes", "num_rdma_bytes")
    @classmethod
    def _aligned(cls, value: int) -> int:
        problem = rules.buffer_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _bucket_order(self) -> "DeepEPDoc":
        problem = rules.buckets_problem([b.max_tokens for b in self.buckets])
        if problem:
            raise ValueError(problem)
        return self


class ExpertKernelDoc(_Doc):
    """2.4: one expert kernel the engine can build here: whether its stage could be timed (or, for a
    modelled comparison, was recorded), where or why not."""

    kernel: str
    available: bool  # its stage was timed here, or recorded (a modelled comparison)
    detail: str = ""


class ExpertArmDoc(_Doc):
    """2.4: one (kernel, order) arm at one bucket, per rank: the rank's compute (sender quantization
    and expert stage; the report rounds' median) and its wire's communication (absent: no figure)."""

    kernel: str
    order: Order
    compute_us: float = Field(gt=0)
    dispatch_us: Optional[float] = Field(default=None, gt=0)
    combine_us: Optional[float] = Field(default=None, gt=0)


class ExpertBucketDoc(_Doc):
    tokens: int = Field(gt=0, le=10_000_000)
    arms: list[ExpertArmDoc] = Field(min_length=1)


class ExpertOrderDoc(OrderTimingDoc):
    """2.4: both orders of one kernel at one bucket, as ``deepep.measured_orders`` records them."""

    kernel: str


class ExpertTestDoc(_Doc):
    """2.4: a kernel's step against the engine's pick at one bucket (``tokens`` absent: over the
    weighted buckets); the verdict from the decide rounds, the speed-up from the report rounds."""

    tokens: Optional[int] = Field(default=None, gt=0, le=10_000_000)
    contender: str
    baseline: str
    verdict: Literal[
        "faster", "slower", "within noise", "no gain beyond noise", "no loss beyond noise"
    ]
    speedup: float = Field(gt=0)
    ci95: Optional[list[float]] = Field(default=None, min_length=2, max_length=2)
    correction: Optional[str] = None


class ExpertsDoc(_Doc):
    """2.4: the expert kernel as part of the policy: the kernel the MoE layers run (``kernel``), the
    engine's own pick, the kernel a tune found faster beyond noise (``unmeasured``: none), and the
    figures behind it. ``source`` says where the expert stage's times came from (``modelled``: the
    recorded campaign, reported and never decided on); ``basis`` where the communication came from."""

    kernel: str
    engine_default: str
    faster_kernel: str
    source: Literal["measured", "modelled"]
    basis: str
    why: str
    rounds: int = Field(default=0, ge=0)
    kernels: list[ExpertKernelDoc] = Field(default_factory=list)
    buckets: list[ExpertBucketDoc] = Field(default_factory=list)
    orders: list[ExpertOrderDoc] = Field(default_factory=list)
    tests: list[ExpertTestDoc] = Field(default_factory=list)


class KeyDoc(_Doc):
    decision: str = Field(pattern=r"^[0-9a-f]{64}$")
    tuning: str = Field(pattern=r"^[0-9a-f]{64}$")
    content: str = Field(pattern=r"^[0-9a-f]{64}$")


class PolicyDoc(_Doc):
    schema_version: str = Field(pattern=r"^\d+\.\d+$")
    model: ModelDoc
    target: TargetDoc
    rules: RulesDoc
    deepep: DeepEPDoc
    experts: Optional[ExpertsDoc] = None  # 2.4: after a tune that compared expert kernels
    layers: list[LayerDoc] = Field(min_length=1)
    key: KeyDoc
    generated: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _layers_in_order(self) -> "PolicyDoc":
        problem = rules.layer_indices_problem([layer.index for layer in self.layers])
        if problem:
            raise ValueError(problem[1])
        return self

    @model_validator(mode="before")
    @classmethod
    def _version_fits(cls, data: Any) -> Any:
        problem = rules.version_problem(data) if isinstance(data, dict) else None
        if problem:
            raise ValueError(problem)
        return data


def unknown_keys(model: BaseModel, path: str = "") -> list[str]:
    """YAML paths of keys this reader does not know (a newer minor version, or a typo); evidence
    (:mod:`moepolicy.document.evidence`) a reader keeps without a word, so it is not searched."""
    return [where for where, _ in unknown_fields(model, path, evidence=False)]


def unknown_fields(
    model: BaseModel, path: str = "", evidence: bool = True
) -> list[tuple[str, Any]]:
    """(YAML path, value) of each field the document does not define, inside the evidence too
    unless ``evidence`` is false (the writer's check: every level)."""
    if isinstance(model, Evidence) and not evidence:
        return []
    found = [
        (f"{path}.{key}" if path else key, value)
        for key, value in (model.model_extra or {}).items()
    ]
    for name in type(model).model_fields:
        if name not in ("facts", "generated"):
            child = f"{path}.{name}" if path else name
            found += _unknown_below(getattr(model, name), child, evidence)
    return found


def _unknown_below(value: Any, path: str, evidence: bool) -> list[tuple[str, Any]]:
    if isinstance(value, BaseModel):
        return unknown_fields(value, path, evidence)
    items = (
        enumerate(value)
        if isinstance(value, list)
        else value.items()
        if isinstance(value, dict)
        else ()
    )
    found: list[tuple[str, Any]] = []
    for key, item in items:
        found += _unknown_below(
            item, f"{path}[{key}]" if isinstance(value, list) else f"{path}.{key}", evidence
        )
    return found
