"""``moepolicy export POLICY --to sglang|vllm``."""

from __future__ import annotations

import argparse
import json
from typing import Optional

from moepolicy.cli._output import (
    add_output_flag,
    command_inputs,
    note,
    output_path,
    write_output,
)
from moepolicy.cli.validate import add_serving_flags, serving_note
from moepolicy.weights_memory import fit_note


# MOEPOLICY_POLICY's folder when --policy-path is not given: the path the policy has on the serving
# nodes is not known here (this machine's path would be wrong there, and says who ran the export)
NODE_PLACEHOLDER = "/same/path/on/every/node"


def serving_path(policy: str, given: Optional[str]) -> tuple[str, str]:
    """MOEPOLICY_POLICY's value, and a note to replace it where it is the placeholder."""
    from pathlib import PurePath

    if given:
        return given, ""
    name = PurePath(policy).name
    return f"{NODE_PLACEHOLDER}/{name}", (
        f"MOEPOLICY_POLICY: copy {name} to one path on every node and put that path here "
        "(export --policy-path PATH writes it)"
    )


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export", help="the vLLM plugin launch, or SGLang's --deepep-config JSON or launch command"
    )
    p.add_argument("policy", help="policy file written by plan or tune")
    p.add_argument(
        "--to",
        required=True,
        choices=["sglang", "vllm"],
        help="vllm: the plugin's launch (env and flags) and what it applies per layer; sglang: "
        "--deepep-config JSON, or --format launch for a launch_server command",
    )
    p.add_argument(
        "--tokens",
        type=int,
        help="SGLang takes one config: the bucket for this many tokens per rank (default: the largest)",
    )
    p.add_argument(
        "--format",
        choices=["shell", "json", "launch"],
        default=None,
        help="vllm: shell (default) or json; sglang: json (the --deepep-config, default) or launch "
        "(a launch_server command with every flag SGLang can take)",
    )
    p.add_argument(
        "--policy-path",
        metavar="PATH",
        help="vllm: where the policy file lies on every serving node, for MOEPOLICY_POLICY (default: "
        f"a placeholder, {NODE_PLACEHOLDER}/ and the policy's file name, to replace)",
    )
    add_output_flag(p, "the export")
    add_serving_flags(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from moepolicy.cli._replay import read_for_replay

    output = output_path(args.output, command_inputs(args))  # before any work
    doc = read_for_replay(args.policy).doc
    serving_note(args)
    fits = fit_note(
        args.model or doc.model.name, doc.target.gpu, doc.target.ep_size, doc.target.engine
    )
    if fits:
        note(f"warning: {fits}")
    if args.to == "sglang":
        from moepolicy.export.sglang import SGLANG_CHECKED, launch
        from moepolicy.export.sglang import export as export_sglang

        if args.format == "launch":
            import shlex

            from moepolicy.text import printable

            result = launch(doc, args.tokens)
            lines = [
                f"# SGLang {SGLANG_CHECKED}; moepolicy's policy as far as SGLang's flags carry it"
            ]
            lines += [f"# {printable(line)}" for line in result.get("about", ())]
            lines += [f"export {k}={shlex.quote(v)}" for k, v in result["env"].items()]
            if result["node_args"]:
                nodes = result["node_args"][1]
                lines.append(
                    f"# on each of the {nodes} nodes: NODE_RANK=0..{int(nodes) - 1} (0 on the head node), "
                    "HEAD_ADDR=the head node's address"
                )
            lines.append(
                " ".join(
                    [
                        "python",
                        "-m",
                        "sglang.launch_server",
                        *(shlex.quote(a) for a in result["args"]),
                        *result["node_args"],
                    ]
                )
            )
            lines += [f"# not carried: {' '.join(printable(n).split())}" for n in result["notes"]]
            text = "\n".join(lines) + "\n"
        else:  # SGLang reads this JSON as it is: where the settings came from goes to stderr
            from moepolicy.deepep.settings import source_words

            text = json.dumps(export_sglang(doc, args.tokens), indent=2) + "\n"
            note(f"the DeepEP settings: {source_words(doc.deepep.provenance.source)}")
    else:
        from moepolicy.export.vllm import export as export_vllm
        from moepolicy.export.vllm import render_shell

        where, replace = serving_path(args.policy, args.policy_path)
        result = export_vllm(doc, where)
        result["notes"] = [n for n in (replace, *result["notes"]) if n]
        text = (
            json.dumps(result, indent=2) + "\n"
            if args.format == "json"
            else render_shell(result, doc.model.name)
        )
    write_output(output, text)
    return 0
