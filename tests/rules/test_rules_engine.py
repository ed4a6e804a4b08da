"""The rule grammar (validation with precise errors) and the engine (total, deterministic)."""

import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moepolicy.errors import RulePackError
from moepolicy.rules.engine import decide
from moepolicy.rules.grammar import load_pack
from moepolicy.rules.packs import builtin_pack, known_capabilities, pack_stack
from moepolicy.rules.vocabulary import VOCABULARY
from moepolicy.datasheets import deepep_sheet


def write_pack(tmp_path, body: str):
    path = tmp_path / "pack.yaml"
    path.write_text(textwrap.dedent(body))
    return path


GOOD_RULE = """
pack: mine
version: "1"
rules:
  - id: mine/override
    priority: 10
    when: {fact: ckpt.act_granularity, op: eq, value: group}
    then: {order: dispatch_then_quant, numerics: exact}
    why: Test.
    source: test
"""


@pytest.mark.parametrize(
    "mutation, fragment",
    [
        (
            ("ckpt.act_granularity", "ckpt.act_granularty"),
            "rule 'mine/override' at rules[0].when.fact: unknown fact 'ckpt.act_granularty' (did you mean 'ckpt.act_granularity'?)",
        ),
        (
            ("op: eq", "op: eqq"),
            "operator 'eqq' does not apply to ckpt.act_granularity (enum) (did you mean 'eq'?)",
        ),
        (
            ("value: group", "value: groups"),
            "'groups' is not a value of ckpt.act_granularity (did you mean 'group'?)",
        ),
        (
            ("order: dispatch_then_quant", "order: dispatch_then_quantize"),
            "did you mean 'dispatch_then_quant'?",
        ),
        (("priority: 10", "priority: high"), "rules[0].priority: expected an integer"),
        (("why: Test.", "whyy: Test."), "unknown key 'whyy' (did you mean 'why'?)"),
        (
            (
                "{fact: ckpt.act_granularity, op: eq, value: group}",
                "{fact: layer.hidden_size, op: contains, value: x}",
            ),
            "operator 'contains' does not apply to layer.hidden_size (int)",
        ),
        (
            (
                "{fact: ckpt.act_granularity, op: eq, value: group}",
                "{fact: layer.hidden_size, op: gt, value: '7168'}",
            ),
            "layer.hidden_size is int, got '7168'",
        ),
        (
            (
                "{fact: ckpt.act_granularity, op: eq, value: group}",
                "{any: {fact: layer.kind, op: eq, value: moe}}",
            ),
            "when.any: expected a list of conditions",
        ),
        (
            ("    source: test\n", "    source: test\n    requires: [ht.dispatch.token_scale]\n"),
            "unknown capability 'ht.dispatch.token_scale' (did you mean 'ht.dispatch.token_scales'?)",
        ),
        (
            (
                "then: {order: dispatch_then_quant, numerics: exact}",
                "then: {order: quant_then_dispatch}",
            ),
            "order quant_then_dispatch needs a wire",
        ),
    ],
)
def test_pack_errors_name_file_rule_path_and_nearest(tmp_path, mutation, fragment):
    old, new = mutation
    assert old in GOOD_RULE
    path = write_pack(tmp_path, GOOD_RULE.replace(old, new))
    with pytest.raises(RulePackError) as err:
        load_pack(path, known_capabilities())
    assert str(path) in str(err.value)
    assert fragment in str(err.value)


def test_good_pack_loads_and_outranks_builtin(tmp_path):
    pack = load_pack(write_pack(tmp_path, GOOD_RULE), known_capabilities())
    assert pack.name == "mine" and pack.rules[0].id == "mine/override"
    stack = pack_stack([str(tmp_path / "pack.yaml")])
    assert [p.name for p in stack] == ["mine", "deepep", "experts"]


def test_pack_yaml_cannot_run_code(tmp_path):
    path = write_pack(
        tmp_path, "pack: !!python/object/apply:os.system ['echo pwned']\nrules: []\n"
    )
    with pytest.raises(RulePackError, match="invalid YAML"):
        load_pack(path, known_capabilities())


def test_duplicate_rule_ids_refused(tmp_path):
    body = GOOD_RULE + GOOD_RULE.split("rules:\n", 1)[1]
    with pytest.raises(RulePackError, match="appears twice"):
        load_pack(write_pack(tmp_path, body), known_capabilities())


def test_layer_ranges_override(tmp_path):
    body = GOOD_RULE.replace("    priority: 10\n", "    priority: 10\n    layers: '3-5,9'\n")
    pack = load_pack(write_pack(tmp_path, body), known_capabilities())
    sheet = deepep_sheet("deepep-legacy-29d31c0")
    base = {"ckpt.act_granularity": "group", "target.layout": "intranode"}
    chosen = {
        i: decide(
            {**base, "layer.index": i}, [pack, builtin_pack("deepep")], sheet, lambda t, f: None
        ).rule
        for i in (2, 3, 5, 6, 9)
    }
    assert chosen[3] == chosen[5] == chosen[9] == "mine/override"
    assert chosen[2] != "mine/override" and chosen[6] != "mine/override"


# --- property tests: total and deterministic over generated facts ------------------------------


def _values(name):
    ftype = VOCABULARY[name]
    if ftype.kind == "enum":
        return st.sampled_from(ftype.values)
    if ftype.kind == "bool":
        return st.booleans()
    if ftype.kind == "int":
        return st.integers(min_value=0, max_value=20000)
    if ftype.kind == "set":
        return st.lists(
            st.sampled_from(
                ["group", "token", "tensor", "per-sender-scales", "inferred-capabilities"]
            ),
            unique=True,
        )
    return st.sampled_from(["deepgemm", "cutlass", "triton", "marlin", "h200", "fp8", "x"])


FACTS = st.fixed_dictionaries({name: _values(name) for name in VOCABULARY})


@settings(max_examples=300, deadline=None)
@given(facts=FACTS, inferred=st.booleans())
def test_engine_is_total_and_deterministic(facts, inferred):
    packs = [builtin_pack("deepep")]
    sheet = deepep_sheet("deepep-legacy-29d31c0")
    first = decide(facts, packs, sheet, lambda t, f: None, allow_inferred=inferred)
    second = decide(dict(facts), packs, sheet, lambda t, f: None, allow_inferred=inferred)
    assert first == second
    fired = [s for s in first.trace if s.outcome == "fired"]
    assert len(fired) == 1 and fired[0].rule == first.rule
    assert first.trace[-1] == fired[0]
    if facts["layer.kind"] == "dense":
        assert first.order == "none"


@settings(max_examples=200, deadline=None)
@given(facts=FACTS)
def test_an_infeasible_wire_never_wins(facts):
    packs = [builtin_pack("deepep")]
    sheet = deepep_sheet("deepep-legacy-29d31c0")
    decision = decide(
        facts, packs, sheet, lambda then, f: "no fp8" if then.wire.dtype == "fp8_e4m3" else None
    )
    assert decision.wire.dtype != "fp8_e4m3"


def test_vllm_pack_is_total_too():
    pack = builtin_pack("vllm")
    assert pack.rules[-1].when.items == () and pack.rules[-1].priority == 0


def test_a_failed_any_reports_every_branch():
    from moepolicy.rules.engine import evaluate
    from moepolicy.rules.grammar import AnyOf, Leaf

    cond = AnyOf(
        (
            Leaf("ckpt.act_granularity", "eq", "group", "when.any[0]"),
            Leaf("target.ep_size", "ge", 4, "when.any[1]"),
        ),
        "when",
    )
    failure = evaluate(cond, {"ckpt.act_granularity": "token", "target.ep_size": 2})
    assert failure.render() == (
        "none of any held: ckpt.act_granularity eq group failed: saw token | "
        "target.ep_size ge 4 failed: saw 2"
    )
    assert evaluate(cond, {"ckpt.act_granularity": "token", "target.ep_size": 8}) is None


LOGFMT_PACK = """
pack: lowcombine
version: "1"
rules:
  - id: lowcombine/ll-block-fp8-logfmt
    priority: 10
    when:
      all:
        - {fact: layer.kind, op: eq, value: moe}
        - {fact: kernel.act_dtype, op: eq, value: fp8_e4m3}
        - {fact: kernel.act_group, op: eq, value: 128}
        - {fact: kernel.scale_dtype, op: eq, value: float32}
    requires: [ll.dispatch.in_kernel_fp8, ll.combine.logfmt]
    then:
      order: in_kernel_quant
      wire: {dtype: fp8_e4m3, scale: {granularity: block, group: 128, dtype: float32, layout: row}}
      numerics: approximate
      combine: logfmt
    why: Low-latency dispatch quantizes in the kernel and combine sends LogFMT back.
    source: test
"""


@pytest.mark.parametrize(
    "backend, version, combine, rule",
    [
        ("deepep_ll", "29d31c0", "logfmt", "lowcombine/ll-block-fp8-logfmt"),
        (
            "deepep_ht",
            "29d31c0",
            "bf16",
            "deepep-ht/block-fp8",
        ),  # LogFMT is low-latency only: infeasible
        (
            "deepep_ll",
            "v2-dd758ca",
            "bf16",
            "deepep-v2-ll/block-fp8-prequantized",
        ),  # v2 has no LogFMT combine
    ],
)
def test_a_rule_may_choose_a_low_precision_combine_where_the_sheet_has_it(
    tmp_path, backend, version, combine, rule
):
    from moepolicy.checkpoint import read_model
    from moepolicy.document.compose import build_document
    from moepolicy.planner import make_plan
    from moepolicy.target import TargetSpec, resolve_target

    path = write_pack(tmp_path, LOGFMT_PACK)
    target = resolve_target(
        TargetSpec(
            gpu="h200",
            ep_size=8,
            backend=backend,
            deep_ep_version=version,
            expert_kernel="deepgemm",
        ),
        probe=False,
    )  # experts that take block fp8
    plan = make_plan(read_model("DeepSeek-V3"), target, pack_stack([str(path)]))
    decision = plan.layers[3].decision
    assert (decision.rule, decision.combine) == (rule, combine)
    assert build_document(plan)["layers"][3]["combine"] == {"dtype": combine}


def test_a_low_precision_combine_cannot_be_called_exact(tmp_path):
    path = write_pack(tmp_path, LOGFMT_PACK.replace("numerics: approximate", "numerics: exact"))
    with pytest.raises(RulePackError, match="numerics is approximate"):
        load_pack(path, known_capabilities())
