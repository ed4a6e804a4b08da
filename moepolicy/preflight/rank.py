"""One rank of ``validate --live``: DeepEP with each policy's settings, checked against the reference.

Every rank's inputs are a function of its rank number (``reference.payloads.PatternedRows``), so each
rank also knows what every other rank sends and builds locally, row by row, what it must receive
(``reference.transport.receive``): no collective carries the reference. Progress goes to the
supervisor as events ``(kind, rank, payload)``: ``step`` before each collective step, ``row`` with a
case's result (rank 0), ``error``, ``plan-done``, ``done``.
"""

from __future__ import annotations

import traceback

import torch

from moepolicy.preflight.plan import Case, PreflightPlan, Row
from moepolicy.reference.payloads import PayloadFormat, patterned_payload
from moepolicy.reference.transport import (
    DeepEPTransport,
    Sent,
    destination_mask,
    receive,
    GatherTransport,
)
from moepolicy.measure.ranks import join_group


class DeepEPLink:
    """DeepEP's intranode ``Buffer``, one per policy with its NVLink buffer size, on this rank's GPU."""

    buffer = None

    def join(self, rank: int, world: int, placement, rendezvous: str):
        return join_group(rank, world, rendezvous, placement)

    def open(self, plan: PreflightPlan) -> None:
        import deep_ep
        import torch.distributed as dist

        self.buffer = None  # the previous policy's buffer is released first
        self.buffer = deep_ep.Buffer(dist.group.WORLD, plan.num_nvl_bytes, 0)

    def transport(self, plan: PreflightPlan, case: Case):
        import deep_ep

        return DeepEPTransport(
            self.buffer,
            plan.num_experts,
            deep_ep.Config(plan.num_sms, *case.dispatch),
            deep_ep.Config(plan.num_sms, *case.combine),
        )


class EmulatedLink:
    """The emulated all-to-all over gloo on CPUs: checks the preflight's own plumbing without GPUs."""

    def join(self, rank: int, world: int, placement, rendezvous: str):
        import torch.distributed as dist

        dist.init_process_group(
            "gloo", rank=rank, world_size=world, init_method=f"file://{rendezvous}"
        )
        return torch.device("cpu")

    def open(self, plan: PreflightPlan) -> None:
        pass

    def transport(self, plan: PreflightPlan, case: Case):
        return GatherTransport(None, plan.num_experts)


def rank_main(
    rank: int, plans: tuple[PreflightPlan, ...], placement, rendezvous: str, events, link=None
) -> None:
    """A spawned rank's entry (``measure.ranks.spawn_ranks``): join, run every policy's cases,
    report; never raises."""
    try:
        _run(rank, plans, placement, rendezvous, events, link or DeepEPLink())
    except Exception as exc:  # noqa: BLE001 (reported to the supervisor in one line)
        last = traceback.format_exc(limit=3).strip().splitlines()[-1]
        events.put(("error", rank, f"{type(exc).__name__}: {exc}"[:400] + f" [{last[:200]}]"))


def _run(
    rank: int, plans: tuple[PreflightPlan, ...], placement, rendezvous: str, events, link
) -> None:
    import torch.distributed as dist

    events.put(("step", rank, f"joining the group ({placement.backend})"))
    device = link.join(rank, placement.ranks, placement, rendezvous)
    for index, plan in enumerate(plans):
        events.put(
            (
                "step",
                rank,
                f"policy {index + 1}: deep_ep.Buffer(num_nvl_bytes={plan.num_nvl_bytes})",
            )
        )
        link.open(plan)
        for case in plan.cases:
            _run_case(rank, index, plan, case, link, device, events)
        events.put(("plan-done", rank, index))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()
    events.put(("done", rank, None))
    dist.destroy_process_group()


def _run_case(
    rank: int, index: int, plan: PreflightPlan, case: Case, link, device, events
) -> None:
    where = f"policy {index + 1}, bucket {case.bucket}"
    events.put(
        (
            "step",
            rank,
            f"{where}: deep_ep.Config({plan.num_sms}, {case.dispatch}) and "
            f"({plan.num_sms}, {case.combine})",
        )
    )
    transport = link.transport(plan, case)
    for fmt in plan.formats:
        events.put(("step", rank, f"{where}: dispatch {fmt.name}"))
        found = _check_dispatch(transport, plan, case, fmt, rank, device)
        _report(events, rank, index, _gathered_row(case, fmt.name, found))
    events.put(("step", rank, f"{where}: combine"))
    _report(
        events,
        rank,
        index,
        _gathered_row(case, "combine (bf16)", _check_combine(transport, plan, case, rank, device)),
    )


def _routing(source: int, plan: PreflightPlan, tokens: int):
    """Rank ``source``'s top-k experts and weights (drawn from its rank number)."""
    g = torch.Generator().manual_seed(7919 * (source + 1) + tokens)
    idx = (
        torch.rand(tokens, plan.num_experts, generator=g)
        .topk(plan.top_k, dim=1)
        .indices.to(torch.int64)
    )
    return idx, torch.rand(tokens, plan.top_k, generator=g)


def _sent(source: int, plan: PreflightPlan, case: Case, fmt: PayloadFormat) -> Sent:
    x, scales = patterned_payload(fmt, case.tokens, plan.hidden, source)
    return Sent(x, scales, *_routing(source, plan, case.tokens))


def _check_dispatch(
    transport, plan: PreflightPlan, case: Case, fmt: PayloadFormat, rank: int, device
) -> str:
    """Dispatch ``fmt`` through the transport; "" when what arrived equals the reference, else what differs."""
    mine = _sent(rank, plan, case, fmt)
    got = transport.dispatch(
        mine.x.all().to(device),
        None if mine.scales is None else mine.scales.all().to(device),
        mine.topk_idx.to(device),
        mine.topk_weights.to(device),
    )
    expected = receive(
        [_sent(s, plan, case, fmt) for s in range(plan.ep_size)], rank, plan.num_experts
    )
    return _difference(got, expected)


def _difference(got, expected) -> str:
    """Where the received rows differ from the reference's (rows matched by source rank and token)."""
    pairs = list(zip(got.src_rank.tolist(), got.src_token.tolist()))
    want = list(zip(expected.src_rank.tolist(), expected.src_token.tolist()))
    if sorted(pairs) != sorted(want):
        return f"received {len(pairs)} rows, the reference {len(want)} (different tokens)"
    at = {pair: i for i, pair in enumerate(want)}
    order = torch.tensor([at[p] for p in pairs], dtype=torch.int64)
    checks = {
        "rows": (got.x, expected.x),
        "scales": (got.scales, expected.scales),
        "top-k experts": (got.topk_idx, expected.topk_idx),
        "top-k weights": (got.topk_weights, expected.topk_weights),
    }
    for name, (a, b) in checks.items():
        if (a is None) != (b is None):
            return f"{name}: {'missing' if a is None else 'unexpected'}"
        if a is not None and not torch.equal(_bytes(a.cpu()), _bytes(b[order])):
            return f"{name} differ from the reference"
    if list(got.tokens_per_expert) != list(expected.tokens_per_expert):
        return "rows per local expert differ from the reference"
    return ""


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(-1).view(torch.uint8) if t.numel() else t.view(-1).to(torch.uint8)


def _check_combine(transport, plan: PreflightPlan, case: Case, rank: int, device) -> str:
    """bf16 rows dispatched and sent straight back: each token comes back times the ranks it went to."""
    x = torch.randn(
        case.tokens, plan.hidden, generator=torch.Generator().manual_seed(31 * rank + 7)
    )
    x = x.to(torch.bfloat16)
    idx, weights = _routing(rank, plan, case.tokens)
    got = transport.dispatch(x.to(device), None, idx.to(device), weights.to(device))
    combined = transport.combine(got.x, got.handle).cpu()
    copies = destination_mask(idx, plan.num_experts, plan.ep_size).sum(dim=1, keepdim=True)
    expected = (x.to(torch.float32) * copies).to(torch.bfloat16)
    if torch.equal(combined, expected):
        return ""
    bad = int((combined != expected).any(dim=1).sum())
    return f"{bad} of {case.tokens} tokens differ from the sum of their copies"


def _report(events, rank: int, index: int, row: Row) -> None:
    if rank == 0:  # every rank holds the same row
        events.put(("row", rank, (index, row)))


def _gathered_row(case: Case, wire: str, detail: str) -> Row:
    """This case's row for every rank: failed if any rank found a difference."""
    import torch.distributed as dist

    details = [None] * dist.get_world_size()
    dist.all_gather_object(details, detail)
    failed = [(r, d) for r, d in enumerate(details) if d]
    if not failed:
        return Row(case.bucket, case.tokens, wire, "ok")
    r, d = failed[0]
    return Row(
        case.bucket,
        case.tokens,
        wire,
        "failed",
        f"rank {r}: {d}" + (f" (and {len(failed) - 1} more rank(s))" if len(failed) > 1 else ""),
    )
