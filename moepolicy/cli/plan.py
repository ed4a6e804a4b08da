"""``moepolicy plan``: decide every layer for a target and write the policy document."""

from __future__ import annotations

import argparse
import sys

from moepolicy import api
from moepolicy.names import Order
from moepolicy.cli._output import (
    add_output_flag,
    model_inputs,
    note,
    output_path,
    rules_inputs,
    write_output,
)
from moepolicy.cli._target import add_target_flags, default_ep_size, target_spec
from moepolicy.document.yaml_io import dumps
from moepolicy.redact import redact_command
from moepolicy.planner import Plan, make_plan
from moepolicy.rules.packs import vllm_stack
from moepolicy.weights_memory import fit_note


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan", help="decide quant-before/after dispatch per layer; write the policy"
    )
    p.add_argument(
        "--model",
        required=True,
        help="catalog name, Hugging Face id (org/name[@rev]), config.json, or model folder",
    )
    add_target_flags(p)
    add_output_flag(p, "the policy")
    p.add_argument(
        "--format", choices=["yaml", "json"], help="output format (default: from -o, else yaml)"
    )
    p.set_defaults(run=run)


def build_plan(args: argparse.Namespace, default_ep=None) -> Plan:
    """The plan the flags ask for; ``default_ep`` is the EP size without --ep-size (a live tune's
    ranks), else one full node."""
    if args.ep_size is None and default_ep is None:
        default_ep = default_ep_size(args)
    plan = api.plan(args.model, target_spec(args), rules=args.rules, default_ep=default_ep)
    target = plan.target
    note(target.describe(plan.kernel_label))
    _say_catalog_copy(args.model, plan.model.source)
    fits = fit_note(args.model, target.gpu, target.ep_size, target.engine)
    if fits:
        note(f"warning: {fits}")
    return plan


def _say_catalog_copy(spec: str, source: str) -> None:
    """A Hugging Face id the catalog holds is read from the catalog's copy of its config: said, with
    how to read the hub's (or a local cache's) instead."""
    from moepolicy.checkpoint import catalog
    from moepolicy.checkpoint.hub import parse_id, real_config_words

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
    if any(p.name == "vllm" for p in plan.packs):
        return ""
    vllm_plan = make_plan(plan.model, plan.target, vllm_stack())
    moe = [(a, b) for a, b in zip(plan.layers, vllm_plan.layers) if a.layer.kind == "moe"]
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


def _sends(decision) -> str:
    wire = decision.wire.dtype
    where = {
        Order.QUANT_THEN_DISPATCH: "quantized before dispatch",
        Order.IN_KERNEL_QUANT: "quantized in the dispatch kernel",
        Order.DISPATCH_THEN_QUANT: "quantized after dispatch",
    }.get(decision.order, "not quantized")
    return f"sends {wire} ({where})"


def run(args: argparse.Namespace) -> int:
    output = output_path(
        args.output, [*model_inputs(args.model), *rules_inputs(args.rules)]
    )  # before any work
    plan = build_plan(args)
    doc = api.policy_document(plan, command="moepolicy " + redact_command(sys.argv[1:]))
    diff = vllm_difference(plan)
    if diff:
        note(diff)
    if args.output is None and sys.stdout.isatty():  # a person at a terminal, not a pipe or a file
        _summary(doc)
        return 0
    fmt = args.format or ("json" if output and output.endswith(".json") else "yaml")
    write_output(output, dumps(doc, fmt), f"{len(doc['layers'])} layers")
    return 0


def _summary(doc: dict) -> None:
    """The plan as audit shows it (layers grouped by decision), instead of the whole document."""
    from moepolicy.cli.audit import audit, print_groups
    from moepolicy.document.model import PolicyDoc

    found = audit(PolicyDoc.model_validate(doc))
    print(found["headline"])
    print_groups(found)
    note(
        f"not written: -o FILE writes the policy ({len(doc['layers'])} layers), '-o -' prints it "
        "here, and standard output sent to a pipe or a file gets it"
    )
