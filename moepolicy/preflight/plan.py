"""``moepolicy validate POLICY --live``: the policy's DeepEP settings through real DeepEP, before serving.

At the policy's EP size, on the GPUs visible (ranks placed round robin, ``measure.placement``), every
rank makes DeepEP's intranode ``Buffer`` with the policy's NVLink buffer size and, for every token
bucket, builds the bucket's dispatch and combine ``Config``s and dispatches every distinct wire format
the policy's layers send (``reference.payloads``). A case passes when DeepEP accepts the buffer and the
configs (its host asserts), every rank receives exactly the rows, scales, top-k experts and weights
the reference transport's semantics say it receives (``reference.transport.receive`` over the same
senders' inputs, compared byte for byte), and combine returns each token summed over the ranks it
went to. Every step has a deadline: a hung collective ends all ranks with a line naming the step.

This checks function, not speed: where ranks share a GPU nothing here is a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from moepolicy.errors import PolicyError, UsageError
from moepolicy.measure.placement import SHARED_LABEL, RankPlacement
from moepolicy.reference.payloads import BF16, PayloadFormat, format_of
from moepolicy.text import printable

# tokens a rank sends per case: DeepEP's buffer is a ring of chunks, not sized by T
MAX_TOKENS = 1024


@dataclass(frozen=True)
class Case:
    """One token bucket: its configs, the tokens each rank sends, the wire formats dispatched."""

    bucket: str
    tokens: int
    dispatch: tuple[int, int, int, int]
    combine: tuple[int, int, int, int]


@dataclass(frozen=True)
class PreflightPlan:
    """What ``validate --live`` runs: the policy's DeepEP settings, its model's shape, its formats."""

    source: str
    ep_size: int
    num_sms: int
    num_nvl_bytes: int
    hidden: int
    num_experts: int
    top_k: int
    cases: tuple[Case, ...]
    formats: tuple[PayloadFormat, ...]
    not_checked: tuple[str, ...] = ()


@dataclass(frozen=True)
class Row:
    """One (bucket, format) case's result: ``ok``, or what failed."""

    bucket: str
    tokens: int
    wire: str
    status: str  # ok | failed
    detail: str = ""


@dataclass
class PreflightReport:
    plan: PreflightPlan
    placement: RankPlacement
    rows: list[Row] = field(default_factory=list)
    error: str = ""  # a rank failed or hung before every case ran

    @property
    def ok(self) -> bool:
        return not self.error and bool(self.rows) and all(r.status == "ok" for r in self.rows)


def plan_preflight(path: str) -> PreflightPlan:
    """The cases ``validate --live`` runs for the policy at ``path`` (read and validated)."""
    # the policy reader and the runtime's view: only when a policy is preflighted
    from moepolicy.document.reader import parse_policy_light, read_policy
    from moepolicy.runtime.loader import policy_as_written
    from moepolicy.document.fast_validate import View

    data = read_policy(path, parse=parse_policy_light).doc  # the tree the serving runtime reads
    doc, policy = View(data), policy_as_written(data, path)
    target, deepep = doc.target, policy.deepep
    if target.backend != "deepep_ht" or target.deep_ep.api != "legacy":
        raise UsageError(
            f"{path}: validate --live runs DeepEP's high-throughput Buffer (legacy API); this policy "
            f"is for {target.backend} on DeepEP {target.deep_ep.api}: nothing of it could be checked "
            "here (low-latency needs NVSHMEM with a GPU per rank; v2 needs NCCL with GIN)"
        )
    if target.ep_size > target.gpus_per_node:
        raise UsageError(
            f"{path}: EP {target.ep_size} with {target.gpus_per_node} GPUs per node is internode; "
            "validate --live runs the intranode path only (internode needs RDMA between nodes)"
        )
    if not deepep.num_nvl_bytes:
        raise PolicyError(
            f"{path}: the policy records no NVLink buffer size (deepep.num_nvl_bytes); re-plan it"
        )
    formats = _formats(policy)
    skipped = tuple(
        f"layer {d.index}: {d.order} (nothing DeepEP's normal dispatch carries)"
        for d in _moe_layers(policy)
        if format_of(d.wire) is None
    )
    return PreflightPlan(
        path,
        target.ep_size,
        deepep.num_sms,
        deepep.num_nvl_bytes,
        doc.model.hidden_size,
        doc.model.num_experts,
        doc.model.top_k,
        _cases(deepep.buckets),
        formats,
        skipped,
    )


def _moe_layers(policy):
    return [d for d in (policy.layer(i) for i in range(policy.num_layers)) if d.kind == "moe"]


def _formats(policy) -> tuple[PayloadFormat, ...]:
    """Every distinct wire format the policy's MoE layers send (decisions and per-bucket orders),
    bf16 first: it is also what combine returns."""
    seen = {BF16.name: BF16}
    for decision in _moe_layers(policy):
        for wire in (decision.wire, *(o.wire for o in decision.orders)):
            fmt = format_of(wire)
            if fmt is not None:
                seen.setdefault(fmt.name, fmt)
    return tuple(seen.values())


def _cases(buckets) -> tuple[Case, ...]:
    cases, previous = [], 0
    for b in buckets:
        bound = b.max_tokens if b.max_tokens is not None else max(2 * previous, 4096)
        label = (
            f"<= {b.max_tokens}"
            if b.max_tokens is not None
            else f"> {previous}"
            if previous
            else "all"
        )
        cases.append(
            Case(label, max(1, min(bound, MAX_TOKENS)), tuple(b.dispatch), tuple(b.combine))
        )
        previous = bound
    return tuple(cases)


def render(report: PreflightReport) -> list[str]:
    """The report as lines: a table, the placement, what was not checked, the verdict."""
    plan = report.plan
    head = (
        f"{printable(plan.source)}: DeepEP num_sms {plan.num_sms}, NVLink buffer {plan.num_nvl_bytes} bytes, "
        f"EP {plan.ep_size}: {report.placement.describe()}"
    )
    lines = [head]
    width = max([len(r.wire) for r in report.rows] + [4])
    for r in report.rows:
        lines.append(
            f"  bucket {r.bucket:>8}  T={r.tokens:<5} {r.wire:<{width}}  {r.status}"
            + (f": {r.detail}" if r.detail else "")
        )
    for item in plan.not_checked:
        lines.append(f"  not checked: {item}")
    if report.error:
        lines.append(f"  FAILED: {report.error}")
    if report.placement.shared:
        lines.append(f"  {SHARED_LABEL}: no timing here says anything about speed")
    return lines


def describe_failure(report: PreflightReport) -> Optional[str]:
    """The one line for a failed preflight, or None when every case passed."""
    if report.ok:
        return None
    if report.error:
        return f"{report.plan.source}: validate --live failed: {report.error}"
    bad = [r for r in report.rows if r.status != "ok"]
    if not bad:
        return f"{report.plan.source}: validate --live ran no case"
    first = bad[0]
    return (
        f"{report.plan.source}: validate --live: {len(bad)} case(s) failed; first: bucket {first.bucket}, "
        f"{first.wire}: {first.detail}"
    )
