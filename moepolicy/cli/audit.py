"""``moepolicy audit``: group a policy's layers by decision and reason, fallbacks first; then the DeepEP
section (SMs, provenance, what each bucket measured); then lint the rule packs that decided them (shadowed rules, same-priority overlaps: ``moepolicy.rules.lint``)."""

from __future__ import annotations


import argparse
from collections import defaultdict

from moepolicy.cli._deepep_summary import deepep_lines
from moepolicy.cli._output import table
from moepolicy.text import index_ranges

FALLBACK_ORDERS = ("dispatch_then_quant",)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("audit", help="group layers by decision; count the fallbacks and their reasons")
    p.add_argument("policy", help="policy file")
    p.add_argument("--rules", action="append", default=[], metavar="FILE",
                   help="a user rule pack the policy was planned with (a file or a folder of packs), to lint it too; "
                        "packs beside the policy and built-in packs are found by name")
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
    from moepolicy.policy_reader import read_policy

    loaded = read_policy(args.policy)
    doc = loaded.doc
    groups: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    measured_choice: set[str] = set()  # rules that sent bf16 because it was measured faster: no fallback
    for layer in doc.layers:
        groups[(layer.order, layer.rule, layer.reason)].append(layer.index)
        if layer.unmeasured is not None:
            measured_choice.add(layer.rule)
    fallback = {k: v for k, v in groups.items() if k[0] in FALLBACK_ORDERS and k[1] not in measured_choice}
    moe = sum(1 for layer in doc.layers if layer.kind == "moe")
    n_fb = sum(len(v) for v in fallback.values())
    print(f"{doc.model.name} on {doc.target.gpu} EP{doc.target.ep_size} {doc.target.backend} "
          f"({doc.target.expert_kernel}): {len(doc.layers)} layers, {moe} MoE, "
          f"{n_fb} fell back to bf16 dispatch with quantization after it")
    rows = []
    for (order, rule, _reason), idx in sorted(groups.items(), key=lambda kv: (kv[0][0] not in FALLBACK_ORDERS, kv[0][0], kv[0][1])):
        mark = "FALLBACK " if order in FALLBACK_ORDERS and rule not in measured_choice else ""
        rows.append([f"{mark}{order}", rule, len(idx), index_ranges(idx)])
    table(["order", "rule", "layers", "indices"], rows)
    for line in _per_bucket_lines(doc):
        print(line)
    if fallback:
        print("\nwhy the fallbacks happened:")
        for (_order, rule, reason), idx in fallback.items():
            print(f"- {len(idx)} layer(s) [{index_ranges(idx)}] by {rule}: {reason}")
            print(f"  see: moepolicy explain {args.policy} --layer {idx[0]}")
    print()
    for line in deepep_lines(doc.deepep):
        print(line)
    print_lint(doc, args)
    return 0


def _per_bucket_lines(doc) -> list[str]:
    """Layers whose order changes with the token count (measured facts, decided by the rules)."""
    groups: dict[str, list[int]] = defaultdict(list)
    for layer in doc.layers:
        if layer.orders:
            previous, parts = None, []
            for entry in layer.orders:
                parts.append((f"<= {entry.max_tokens}" if entry.max_tokens is not None else f"> {previous}")
                             + f": {entry.order}")
                previous = entry.max_tokens
            groups[", ".join(parts)].append(layer.index)
    return [f"per token bucket, {len(idx)} layer(s) [{index_ranges(idx)}]: {what} (measured, see explain)"
            for what, idx in groups.items()]


def print_lint(doc, args) -> None:
    from moepolicy.rules.lint import lint_packs_cached

    packs, notes = packs_for_lint(doc, args.policy, args.rules)
    findings = lint_packs_cached(packs) if packs else []
    names = ", ".join(p.name for p in packs) or "none"
    print(f"\nrule packs ({names}): " + (f"{len(findings)} finding(s)" if findings else "no shadowed rules, "
                                          "no same-priority overlaps"))
    for finding in findings:
        print(f"- {finding.kind}: {finding.message}")
    for note in notes:
        print(f"- note: {note}")
