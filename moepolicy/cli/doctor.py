"""``moepolicy doctor``: what this node offers a policy, and the flags that plan for it elsewhere."""

from __future__ import annotations

import argparse
import dataclasses

from moepolicy.cli._output import add_format_flag, print_json
from moepolicy.names import CHECKED_VLLM_RELEASES


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "doctor",
        help="what this node has: the DeepEP build's APIs (the --deep-ep-version to plan with), "
        "the vLLM release and whether the plugin supports it, the GPUs",
    )
    add_format_flag(p)
    p.set_defaults(run=run)


def _deep_ep_line(found) -> str:
    from moepolicy.node import BACKENDS_OF_API

    if not found.installed:
        return "deep_ep: not importable here (install DeepEP on the serving nodes; plan there, or pass --deep-ep-version)"
    version = found.version or "version unknown"
    if not found.sheets:
        return f"deep_ep {version}: matches no sheet moepolicy knows (plan with the newest sheet and expect a mismatch)"
    offered = "; ".join(
        f"{sheet} ({', '.join(BACKENDS_OF_API[api])})"
        for sheet, api in zip(found.sheets, found.apis)
    )
    return f"deep_ep {version}: offers {offered}"


def _vllm_line(found) -> str:
    checked = " or ".join(f"{r}.x" for r in CHECKED_VLLM_RELEASES)
    if found.version is None:
        return f"vllm: not installed in this environment (the plugin supports {checked})"
    if found.checked:
        return f"vllm {found.version}: the plugin supports it"
    return f"vllm {found.version}: the plugin is not checked against it (serve with {checked})"


def _gpus_line(gpus) -> str:
    if not gpus.count:
        return "gpus: none visible (NVML)"
    profile = f"--gpu {gpus.profile}" if gpus.profile else "no GPU profile matches (pass --gpu)"
    return (
        f"gpus: {gpus.count} x {gpus.names[0]}: {profile}; EP up to {gpus.count} on one node is "
        f"intranode (--gpus-per-node {gpus.count})"
    )


def run(args: argparse.Namespace) -> int:
    from moepolicy.node import inspect_node

    report = inspect_node()
    if args.format == "json":
        print_json({**dataclasses.asdict(report), "plan_flags": report.plan_flags()})
        return 0
    print(f"moepolicy {report.moepolicy}")
    print(_deep_ep_line(report.deep_ep))
    print(_vllm_line(report.vllm))
    print(_gpus_line(report.gpus))
    flags = " ".join(report.plan_flags())
    print(
        f"plan for this node from anywhere: moepolicy plan --model MODEL --ep-size N {flags}".rstrip()
    )
    return 0
