"""The ``vllm`` pack's cases that vLLM's real package cannot show on CPU (its DeepEP v2 and low-latency
paths need GPUs): read from vLLM 0.33.0's sources, cited in the pack. High-throughput cases are
checked against vLLM's own code in tests/integrations/test_vllm_plugin.py."""

import pytest

from moepolicy.checkpoint.reader import read_model
from moepolicy.planner import make_plan
from moepolicy.rules.packs import pack_stack
from moepolicy.target import TargetSpec, resolve_target

CASES = [
    # (model, target, layer, order, rule)
    # SM90 + EP: FlashInferExperts for block fp8 whatever the all-to-all (oracle/fp8.py:122-130); they
    # quantize their own input, so deepep_v2.py:34-35 (defer_input_quant) sends bf16
    (
        "DeepSeek-V3",
        dict(gpu="h200", ep_size=16, backend="deepep_ll", deep_ep_version="v2-dd758ca"),
        3,
        "no_quant",
        "vllm/bf16-activations",
    ),
    (
        "DeepSeek-V3",
        dict(gpu="h200", ep_size=16, deep_ep_version="v2-dd758ca"),
        3,
        "no_quant",
        "vllm/bf16-activations",
    ),
    # SM100 + deepep_v2: FlashInfer TRT-LLM experts (oracle/fp8.py:113-120) take block fp8: quantized first
    (
        "DeepSeek-V3",
        dict(gpu="b200", ep_size=16, deep_ep_version="v2-dd758ca"),
        3,
        "quant_then_dispatch",
        "vllm/v2-block-fp8",
    ),
    (
        "DeepSeek-V3",
        dict(gpu="h200", ep_size=16, deep_ep_version="v2-dd758ca", expert_kernel="deepgemm"),
        3,
        "quant_then_dispatch",
        "vllm/v2-block-fp8",
    ),
    (
        "DeepSeek-V3",
        dict(gpu="h200", ep_size=8, backend="deepep_ll"),
        3,
        "in_kernel_quant",
        "vllm/ll-block-fp8",
    ),
    (
        "amd/Mixtral-8x7B-Instruct-v0.1-FP8-KV",
        dict(gpu="h200", ep_size=8, backend="deepep_ll"),
        0,
        "dispatch_then_quant",
        "vllm/ll-other",
    ),
]


@pytest.mark.parametrize("model, target, layer, order, rule", CASES)
def test_vllm_pack(model, target, layer, order, rule):
    plan = make_plan(
        read_model(model, hub=False),
        resolve_target(TargetSpec(**target), probe=False),
        pack_stack(["vllm"]),
    )
    decision = next(lp.decision for lp in plan.layers if lp.layer.index == layer)
    assert (decision.order, decision.rule) == (order, rule)
