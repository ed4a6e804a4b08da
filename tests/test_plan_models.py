"""Every model in the package's catalog plans, for --gpu h200 and --gpu b200 at EP 8, to the decisions
written out here per model: {(order, rule): count}, or the infeasibility reason."""

import pytest

from moepolicy.errors import InfeasibleError
from moepolicy.planner import build_document, make_plan
from moepolicy.checkpoint import read_model
from moepolicy.rules.packs import pack_stack
from moepolicy.schema.policy import PolicyDoc
from moepolicy.target import resolve_target

from moepolicy._resources import data_dir

CATALOG = data_dir("catalog")

QTD_BLOCK = ("quant_then_dispatch", "deepep-ht/block-fp8")
QTD_UE8M0 = ("quant_then_dispatch", "deepep-ht/block-fp8-ue8m0")
NOQ = ("no_quant", "moe/bf16-activations")
DENSE = ("none", "dense/none")
FP4 = ("dispatch_then_quant", "deepep-ht/fp4-int8-activations")

EXPECTED = {
    "Qwen__Qwen1.5-MoE-A2.7B-Chat-GPTQ-Int4": ("60 experts do not divide over EP size 8",) * 2,
    "Qwen__Qwen3-235B-A22B": ({NOQ: 94}, {NOQ: 94}),
    "Qwen__Qwen3-30B-A3B": ({NOQ: 48}, {NOQ: 48}),
    "Qwen__Qwen3-30B-A3B-FP8": ({QTD_BLOCK: 48}, {QTD_UE8M0: 48}),
    "amd__Mixtral-8x7B-Instruct-v0.1-FP8-KV": (
        {("quant_then_dispatch", "deepep-ht/static-tensor-global-scale"): 32},
        {("quant_then_dispatch", "deepep-ht/static-tensor-global-scale"): 32}),
    "deepseek-ai__DeepSeek-R1": ({DENSE: 3, QTD_BLOCK: 59}, {DENSE: 3, QTD_UE8M0: 59}),
    "deepseek-ai__DeepSeek-V3": ({DENSE: 3, QTD_BLOCK: 59}, {DENSE: 3, QTD_UE8M0: 59}),
    "inference-optimization__GLM-4.6-FP8-dynamic": (
        {DENSE: 3, ("dispatch_then_quant", "moe/unknown-scheme"): 90},
        {DENSE: 3, ("dispatch_then_quant", "moe/unknown-scheme"): 90}),
    "meta-llama__Llama-4-Scout-17B-16E-Instruct": ({NOQ: 48}, {NOQ: 48}),
    "mistralai__Mixtral-8x7B-Instruct-v0.1": ({NOQ: 32}, {NOQ: 32}),
    "moonshotai__Kimi-K2.5": ({DENSE: 1, NOQ: 60}, {DENSE: 1, NOQ: 60}),
    "nvidia__DeepSeek-V3-0324-FP4": (
        {DENSE: 3, NOQ: 58, ("no_quant", "moe/experts-ignored"): 1},
        {DENSE: 3, FP4: 58, ("no_quant", "moe/experts-ignored"): 1}),
    "nvidia__Qwen3-30B-A3B-NVFP4": ({NOQ: 48}, {FP4: 48}),
    "openai__gpt-oss-120b": ({NOQ: 36}, {NOQ: 36}),
}


@pytest.mark.parametrize("gpu", ["h200", "b200"])
@pytest.mark.parametrize("folder", sorted(EXPECTED))
def test_plan_every_catalog_model(folder, gpu):
    path = CATALOG / folder
    expected = EXPECTED[folder][0 if gpu == "h200" else 1]
    facts = read_model(str(path))
    target = resolve_target(gpu=gpu, ep_size=8, probe=False)
    if isinstance(expected, str):
        with pytest.raises(InfeasibleError, match=expected):
            make_plan(facts, target, pack_stack())
        return
    plan = make_plan(facts, target, pack_stack())
    counts: dict = {}
    for lp in plan.layers:
        key = (lp.decision.order, lp.decision.rule)
        counts[key] = counts.get(key, 0) + 1
    assert counts == expected
    doc = build_document(plan)
    PolicyDoc.model_validate(doc)  # what plan writes, the schema accepts
