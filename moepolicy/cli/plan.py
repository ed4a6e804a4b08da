"""``moepolicy plan``: decide every layer for a target and write the policy document."""

from __future__ import annotations

import argparse
import sys

from moepolicy import api
from moepolicy.cli._output import (
    add_output_flag,
    model_inputs,
    note,
    output_path,
    rules_inputs,
    write_output,
)
from moepolicy.cli._plan import build_plan, vllm_difference
from moepolicy.cli._target import add_target_flags
from moepolicy.document.model import PolicyDoc
from moepolicy.document.yaml_io import dumps
from moepolicy.redact import redact_command


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


def run(args: argparse.Namespace) -> int:
    # where the policy goes, checked before any work
    output = output_path(args.output, [*model_inputs(args.model), *rules_inputs(args.rules)])
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
    # at a terminal only: imported here, as audit's evidence summaries cost a piped plan ~20 ms
    from moepolicy.cli.audit import audit, print_groups

    found = audit(PolicyDoc.model_validate(doc))
    print(found["headline"])
    print_groups(found)
    note(
        f"not written: -o FILE writes the policy ({len(doc['layers'])} layers), '-o -' prints it "
        "here, and standard output sent to a pipe or a file gets it"
    )
