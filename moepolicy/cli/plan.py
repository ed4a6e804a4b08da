"""``moepolicy plan``: decide every layer for a target and write the policy document."""

from __future__ import annotations

import argparse
import sys

from moepolicy.checkpoint import read_model
from moepolicy.cli._output import add_output_flag, model_inputs, note, output_path, rules_inputs, write_output
from moepolicy.cli._target import add_target_flags, target_from_args
from moepolicy.policy_yaml import dumps
from moepolicy.redact import redact_command
from moepolicy.planner import Plan, build_document, make_plan
from moepolicy.rules.packs import builtin_pack, pack_stack


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="decide quant-before/after dispatch per layer; write the policy")
    p.add_argument("--model", required=True, help="catalog name, config.json, or model folder")
    add_target_flags(p)
    add_output_flag(p, "the policy")
    p.add_argument("--format", choices=["yaml", "json"], help="output format (default: from -o, else yaml)")
    p.set_defaults(run=run)


def build_plan(args: argparse.Namespace, default_ep=None) -> Plan:
    target = target_from_args(args, default_ep=default_ep)
    facts = read_model(args.model, engine=target.engine)
    packs = pack_stack(args.rules)
    plan = make_plan(facts, target, packs)
    note(target.describe(plan.kernel_label))
    return plan


def vllm_difference(plan: Plan) -> str:
    """How many MoE layers vLLM's current rule decides differently (empty if the plan is vLLM's)."""
    if any(p.name == "vllm" for p in plan.packs):
        return ""
    vllm = [builtin_pack("vllm"), *plan.packs[-1:]]
    vllm_plan = make_plan(plan.model, plan.target, vllm)
    moe = [(a, b) for a, b in zip(plan.layers, vllm_plan.layers) if a.layer.kind == "moe"]
    differ = [a.layer.index for a, b in moe if (a.decision.order, a.decision.wire) != (b.decision.order, b.decision.wire)]
    if not moe:
        return ""
    if not differ:
        return f"vLLM today decides all {len(moe)} MoE layers the same way"
    return (f"vLLM today decides {len(differ)} of {len(moe)} MoE layers differently "
            f"(e.g. layer {differ[0]}: see 'moepolicy plan --rules vllm')")


def run(args: argparse.Namespace) -> int:
    output = output_path(args.output, [*model_inputs(args.model), *rules_inputs(args.rules)])  # before any work
    plan = build_plan(args)
    doc = build_document(plan, command="moepolicy " + redact_command(sys.argv[1:]))
    diff = vllm_difference(plan)
    if diff:
        note(diff)
    fmt = args.format or ("json" if output and output.endswith(".json") else "yaml")
    write_output(output, dumps(doc, fmt), f"{len(doc['layers'])} layers")
    return 0
