"""``moepolicy audit``: group a policy's layers by decision and reason, fallbacks first; then the DeepEP
section (SMs, provenance, what each bucket measured); then lint the rule packs that decided them (shadowed rules, same-priority overlaps: ``moepolicy.rules.lint``)."""

from __future__ import annotations


import argparse
from collections import defaultdict
from typing import Any

from moepolicy.names import Order
from moepolicy.cli._deepep_summary import deepep_lines
from moepolicy.cli._output import add_format_flag, print_json, table
from moepolicy.document.reader import read_policy
from moepolicy.text import index_ranges

FALLBACK_ORDERS = (Order.DISPATCH_THEN_QUANT,)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "audit", help="group layers by decision; count the fallbacks and their reasons"
    )
    p.add_argument("policy", help="policy file")
    p.add_argument(
        "--rules",
        action="append",
        default=[],
        metavar="FILE",
        help="a user rule pack the policy was planned with (a file or a folder of packs), to lint it too; "
        "packs beside the policy and built-in packs are found by name",
    )
    add_format_flag(p)
    p.set_defaults(run=run)


def packs_for_lint(doc, policy_path: str, extra: list[str]) -> tuple[list, list[str]]:
    """The policy's pack stack, in its order (built-in packs by name, user packs beside the policy or
    among ``--rules``); and a note for each pack not found or changed since planning."""
    from moepolicy.cli._replay import policy_packs

    found, notes = [], []
    for item in policy_packs(doc, policy_path, extra):
        if item.pack is None:
            notes.append(f"pack '{item.ref_name}' not linted: pass its file with --rules")
            continue
        if item.note:
            notes.append(item.note + "; linting the file as it is now")
        found.append(item.pack)
    return found, notes


def run(args: argparse.Namespace) -> int:
    doc = read_policy(args.policy).doc
    found = audit(doc)
    lint = lint_result(doc, args)
    if args.format == "json":
        print_json({**found, "deepep": deepep_lines(doc.deepep), "lint": lint})
        return 0
    print(found["headline"])
    print_groups(found)
    fallbacks = [g for g in found["groups"] if g["fallback"]]
    if fallbacks:
        print("\nwhy the fallbacks happened:")
        for g in fallbacks:
            print(f"- {len(g['layers'])} layer(s) [{g['indices']}] by {g['rule']}: {g['reason']}")
            print(f"  see: moepolicy explain {args.policy} --layer {g['layers'][0]}")
    print()
    for line in deepep_lines(doc.deepep):
        print(line)
    print_lint(lint)
    return 0


def print_groups(found: dict) -> None:
    """The table of layer groups and the per-bucket lines of :func:`audit`'s result."""
    table(
        ["order", "rule", "layers", "indices", "on the wire"],
        [
            [
                ("FALLBACK " if g["fallback"] else "") + g["order"],
                g["rule"],
                len(g["layers"]),
                g["indices"],
                g["wire"],
            ]
            for g in found["groups"]
        ],
    )
    for line in found["per_bucket"]:
        print(line)


def audit(doc) -> dict:
    """The policy's layers grouped by (order, rule, reason), fallbacks first; what per-bucket orders
    there are; one headline."""
    groups: dict[tuple[str, str, str, str], list[int]] = defaultdict(list)  # + wire words
    # rules that sent bf16 because it was measured faster: no fallback
    measured_choice: set[str] = set()
    for layer in doc.layers:
        groups[(layer.order, layer.rule, layer.reason, wire_words(layer))].append(layer.index)
        if layer.unmeasured is not None:
            measured_choice.add(layer.rule)
    rows: list[dict[str, Any]] = []
    for (order, rule, reason, wire), idx in sorted(
        groups.items(), key=lambda kv: (kv[0][0] not in FALLBACK_ORDERS, kv[0][0], kv[0][1])
    ):
        rows.append(
            {
                "order": order,
                "rule": rule,
                "reason": reason,
                "wire": wire,
                "layers": idx,
                "indices": index_ranges(idx),
                "fallback": order in FALLBACK_ORDERS and rule not in measured_choice,
            }
        )
    moe = sum(1 for layer in doc.layers if layer.kind == "moe")
    n_fb = sum(len(g["layers"]) for g in rows if g["fallback"])
    headline = (
        f"{doc.model.name} on {doc.target.gpu} EP{doc.target.ep_size} {doc.target.backend} "
        f"({doc.target.expert_kernel}): {len(doc.layers)} layers, {moe} MoE, "
        f"{n_fb} fell back to bf16 dispatch with quantization after it"
    )
    return {
        "headline": headline,
        "model": doc.model.name,
        "layers": len(doc.layers),
        "moe_layers": moe,
        "fallback_layers": n_fb,
        "groups": rows,
        "per_bucket": _per_bucket_lines(doc),
    }


_QUANTIZED = ("none", "bf16", "unknown", None)


def wire_words(layer) -> str:
    """What a layer sends and, for bf16 from a checkpoint with quantized activations or weights, why
    nothing is quantized around dispatch (from the layer's stored facts)."""
    facts = layer.facts
    if layer.kind != "moe":
        return "no dispatch (dense)"
    dtype = layer.wire.dtype
    if layer.order == Order.DISPATCH_THEN_QUANT:
        return f"{dtype}, quantized after dispatch"
    if layer.order == Order.FUSED:
        return "the expert kernel's own communication"
    if layer.order != Order.NO_QUANT:
        where = "in DeepEP's kernel" if layer.order == Order.IN_KERNEL_QUANT else "before dispatch"
        return f"{dtype}, quantized {where}"
    activations, kernel = facts.get("ckpt.act_dtype"), facts.get("kernel.name", "the")
    if activations not in _QUANTIZED and facts.get("kernel.act_dtype") == "bf16":
        return f"{dtype}: the {kernel} experts quantize their own input ({activations} checkpoint)"
    if facts.get("ckpt.weight_dtype") not in _QUANTIZED:
        return f"{dtype}: weight-only quantization, bf16 activations"
    return f"{dtype}: unquantized"


def _per_bucket_lines(doc) -> list[str]:
    """Layers whose order changes with the token count (measured facts, decided by the rules)."""
    groups: dict[str, list[int]] = defaultdict(list)
    for layer in doc.layers:
        if layer.orders:
            previous, parts = None, []
            for entry in layer.orders:
                parts.append(
                    (f"<= {entry.max_tokens}" if entry.max_tokens is not None else f"> {previous}")
                    + f": {entry.order}"
                )
                previous = entry.max_tokens
            groups[", ".join(parts)].append(layer.index)
    return [
        f"per token bucket, {len(idx)} layer(s) [{index_ranges(idx)}]: {what} (measured, see explain)"
        for what, idx in groups.items()
    ]


def lint_result(doc, args) -> dict:
    """The rule packs that decided the policy, linted (cached per pack stack)."""
    from moepolicy.rules.lint import lint_packs_cached

    packs, notes = packs_for_lint(doc, args.policy, args.rules)
    findings = lint_packs_cached(packs) if packs else []
    return {
        "packs": [p.name for p in packs],
        "findings": [{"kind": f.kind, "message": f.message} for f in findings],
        "notes": notes,
    }


def print_lint(lint: dict) -> None:
    names = ", ".join(lint["packs"]) or "none"
    findings = lint["findings"]
    print(
        f"\nrule packs ({names}): "
        + (
            f"{len(findings)} finding(s)"
            if findings
            else "no shadowed rules, no same-priority overlaps"
        )
    )
    for finding in findings:
        print(f"- {finding['kind']}: {finding['message']}")
    for note in lint["notes"]:
        print(f"- note: {note}")
