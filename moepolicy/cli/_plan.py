"""The plan the target flags ask for, with the lines ``plan``, ``tune`` and ``explain --model`` say
about it (the target, the catalog's copy, the weights' fit), and the closing line comparing a policy
with what vLLM decides (``planner.vllm_plan``). The library reads and decides; this module words."""

from __future__ import annotations

import argparse
from typing import Optional

from moepolicy import api
from moepolicy.checkpoint import catalog
from moepolicy.checkpoint.hub import parse_id, real_config_words
from moepolicy.cli._output import note
from moepolicy.cli._target import target_spec
from moepolicy.names import Order
from moepolicy.planner import Plan, vllm_plan
from moepolicy.rules.engine import Decision


def build_plan(args: argparse.Namespace, default_ep: Optional[int] = None) -> Plan:
    """The plan the flags ask for, its checkpoint read once; ``default_ep`` is the EP size without
    --ep-size (a live tune's ranks), else one full node."""
    if args.ep_size is None and default_ep is None:
        default_ep = default_ep_size(args)
    read = api.read_plan(args.model, target_spec(args), rules=args.rules, default_ep=default_ep)
    plan = read.plan
    note(plan.target.describe(plan.kernel_label))
    _say_catalog_copy(args.model, plan.model.source)
    fits = read.fit_warning()
    if fits:
        note(f"warning: {fits}")
    return plan


def default_ep_size(args: argparse.Namespace) -> int:
    """The EP size a plan (or a tune that counts no GPUs) is made for without --ep-size: one full
    node, said on stderr."""
    ep = args.gpus_per_node or api.DEFAULT_NODE_GPUS
    note(f"no --ep-size: planning for one full node, EP {ep} (pass --ep-size to choose)")
    return ep


def _say_catalog_copy(spec: str, source: str) -> None:
    """A Hugging Face id the catalog holds is read from the catalog's copy of its config: said, with
    how to read the hub's (or a local cache's) instead."""
    hub_id = parse_id(spec)
    if hub_id is not None and hub_id.revision is None and source.startswith("catalog:"):
        note(
            f"model: {hub_id} from moepolicy's catalog (its config as shipped); the checkpoint's own "
            f"config: {real_config_words(hub_id.repo_id)}"
        )
    entry = catalog.lookup(source.split(":", 1)[1]) if source.startswith("catalog:") else None
    if entry is not None and entry.partial:
        note(
            f"warning: {entry.repo_id}'s catalog copy is partial (it lacks part of the real config: "
            f"{entry.folder / 'SOURCE.md'}): its layers can read as an unknown scheme and fall back "
            f"where the checkpoint's would not; plan from the real config before serving: "
            f"{real_config_words(entry.repo_id)}"
        )


def vllm_difference(
    plan: Plan, deepep: str = "DeepEP: its default configs, as vLLM runs it"
) -> str:
    """One line: how this plan's MoE layers differ from what vLLM decides today (its ``vllm`` pack on
    the same target), and what the DeepEP section changes; empty when the plan is vLLM's own."""
    vllm = vllm_plan(plan)
    if vllm is None:
        return ""
    moe = [(a, b) for a, b in zip(plan.layers, vllm.layers) if a.layer.kind == "moe"]
    if not moe:
        return ""
    differ = [
        (a, b)
        for a, b in moe
        if (a.decision.order, a.decision.wire, a.execution.kernel)
        != (b.decision.order, b.decision.wire, b.execution.kernel)
    ]
    if not differ:
        return f"this policy matches vLLM's own choice on all {len(moe)} MoE layers; {deepep}"
    a, b = differ[0]
    kernel = (
        f"{a.execution.kernel} experts where vLLM builds {b.execution.kernel}, "
        if a.execution.kernel != b.execution.kernel
        else ""
    )
    return (
        f"this policy differs from vLLM's own choice on {len(differ)} of {len(moe)} MoE layers (layer "
        f"{a.layer.index}: {kernel}{_sends(a.decision)} where vLLM {_sends(b.decision)}; "
        f"'moepolicy plan --rules vllm' shows vLLM's); {deepep}"
    )


# where a decision's order quantizes, in the closing line's words (any other order: not quantized)
_QUANTIZED: dict[str, str] = {
    Order.QUANT_THEN_DISPATCH: "quantized before dispatch",
    Order.IN_KERNEL_QUANT: "quantized in the dispatch kernel",
    Order.DISPATCH_THEN_QUANT: "quantized after dispatch",
}


def _sends(decision: Decision) -> str:
    where = _QUANTIZED.get(decision.order, "not quantized")
    return f"sends {decision.wire.dtype} ({where})"
