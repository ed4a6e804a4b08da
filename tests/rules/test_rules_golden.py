"""Golden cases: facts + target → decision and rule id, and every feasibility check."""

import json
from pathlib import Path

import pytest
import yaml

from moepolicy.checkpoint import read_model
from moepolicy.errors import InfeasibleError
from moepolicy.planner import make_plan, with_measurements
from moepolicy.schema.measured import OrderTiming
from moepolicy.rules.packs import pack_stack
from moepolicy.target import TargetSpec, resolve_target

CASES = yaml.safe_load((Path(__file__).parent / "golden" / "deepep_cases.yaml").read_text())[
    "cases"
]
INLINE_BASE = {
    "hidden_size": 4096,
    "num_hidden_layers": 2,
    "num_experts": 64,
    "num_experts_per_tok": 8,
}


def _model(spec, tmp_path):
    if isinstance(spec, str):
        return read_model(spec)
    config = dict(INLINE_BASE)
    if "config_groups" in spec:
        config["quantization_config"] = {"quant_method": "compressed-tensors", **spec}
    else:
        config.update(spec)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return read_model(str(path))


def _target(spec):
    spec = dict(spec)
    options = tuple(spec.pop("options", ()))
    return resolve_target(TargetSpec(options=options, **spec), probe=False)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_golden(case, tmp_path):
    facts = _model(case["model"], tmp_path)
    target = _target(case["target"])
    if "infeasible" in case:
        with pytest.raises(InfeasibleError) as err:
            make_plan(facts, target, pack_stack())
        assert case["infeasible"] in str(err.value)
        return
    plan = with_measurements(
        make_plan(facts, target, pack_stack()),
        [OrderTiming(*timing) for timing in case.get("measured", ())],
    )
    layer = next(lp for lp in plan.layers if lp.layer.index == case["layer"])
    d = layer.decision
    assert (d.order, d.rule) == (case["order"], case["rule"])
    if "wire" in case:
        assert d.wire.dtype == case["wire"]
    if "scale" in case:
        assert (d.wire.scale.dtype if d.wire.scale else None) == case["scale"]
    if "numerics" in case:
        assert d.numerics == case["numerics"]
    for role, level in (case.get("evidence") or {}).items():
        assert d.evidence_level(role) == level, (role, d.evidence)
    assert d.trace[-1].outcome == "fired" and d.trace[-1].rule == case["rule"]


def test_every_default_rule_has_a_golden_case():
    fired = {c["rule"] for c in CASES if "rule" in c}
    rules = {r.id for r in next(p for p in pack_stack() if p.name == "deepep").rules}
    # the generic fallback is a safety net: every scheme the vocabulary can express meets an
    # earlier rule (tested for totality in test_rules_engine)
    untested = rules - fired - {"fallback/safe"}
    assert not untested, f"rules without a golden case: {sorted(untested)}"


# The experts pack: the kernel asked for, the kernel a tune measured faster, else the engine's pick.
KERNEL_CASES = [
    (
        "nothing asked or measured",
        {},
        "unmeasured",
        "flashinfer_cutlass",
        "experts/engine-default",
    ),
    ("asked", {"expert_kernel": "deepgemm"}, "unmeasured", "deepgemm", "experts/asked"),
    ("measured faster", {}, "deepgemm", "deepgemm", "experts/measured-faster"),
    (
        "asked wins over measured",
        {"expert_kernel": "triton"},
        "deepgemm",
        "triton",
        "experts/asked",
    ),
]


@pytest.mark.parametrize(
    "name, spec, faster, kernel, rule", KERNEL_CASES, ids=[c[0] for c in KERNEL_CASES]
)
def test_golden_expert_kernel(name, spec, faster, kernel, rule):
    from moepolicy.planner import decide_layer

    facts = read_model("DeepSeek-V3")
    target = _target({"gpu": "h200", "ep_size": 8, **spec})
    layer = next(x for x in facts.layers if x.index == 3)
    lp = decide_layer(layer, target, pack_stack(), faster_kernel=faster)
    assert (lp.execution.kernel, lp.kernel_choice.rule) == (kernel, rule)
    assert lp.facts["kernel.name"] == kernel


def test_every_expert_kernel_rule_has_a_golden_case():
    rules = {r.id for r in next(p for p in pack_stack() if p.name == "experts").rules}
    assert rules == {c[4] for c in KERNEL_CASES}
