"""``moepolicy explain``: replay one layer's decision, every rule considered, and why.

From a policy file the layer's stored facts are replayed through the same rule packs (checked by
sha256); with ``--model`` the layer is planned afresh.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from moepolicy.cli._output import add_format_flag, note, print_json
from moepolicy.cli._replay import policy_packs, read_for_replay
from moepolicy.cli._target import add_target_flags
from moepolicy.errors import PolicyError, UsageError
from moepolicy.feasibility import wire_problem
from moepolicy.rules.engine import Decision, choose_kernel, decide
from moepolicy.rules.vocabulary import VOCABULARY
from moepolicy.target import target_from_doc

_MARK = {
    "fired": "=> fired",
    "condition-false": "   no",
    "not-for-this-layer": "   n/a",
    "capability-blocked": "   blocked",
    "infeasible": "   infeasible",
}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("explain", help="why a layer got its order: every rule considered")
    p.add_argument("policy", nargs="?", help="policy file (or use --model with target flags)")
    p.add_argument("--layer", type=int, help="decoder layer index")
    p.add_argument("--model", help="plan this model instead of reading a policy file")
    p.add_argument("--vocab", action="store_true", help="list the facts rules may use, with types")
    add_target_flags(p)
    add_format_flag(p)
    p.set_defaults(run=run)


def wire_words(wire) -> str:
    """A wire in words: ``fp8_e4m3 with block-128 float32 scales (row)``, ``bf16``."""
    wire = (
        wire
        if isinstance(wire, dict)
        else getattr(wire, "as_dict", lambda: {"dtype": str(wire)})()
    )
    scale = wire.get("scale")
    if not scale:
        return str(wire.get("dtype", "bf16")) + (
            " (no scales: a static scale the receiver knows)"
            if wire.get("dtype") == "fp8_e4m3"
            else ""
        )
    group = f"-{scale['group']}" if scale.get("group") else ""
    return f"{wire['dtype']} with {scale['granularity']}{group} {scale['dtype']} scales ({scale.get('layout', 'row')})"


def as_json(index: int, facts: dict, decision: Decision) -> dict:
    return {
        "layer": index,
        "order": decision.order,
        "wire": wire_words(decision.wire),
        "combine": decision.combine,
        "numerics": decision.numerics,
        "rule": decision.rule,
        "why": decision.reason,
        "source": decision.source,
        "evidence": [item.render() for item in decision.evidence],
        "facts": {name: facts[name] for name in VOCABULARY if name in facts},
        "trace": [
            {
                "rule": f"{step.pack}/{step.rule}",
                "priority": step.priority,
                "outcome": step.outcome,
                "detail": step.detail,
            }
            for step in decision.trace
        ],
    }


def render(index: int, facts: dict, decision: Decision, out=None) -> None:
    out = out or sys.stdout
    print(
        f"layer {index}: {decision.order}  (rule {decision.rule}, numerics {decision.numerics})",
        file=out,
    )
    print(f"  wire: {wire_words(decision.wire)}", file=out)
    if decision.combine != "bf16":
        print(f"  combine: {decision.combine}", file=out)
    print(f"  why: {decision.reason}", file=out)
    print(f"  source: {decision.source}", file=out)
    for item in decision.evidence:
        print(f"  evidence: {item.render()}", file=out)
    print("  facts the rules saw:", file=out)
    for name in VOCABULARY:
        if name in facts:
            print(f"    {name} = {_fact_words(facts[name])}", file=out)
    print("  rules considered, in order:", file=out)
    for step in decision.trace:
        detail = f": {step.detail}" if step.detail and step.outcome != "fired" else ""
        print(
            f"  {_MARK[step.outcome]:12} {step.pack}/{step.rule} (priority {step.priority}){detail}",
            file=out,
        )


def _fact_words(value) -> str:
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value)) if value else "(none)"
    return str(value).lower() if isinstance(value, bool) else str(value)


def measured_lines(doc, layer) -> list[str]:
    """What measured facts did to this layer: the timings, the order per token bucket, and the
    rules' decision without them (what a runtime with another tuning key uses)."""
    out = []
    timings = doc.deepep.measured_orders or []
    if timings and (layer.orders or layer.unmeasured):
        out.append(
            "measured (tune, both orders timed): "
            + "; ".join(
                f"T={t.tokens}: quant_then_dispatch {t.quant_then_dispatch_us} us, dispatch_then_quant "
                f"{t.dispatch_then_quant_us} us"
                for t in timings
            )
        )
    if layer.orders:
        previous = None
        for entry in layer.orders:
            name = (
                f"<= {entry.max_tokens} tokens"
                if entry.max_tokens is not None
                else f"> {previous} tokens"
            )
            out.append(f"  {name}: {entry.order} ({entry.wire.dtype}) by {entry.rule}")
            previous = entry.max_tokens
    if layer.unmeasured is not None:
        u = layer.unmeasured
        out.append(
            f"without measured facts (used when the tuning key does not match): {u.order} by {u.rule}"
        )
    return out


def kernel_lines(doc, facts: dict, packs) -> list[str]:
    """The expert-kernel rule replayed on the layer's stored facts, every rule considered, and
    the figures it used (the policy's experts section)."""
    if facts.get("layer.kind") != "moe" or "kernel.default" not in facts:
        return []  # a dense layer, or a document written before the experts pack
    if not any(pack.decides == "expert_kernel" for pack in packs):
        return []
    choice = choose_kernel(facts, packs)
    out = [
        f"expert kernel: {choice.kernel}  (rule {choice.rule})",
        f"  why: {choice.reason}",
        f"  source: {choice.source}",
        "  rules considered, in order:",
    ]
    for step in choice.trace:
        detail = f": {step.detail}" if step.detail and step.outcome != "fired" else ""
        out.append(
            f"  {_MARK[step.outcome]:12} {step.pack}/{step.rule} (priority {step.priority}){detail}"
        )
    experts = getattr(doc, "experts", None)
    if experts is not None:
        out.append(f"  compared by the tune ({experts.source}): {experts.basis}")
        for test in experts.tests:
            where = f"T={test.tokens}" if test.tokens else "weighted over the buckets"
            out.append(
                f"    {where}: {test.contender} vs {test.baseline}: x{test.speedup} (report rounds), "
                f"{test.verdict}"
            )
        out.append(f"  {experts.why}")
    return out


def explain_from_file(path: str, index: int, rules: Sequence[str] = (), fmt: str = "table") -> int:
    loaded = read_for_replay(path)
    doc = loaded.doc
    layers = {layer.index: layer for layer in doc.layers}
    if index not in layers:
        raise UsageError(f"--layer {index} is not in {path} (layers 0-{len(doc.layers) - 1})")
    layer = layers[index]
    packs = []
    for found in policy_packs(doc, path, rules):
        if found.pack is None:
            raise PolicyError(found.note)
        if found.note:
            note(found.note + "; replaying with the current version")
        packs.append(found.pack)
    target = target_from_doc(doc.target)
    from moepolicy.planner import replay_facts  # not for --vocab or --help

    facts = replay_facts(layer.index, layer.facts)
    decision = decide(
        facts,
        packs,
        target.deepep,
        lambda then, f: wire_problem(then, f, target),
        allow_inferred="inferred-capabilities" in target.options,
    )
    kernel = kernel_lines(doc, facts, packs)
    if fmt == "json":
        print_json(
            {
                **as_json(index, facts, decision),
                "measured": measured_lines(doc, layer),
                "expert_kernel": kernel,
            }
        )
    else:
        render(index, facts, decision)
        for line in measured_lines(doc, layer) + kernel:
            print(line)
    if (decision.order, decision.rule) != (layer.order, layer.rule):
        note(
            f"note: the file records {layer.order} by rule {layer.rule}; replay now gives "
            f"{decision.order} by {decision.rule}"
        )
    return 0


def run(args: argparse.Namespace) -> int:
    if args.vocab:
        if args.format == "json":
            print_json(
                {
                    name: {"kind": t.kind, "values": list(t.values or ()), "doc": t.doc}
                    for name, t in VOCABULARY.items()
                }
            )
            return 0
        for name, ftype in VOCABULARY.items():
            values = f" {{{', '.join(ftype.values)}}}" if ftype.values else ""
            print(f"{name:26} {ftype.kind}{values}  {ftype.doc}")
        return 0
    if args.layer is None:
        raise UsageError("--layer N is required (or --vocab)")
    if args.policy and args.model:
        raise UsageError("give a policy file or --model, not both")
    if args.policy:
        return explain_from_file(args.policy, args.layer, args.rules, args.format)
    if not args.model:
        raise UsageError("give a policy file, or --model with target flags")
    from moepolicy.cli._plan import build_plan  # the library's planner: for --model alone

    plan = build_plan(args)
    matches = [lp for lp in plan.layers if lp.layer.index == args.layer]
    if not matches:
        raise UsageError(
            f"--layer {args.layer} is not a layer of {plan.model.name} "
            f"(layers 0-{len(plan.layers) - 1})"
        )
    lp = matches[0]
    kernel = kernel_lines(None, lp.facts, plan.packs)
    if args.format == "json":
        print_json({**as_json(args.layer, lp.facts, lp.decision), "expert_kernel": kernel})
    else:
        render(args.layer, lp.facts, lp.decision)
        for line in kernel:
            print(line)
    return 0
