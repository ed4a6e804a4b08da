"""Target flags shared by plan, explain and tune (contract: 'The target a policy is made for')."""

from __future__ import annotations

import argparse

from moepolicy import datasheets
from moepolicy.names import Backend, Engine
from moepolicy.target import OPT_INS, TargetSpec


def positive_int(text: str) -> int:
    """A count of ranks or GPUs, refused while the command line is read (before any work)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def add_target_flags(
    p: argparse.ArgumentParser, ep_default: str = "one full node (--gpus-per-node)"
) -> None:
    g = p.add_argument_group("target")
    g.add_argument(
        "--gpu",
        help=f"hardware profile ({', '.join(_profiles())}); default: the visible GPU, else h200",
    )
    g.add_argument(
        "--ep-size", type=positive_int, help=f"expert-parallel ranks (default: {ep_default})"
    )
    g.add_argument(
        "--gpus-per-node",
        type=positive_int,
        help="ranks per NVLink domain; EP above it is internode (default 8)",
    )
    g.add_argument(
        "--backend",
        default="deepep_ht",
        choices=Backend.values(),
        help="DeepEP high-throughput (normal) or low-latency kernels (default deepep_ht)",
    )
    g.add_argument(
        "--expert-kernel",
        help="what consumes dispatched tokens (deepgemm, cutlass, triton, marlin, "
        "flashinfer_cutlass); default: what vLLM picks for the GPU and scheme",
    )
    g.add_argument(
        "--engine",
        default="vllm",
        choices=Engine.values(),
        help="whose conventions to follow (ignore-list matching, scale layout)",
    )
    g.add_argument(
        "--deep-ep-version",
        help=f"DeepEP capability sheet ({', '.join(_sheets())}); default: probed from "
        "the installed deep_ep, else the newest. Planning on a machine without DeepEP for a cluster with "
        "it: name the cluster's build, or the policy's tuning key will not match there",
    )
    g.add_argument(
        "--rules",
        action="append",
        default=[],
        metavar="FILE",
        help="extra rule pack (file or built-in name such as 'vllm'), higher priority than the built-in one",
    )
    g.add_argument(
        "--opt-in",
        action="append",
        default=[],
        choices=list(OPT_INS),
        help="enable an opt-in rule path",
    )
    g.add_argument(
        "--static-scale",
        default="global-max",
        choices=["global-max", "per-expert"],
        help="static per-tensor input scale convention (default: one global max, as vLLM loads it)",
    )


def target_spec(args: argparse.Namespace) -> TargetSpec:
    """The target the flags ask for (resolved and checked by ``target.resolve_target``)."""
    return TargetSpec(
        gpu=args.gpu,
        ep_size=args.ep_size,
        gpus_per_node=args.gpus_per_node,
        backend=args.backend,
        expert_kernel=args.expert_kernel,
        engine=args.engine,
        deep_ep_version=args.deep_ep_version,
        options=tuple(args.opt_in),
        static_scale=args.static_scale,
    )


def _profiles() -> list[str]:
    """The GPU profiles of moepolicy/data/sheets/gpus.yaml (for --help)."""
    return sorted(datasheets.gpu_sheet().gpus)


def _sheets() -> list[str]:
    return sorted(datasheets.deepep_sheets())
