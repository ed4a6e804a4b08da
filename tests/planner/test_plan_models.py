"""Every model in the package's catalog plans, for --gpu h200 and --gpu b200 at EP 8, to the decisions
written out here per model: {(order, rule): count}, or the infeasibility reason."""

import pytest

from moepolicy.errors import InfeasibleError
from moepolicy.document.compose import build_document
from moepolicy.planner import make_plan
from moepolicy.checkpoint import read_model
from moepolicy.rules.packs import pack_stack
from moepolicy.document.model import PolicyDoc
from moepolicy.target import TargetSpec, resolve_target

from moepolicy._resources import data_dir

CATALOG = data_dir("catalog")

QTD_BLOCK = ("quant_then_dispatch", "deepep-ht/block-fp8")
QTD_UE8M0 = ("quant_then_dispatch", "deepep-ht/block-fp8-ue8m0")
NOQ = ("no_quant", "moe/bf16-activations")
DENSE = ("none", "dense/none")
NVFP4 = ("quant_then_dispatch", "deepep-ht/nvfp4-prequantized")

# H200: vLLM 0.33.0 runs block fp8 with EP on FlashInfer CUTLASS experts, which quantize their own input
# (oracle/fp8.py:122-130, experts/flashinfer_cutlass_moe.py:123-125): bf16 on the wire (NOQ).
EXPECTED = {
    "Qwen__Qwen1.5-MoE-A2.7B-Chat-GPTQ-Int4": ("60 experts do not divide over EP size 8",) * 2,
    "Qwen__Qwen3-235B-A22B": ({NOQ: 94}, {NOQ: 94}),
    "Qwen__Qwen3-30B-A3B": ({NOQ: 48}, {NOQ: 48}),
    "Qwen__Qwen3-30B-A3B-FP8": ({NOQ: 48}, {QTD_UE8M0: 48}),
    "amd__Mixtral-8x7B-Instruct-v0.1-FP8-KV": (
        {("quant_then_dispatch", "deepep-ht/static-tensor-global-scale"): 32},
        {("quant_then_dispatch", "deepep-ht/static-tensor-global-scale"): 32},
    ),
    "deepseek-ai__DeepSeek-R1": ({DENSE: 3, NOQ: 59}, {DENSE: 3, QTD_UE8M0: 59}),
    "deepseek-ai__DeepSeek-V3": ({DENSE: 3, NOQ: 59}, {DENSE: 3, QTD_UE8M0: 59}),
    "inference-optimization__GLM-4.6-FP8-dynamic": (
        {DENSE: 3, ("dispatch_then_quant", "moe/unknown-scheme"): 90},
        {DENSE: 3, ("dispatch_then_quant", "moe/unknown-scheme"): 90},
    ),
    "meta-llama__Llama-4-Scout-17B-16E-Instruct": ({NOQ: 48}, {NOQ: 48}),
    "mistralai__Mixtral-8x7B-Instruct-v0.1": ({NOQ: 32}, {NOQ: 32}),
    "moonshotai__Kimi-K2.5": ({DENSE: 1, NOQ: 60}, {DENSE: 1, NOQ: 60}),
    "nvidia__DeepSeek-V3-0324-FP4": (
        {DENSE: 3, NOQ: 58, ("no_quant", "moe/experts-ignored"): 1},
        {DENSE: 3, NVFP4: 58, ("no_quant", "moe/experts-ignored"): 1},
    ),
    "nvidia__Qwen3-30B-A3B-NVFP4": ({NOQ: 48}, {NVFP4: 48}),
    "openai__gpt-oss-120b": ({NOQ: 36}, {NOQ: 36}),
}


@pytest.mark.parametrize("gpu", ["h200", "b200"])
@pytest.mark.parametrize("folder", sorted(EXPECTED))
def test_plan_every_catalog_model(folder, gpu):
    path = CATALOG / folder
    expected = EXPECTED[folder][0 if gpu == "h200" else 1]
    facts = read_model(str(path))
    target = resolve_target(TargetSpec(gpu=gpu, ep_size=8), probe=False)
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


# --- every catalog model on every target kind: no layer gets an order its target cannot run -------
# The check below is written from the capability sheets' entries, not from the rules or feasibility
# code it guards: which capability an order and wire need, at measured or code evidence.
TRUSTED = ("measured", "code")


def _has(target, cap_id: str) -> bool:
    entry = target.deepep.capability(cap_id, target.layout)
    return entry is not None and entry.supported and entry.evidence in TRUSTED


def _ht_capability(wire: dict) -> str:
    scale = wire.get("scale")
    if wire["dtype"] == "nvfp4":
        return "ht.dispatch.nvfp4_bytes"
    if scale is None:
        return "ht.dispatch.bare_fp8"
    if scale["granularity"] == "token":
        return "ht.dispatch.token_scales"
    if scale["granularity"] == "tensor":
        return "ht.dispatch.tensor_scale_expand"
    if scale["dtype"] == "ue8m0":
        return (
            "ht.dispatch.mxfp8_ue8m0_g32"
            if scale.get("group") == 32
            else "ht.dispatch.ue8m0_int32"
        )
    return "ht.dispatch.block_scales_f32"


def runnable_problem(lp, target) -> str:
    d, facts = lp.decision, lp.facts
    wire = d.wire.as_dict()
    if d.order in ("none", "no_quant", "dispatch_then_quant"):
        return "" if wire["dtype"] in ("bf16", "none") else f"{d.order} with wire {wire}"
    if d.order == "fused":
        return (
            ""
            if facts["kernel.fuses_communication"]
            else "fused order for a kernel that does not fuse"
        )
    if wire["dtype"] != facts["kernel.act_dtype"]:
        return f"wire {wire['dtype']} but the kernel reads {facts['kernel.act_dtype']}"
    if target.arch == "sm80":
        return "a quantized wire on an sm80 build"
    ll = target.backend == "deepep_ll"
    if d.order == "in_kernel_quant":
        ue8m0 = wire["scale"]["dtype"] == "ue8m0"
        return (
            ""
            if ll
            and _has(
                target, "ll.dispatch.in_kernel_ue8m0" if ue8m0 else "ll.dispatch.in_kernel_fp8"
            )
            else "in-kernel quantization the build does not have"
        )
    if ll and wire.get("scale") is None:
        sizes = target.deepep.limits.ll_hidden_sizes
        if sizes and lp.layer.hidden_size // 2 not in sizes:
            return "bare fp8 viewed as bf16 of a hidden the kernels do not take"
        return (
            ""
            if _has(target, "ll.dispatch.bytes_as_bf16")
            else "bare fp8 through low-latency dispatch"
        )
    if ll and not _has(target, "ll.dispatch.prequantized"):
        return "a pre-quantized payload through low-latency dispatch that takes bf16 only"
    cap = _ht_capability(wire)
    return "" if _has(target, cap) else f"needs {cap}"


@pytest.mark.parametrize("version", ["29d31c0", "v2-dd758ca"])
@pytest.mark.parametrize("backend", ["deepep_ht", "deepep_ll"])
@pytest.mark.parametrize("ep_size", [8, 16])
@pytest.mark.parametrize("gpu", ["h200", "b200"])
def test_no_layer_gets_an_order_its_target_cannot_run(gpu, ep_size, backend, version):
    planned = 0
    for folder in sorted(EXPECTED):
        facts = read_model(str(CATALOG / folder))
        target = resolve_target(
            TargetSpec(gpu=gpu, ep_size=ep_size, backend=backend, deep_ep_version=version),
            probe=False,
        )
        try:
            plan = make_plan(facts, target, pack_stack())
        except InfeasibleError:
            continue
        planned += 1
        problems = {
            (lp.layer.index, lp.decision.rule): runnable_problem(lp, target) for lp in plan.layers
        }
        assert not {k: v for k, v in problems.items() if v}, folder
    assert planned >= 5  # most of the catalog plans on every target kind
