"""Rule-pack lint (``moepolicy.rules.lint``, shown by ``moepolicy audit``): shadowed rules and
same-priority overlaps, reported where they exist and only there."""

import textwrap

from conftest import run_cli
from moepolicy.rules.grammar import load_pack
from moepolicy.rules.lint import lint_packs
from moepolicy.rules.packs import builtin_pack, known_capabilities

PACK = """
pack: mine
version: "1"
rules:
  - id: mine/group
    priority: 10
    when: {fact: ckpt.act_granularity, op: eq, value: group}
    then: {order: dispatch_then_quant, numerics: exact}
    why: Group-quantized activations go bf16.
    source: test
  - id: mine/group-128
    priority: 5
    when: {all: [{fact: ckpt.act_granularity, op: eq, value: group}, {fact: ckpt.act_group, op: eq, value: 128}]}
    then: {order: quant_then_dispatch, wire: {dtype: fp8_e4m3, scale: {granularity: block, group: 128, dtype: float32, layout: row}}, numerics: exact}
    why: Never reached after mine/group.
    source: test
  - id: mine/fp8-acts
    priority: 7
    when: {fact: ckpt.act_dtype, op: eq, value: fp8_e4m3}
    then: {order: dispatch_then_quant, numerics: exact}
    why: One of two overlapping rules.
    source: test
  - id: mine/hopper
    priority: 7
    when: {fact: target.arch, op: eq, value: sm90}
    then: {order: no_quant, numerics: exact}
    why: The other.
    source: test
  - id: mine/token
    priority: 3
    when: {fact: ckpt.act_granularity, op: eq, value: token}
    then: {order: dispatch_then_quant, numerics: exact}
    why: Exclusive with mine/tensor.
    source: test
  - id: mine/tensor
    priority: 3
    when: {fact: ckpt.act_granularity, op: eq, value: tensor}
    then: {order: no_quant, numerics: exact}
    why: Exclusive with mine/token.
    source: test
  - id: mine/small-ep
    priority: 2
    when: {fact: target.ep_size, op: le, value: 4}
    then: {order: dispatch_then_quant, numerics: exact}
    why: Numeric ranges that do not meet.
    source: test
  - id: mine/large-ep
    priority: 2
    when: {fact: target.ep_size, op: ge, value: 5}
    then: {order: no_quant, numerics: exact}
    why: Numeric ranges that do not meet.
    source: test
"""


def _pack(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(textwrap.dedent(PACK))
    return path, load_pack(path, known_capabilities())


def test_lint_finds_the_shadowed_rule_and_the_overlap_only(tmp_path):
    _, pack = _pack(tmp_path)
    findings = {(f.kind, f.rule, f.other) for f in lint_packs([pack])}
    assert findings == {
        ("shadowed", "mine/group-128", "mine/group"),
        ("same-priority-overlap", "mine/hopper", "mine/fp8-acts"),
    }


def test_builtin_packs_lint_clean():
    for name in ("deepep", "vllm"):
        assert lint_packs([builtin_pack(name)]) == [], name


def test_a_user_catch_all_shadows_the_builtin_pack(tmp_path):
    path = tmp_path / "all.yaml"
    path.write_text(
        textwrap.dedent("""
        pack: all-bf16
        version: "1"
        rules:
          - id: all-bf16/everything
            priority: 1
            when: {all: []}
            then: {order: dispatch_then_quant, numerics: exact}
            why: bf16 everywhere.
            source: test
    """)
    )
    findings = lint_packs([load_pack(path, known_capabilities()), builtin_pack("deepep")])
    shadowed = {f.rule for f in findings if f.kind == "shadowed"}
    moe_rules = {r.id for r in builtin_pack("deepep").rules if r.then.order != "none"}
    assert (
        shadowed == moe_rules
    )  # every built-in rule for MoE layers; dense layers still get theirs
    assert all(f.other == "all-bf16/everything" for f in findings)


def test_audit_prints_the_lint(tmp_path):
    pack_path, _ = _pack(tmp_path)
    (tmp_path / "out").mkdir()
    policy = (
        tmp_path / "out" / "p.yaml"
    )  # not beside the pack: audit finds it only where it is told
    planned = run_cli(
        "plan",
        "--model",
        "DeepSeek-V3",
        "--ep-size",
        "8",
        "--rules",
        str(pack_path),
        "-o",
        str(policy),
    )
    assert planned.returncode == 0, planned.stderr
    import yaml

    layers = yaml.safe_load(policy.read_text())["layers"]
    dense = [layer for layer in layers if layer["kind"] == "dense"]
    # mine/hopper (no layer.kind in its condition) holds for dense layers too, but its order cannot apply
    assert dense and all(
        layer["order"] == "none" and layer["rule"] == "dense/none" for layer in dense
    )
    explained = run_cli(
        "explain", str(policy), "--layer", str(dense[0]["index"]), "--rules", str(pack_path)
    )
    assert (
        "n/a" in explained.stdout
        and "order no_quant does not apply to a dense layer" in explained.stdout
    )
    result = run_cli("audit", str(policy), "--rules", str(pack_path))
    assert result.returncode == 0, result.stderr
    assert "rule packs (mine, deepep, experts): " in result.stdout
    assert "same-priority-overlap: rules 'mine/fp8-acts' and 'mine/hopper'" in result.stdout
    assert "shadowed: rule 'mine/group-128' (mine) is shadowed by 'mine/group'" in result.stdout
    without = run_cli("audit", str(policy))
    assert "pack 'mine' not linted: pass its file with --rules" in without.stdout
