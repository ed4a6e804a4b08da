"""What backs a policy's DeepEP settings, typed: per bucket the measurement of the config kept
(``measured``: the serial protocol's report, an overlap tune's row, or a schema 2.1 re-measurement),
a modelled tune's answers (``modelled``) and the search's selected minima (``search``); the overlap
split (``overlap``); and where the numbers came from (``provenance``).

The tuners build these shapes as plain values (their ``to_doc()``, ``runner._provenance``,
``v2_tune.v2_provenance``); the composer (:mod:`moepolicy.document.deepep_section`) maps them to
these models, so a field the document does not define is refused on write at every level
(:func:`moepolicy.document.builder.section`). A reader keeps unknown evidence fields without a
warning (an older or newer writer's, or a hand's: evidence is reported, never run), and refuses one
whose value does not fit its type, in one line.

Each model writes its fields in the order it was given them (:class:`Evidence`), and figures keep
the type the tuner wrote (:data:`Number`: an int stays an int), so the YAML text is the tuners'.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Mapping, Optional, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    ValidatorFunctionWrapHandler,
    model_serializer,
    model_validator,
)
from pydantic import Discriminator, GetPydanticSchema, Tag
from pydantic_core import core_schema

from moepolicy.document.constraints import measured_form
from moepolicy.document.fast_validate import FREE_FORM, STRICT


def _figure(above: Optional[int]) -> GetPydanticSchema:
    """A figure as the tuner wrote it, an int kept an int (the YAML text unchanged), with one error
    for anything else (not one per kind of number)."""
    words = "a number" if above is None else f"a number above {above}"
    return GetPydanticSchema(
        lambda _type, _handler: core_schema.union_schema(
            [core_schema.int_schema(strict=True, gt=above), core_schema.float_schema(gt=above)],
            custom_error_type="number_type",
            custom_error_message=f"Input should be {words}",
        )
    )


# a time, a ratio or a count
Number = Annotated[Union[int, float], _figure(None)]
# a time or a speed-up, which a reader divides by
Positive = Annotated[Union[int, float], _figure(0)]
SmCount = Annotated[int, Field(gt=0)]  # SMs a kernel runs on, which a reader divides by


class Evidence(BaseModel):
    """One evidence object: unknown fields kept on read (refused on write by the builder), and
    written in the order given."""

    model_config = ConfigDict(
        extra="allow", frozen=True, defer_build=True, json_schema_extra={FREE_FORM: True}
    )

    _given: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="wrap")
    @classmethod
    def _remember_order(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        value = handler(data)
        if isinstance(data, Mapping) and isinstance(value, Evidence):
            value._given = tuple(str(key) for key in data)
        return value

    @model_serializer(mode="wrap")
    def _in_given_order(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        first = {key: out[key] for key in self._given if key in out}
        return first | {key: value for key, value in out.items() if key not in first}


# --- figures (measure.rounds, tuning.protocol, tuning.confirm) -----------------------------------


class FigureDoc(Evidence):
    """A speed-up of ``contender`` over ``baseline``: a report figure (``rounds_from: report``,
    ``protocol.Figure``), a tested one (``measure.rounds.Speedup``), or a schema 2.1 re-measurement's
    (``beyond_noise``)."""

    contender: str = ""
    baseline: str
    rounds: int
    speedup: Positive
    ci95: Optional[list[Positive]] = Field(default=None, min_length=2, max_length=2)
    per_round: Optional[list[Positive]] = None
    interval: Optional[str] = None
    rounds_from: Optional[str] = None
    p_faster: Optional[Number] = None
    p_slower: Optional[Number] = None
    verdict: Optional[str] = None
    test: Optional[str] = None
    correction: Optional[str] = None
    beyond_noise: Optional[bool] = None  # schema 2.1


class GateTestDoc(Evidence):
    """A gate's decision as the policy stores it (``confirm.decision_doc``): its statistics, no gain."""

    contender: str
    baseline: str
    rounds: int
    test: str
    statistic: Number
    p_faster: Number
    p_slower: Number
    level: Number
    verdict: str
    rounds_from: str
    correction: Optional[str] = None


# --- per bucket: measured, modelled, search ---------------------------------------------------------


class BucketGateDoc(Evidence):
    """The gate's tests of one bucket (``confirm.Gate.bucket_doc``)."""

    loss_vs_engine: Optional[GateTestDoc] = None
    chunks_vs_default: Optional[GateTestDoc] = None


class ReportDoc(Evidence):
    """The report rounds of one bucket (``confirm.Report``): medians and figures."""

    rounds: int
    median_us: dict[str, Positive]
    vs_engine: Optional[FigureDoc] = None
    vs_default: Optional[FigureDoc] = None


class ConfirmDoc(Evidence):
    """Schema 2.1: the re-measurement of a bucket, figures from the rounds that also decided."""

    kept: str
    selection: str = ""
    vs_default: FigureDoc
    vs_engine: FigureDoc
    median_us: dict[str, Positive] = {}


class MeasuredDoc(Evidence):
    """A serial tune's measurement of a bucket's kept config (``confirm.Confirmed``); before schema
    2.2, the search's samples and ``confirm``."""

    kept: Optional[str] = None
    num_sms: Optional[int] = None
    selection: Optional[str] = None
    gate: Optional[BucketGateDoc] = None
    report: Optional[ReportDoc] = None
    # schema 2.1
    search_best_us: Optional[Number] = None
    dispatch_us: Optional[Number] = None
    dispatch_cached_us: Optional[Number] = None
    combine_us: Optional[Number] = None
    trials: Optional[int] = None
    failed: Optional[int] = None
    default_total_us: Optional[Number] = None
    confirm: Optional[ConfirmDoc] = None


class OverlapRowDoc(Evidence):
    """An overlap tune's row of a bucket (``overlap_report.OverlapBucketRow``): the kept split and
    vLLM's, timed in the same rounds, per launch order, and the grid's lowest floor."""

    objective: str = "gemm-first"
    overlapped_us: Positive
    overlapped_spread_us: Optional[list[Number]] = Field(default=None, min_length=2, max_length=2)
    rounds: int = 0
    serial_us: Optional[Number] = None
    floor_us: Optional[Number] = None
    comm_us: Positive = 0.0  # absent from the oldest rows
    comm_region: str = "full"
    gemm_us: Positive = 0.0
    comm_end_in_overlap_us: Optional[Number] = None
    gemm_end_in_overlap_us: Optional[Number] = None
    vs_floor: Optional[Number] = None
    gemm: Optional[str] = None
    rounds_from: str = "selection"
    simultaneous_over: int = 1
    gemm_first_overlapped_us: Optional[Positive] = None
    comm_first_overlapped_us: Optional[Positive] = None
    comm_first_no_wait_overlapped_us: Optional[Positive] = None
    comm_no_wait_us: Optional[Number] = None
    deepep_waited_for_gemm_rounds: Optional[int] = None
    gemm_sms: Optional[SmCount] = None
    vllm_split_gemm: Optional[str] = None
    vllm_split_gemm_us: Optional[Positive] = None
    vllm_split_comm_us: Optional[Positive] = None
    vllm_split_overlapped_us: Optional[Positive] = None
    vllm_split_spread_us: Optional[list[Number]] = Field(default=None, min_length=2, max_length=2)
    vs_vllm_split: Optional[Number] = None
    vs_vllm_split_per_round: Optional[list[Positive]] = None
    speedup_vs_vllm_split: Optional[FigureDoc] = None
    vllm_split_gemm_first_overlapped_us: Optional[Positive] = None
    vllm_split_comm_first_overlapped_us: Optional[Positive] = None
    vllm_split_comm_first_no_wait_overlapped_us: Optional[Positive] = None
    vllm_split_comm_no_wait_us: Optional[Number] = None
    vllm_split_deepep_waited_for_gemm_rounds: Optional[int] = None
    vllm_split_gemm_sms: Optional[SmCount] = None
    vs_vllm_split_gemm_first: Optional[Number] = None
    vs_vllm_split_comm_first: Optional[Number] = None
    vs_vllm_split_comm_first_no_wait: Optional[Number] = None
    gemm_alone_vs_vllm_split: Optional[Number] = None
    gemm_sm_ratio_vs_vllm_split: Optional[Number] = None
    best_floor_us: Optional[Positive] = None
    best_floor_split: Optional[int] = None
    best_floor_bound_by: Optional[str] = None
    best_floor_vs_vllm_split: Optional[Number] = None


# what a bucket's ``measured`` holds: a serial tune's (or schema 2.1's), or an overlap tune's row
Measured = Annotated[
    Union[
        Annotated[MeasuredDoc, Tag(MeasuredDoc.__name__)],
        Annotated[OverlapRowDoc, Tag(OverlapRowDoc.__name__)],
    ],
    Discriminator(measured_form),
]


class ChosenVsEngineDoc(Evidence):
    """A modelled tune's chosen SM count against the engine's, with the model's held-out error."""

    num_sms: Optional[int] = None
    speedup: Positive
    model_error: Optional[Number] = None
    claim: str = ""


class ModelledDoc(Evidence):
    """A modelled tune's answers for a bucket (``confirm.ModelledBucket``): no interval, no noise."""

    kept: str
    num_sms: int
    us: dict[str, Positive]
    chosen_vs_engine: Optional[ChosenVsEngineDoc] = None


class SearchDoc(Evidence):
    """The search's selected minima at a bucket (``runner._search_doc``): what proposed, no claim."""

    note: str = ""
    num_sms: int
    best_us: Number
    dispatch_us: Optional[Number] = None
    dispatch_cached_us: Optional[Number] = None
    combine_us: Optional[Number] = None
    trials: Optional[int] = None
    failed: Optional[int] = None
    default_us: Optional[Number] = None


# --- deepep.overlap -----------------------------------------------------------------------------


class SplitGateDoc(Evidence):
    """The overlap gate (``overlap_search.SplitGate``): the weighted test, each bucket's loss test."""

    test: Optional[GateTestDoc] = None
    losses: dict[str, GateTestDoc] = {}
    why: str = ""


class OverlapDoc(Evidence):
    """``tune --overlap``'s split (``overlap_search.OverlapSearch.summary``): DeepEP's SMs and the
    expert GEMM's, the scan, the selection, the gate and the report against vLLM's split."""

    comm_sms: Annotated[int, Field(gt=0, strict=True, json_schema_extra={STRICT: True})]
    gemm_sms: Optional[int] = None
    gemm: Optional[str] = None
    gemm_fallback: Optional[str] = None
    order: str = "gemm-first"
    splits_us: dict[int, Number] = Field(
        default={}, json_schema_extra={"propertyNames": {"type": "integer"}}
    )
    splits_note: Optional[str] = None
    configs_measured: Optional[int] = None
    confirmed_us: dict[str, Number] = {}
    confirmed_note: Optional[str] = None
    gate: Optional[SplitGateDoc] = None
    report_vs_vllm_split: Optional[FigureDoc] = None
    why: Optional[str] = None


# --- deepep.provenance ----------------------------------------------------------------------------


class ParetoPointDoc(Evidence):
    num_sms: int
    weighted_us: Number


class ScanRowDoc(Evidence):
    """One (SM count, bucket) the search measured: its best and DeepEP's default (search samples)."""

    num_sms: int
    tokens: int
    best_us: Number
    default_us: Optional[Number] = None


class SearchSummaryDoc(Evidence):
    """The search over SM counts (``provenance.search``): the Pareto front and every point's scan."""

    note: str = ""
    pareto: list[ParetoPointDoc] = []
    scan: list[ScanRowDoc] = []


class EngineDefaultDoc(Evidence):
    num_sms: int
    configs: str


class ProtocolGateDoc(Evidence):
    """The SM count's gate test and whether it moved off the engine's."""

    sms: Optional[GateTestDoc] = None
    moved: Optional[bool] = None


class ProtocolDoc(Evidence):
    """How the kept settings were decided (``runner._keep``): a live tune's protocol (rounds, test,
    gate, weighted report), a modelled tune's (the model's answers against its error), or schema
    2.1's (``claim``)."""

    rounds: Optional[int] = None
    phases: Optional[str] = None
    top_k: Optional[int] = None
    engine_default: Optional[EngineDefaultDoc] = None
    model: Optional[str] = None
    weighted_speedup: Optional[Number] = None
    weighted_model_error: Optional[Number] = None
    fresh_bench: Optional[bool] = None
    test: Optional[str] = None
    policy_level: Optional[str] = None
    gate: Optional[ProtocolGateDoc] = None
    report_weighted_vs_engine: Optional[FigureDoc] = None
    claim: Optional[str] = None  # schema 2.1


class V2ReportDoc(Evidence):
    median_us: dict[str, Positive] = {}
    vs_default: Optional[FigureDoc] = None


class V2EvidenceDoc(Evidence):
    """What backs the kept ``deepep.v2`` settings (``v2_tune.v2_provenance``): the selection, the
    gate's statistics and the report."""

    why: str = ""
    rounds: Optional[int] = None
    selection: Optional[str] = None
    selection_us: dict[str, Number] = {}
    selection_note: Optional[str] = None
    gate: Optional[GateTestDoc] = None
    gate_losses: dict[str, GateTestDoc] = {}
    report: dict[str, V2ReportDoc] = {}
    report_weighted_vs_default: Optional[FigureDoc] = None


class ProvenanceDoc(Evidence):
    """Where the DeepEP numbers came from: the source, and the details moepolicy's tuners write
    (bench, study, the search, the protocol, the command and date)."""

    source: Literal["measured", "modelled", "extrapolated", "default"]
    note: str = ""
    bench: Optional[str] = None
    timed_region: Optional[str] = None
    study: Optional[str] = None
    storage: Optional[str] = None
    searched_num_sms: Optional[int] = None
    kept_num_sms: Optional[int] = None
    why: Optional[str] = None
    search: Optional[SearchSummaryDoc] = None
    gpu: Optional[str] = None
    ep_size: Optional[int] = None
    deepep: Optional[str] = None
    command: Optional[str] = None
    date: Optional[str] = None
    protocol: Optional[ProtocolDoc] = None
    v2: Optional[V2EvidenceDoc] = None
    # schema 2.1: the search's front and scan at the top
    chosen_num_sms: Optional[int] = None
    pareto: Optional[list[ParetoPointDoc]] = None
    scan: Optional[list[ScanRowDoc]] = None

    def scan_rows(self) -> list[ScanRowDoc]:
        """The search's scan, wherever the schema version put it."""
        return list(self.search.scan if self.search is not None else self.scan or ())
