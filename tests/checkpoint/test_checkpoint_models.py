"""Every real checkpoint in the package's catalog reads into the per-layer facts written out here by hand
(from each folder's SOURCE.md), not derived from the code under test."""

import pytest

from moepolicy.checkpoint import read_model

from moepolicy._resources import data_dir

CATALOG = data_dir("catalog")

# folder: (entries, moe indices, mtp count, experts, top_k, hidden,
#          act (dtype, granularity, group, dynamic, scale), weights (dtype, granularity))
EXPECTED = {
    "Qwen__Qwen1.5-MoE-A2.7B-Chat-GPTQ-Int4": (
        24,
        range(0, 24),
        0,
        60,
        4,
        2048,
        ("none", "none", None, "none", "none"),
        ("int4", "group"),
    ),
    "Qwen__Qwen3-235B-A22B": (
        94,
        range(0, 94),
        0,
        128,
        8,
        4096,
        ("none", "none", None, "none", "none"),
        ("none", "none"),
    ),
    "Qwen__Qwen3-30B-A3B": (
        48,
        range(0, 48),
        0,
        128,
        8,
        2048,
        ("none", "none", None, "none", "none"),
        ("none", "none"),
    ),
    "Qwen__Qwen3-30B-A3B-FP8": (
        48,
        range(0, 48),
        0,
        128,
        8,
        2048,
        ("fp8_e4m3", "group", 128, "dynamic", "float32"),
        ("fp8_e4m3", "block"),
    ),
    "amd__Mixtral-8x7B-Instruct-v0.1-FP8-KV": (
        32,
        range(0, 32),
        0,
        8,
        2,
        4096,
        ("fp8_e4m3", "tensor", None, "static", "float32"),
        ("fp8_e4m3", "tensor"),
    ),
    "deepseek-ai__DeepSeek-R1": (
        62,
        range(3, 62),
        1,
        256,
        8,
        7168,
        ("fp8_e4m3", "group", 128, "dynamic", "float32"),
        ("fp8_e4m3", "block"),
    ),
    "deepseek-ai__DeepSeek-V3": (
        62,
        range(3, 62),
        1,
        256,
        8,
        7168,
        ("fp8_e4m3", "group", 128, "dynamic", "float32"),
        ("fp8_e4m3", "block"),
    ),
    "inference-optimization__GLM-4.6-FP8-dynamic": (
        93,
        range(3, 93),
        1,
        160,
        8,
        5120,
        ("fp8_e4m3", "token", None, "dynamic", "float32"),
        ("unknown", "unknown"),
    ),
    "meta-llama__Llama-4-Scout-17B-16E-Instruct": (
        48,
        range(0, 48),
        0,
        16,
        1,
        5120,
        ("none", "none", None, "none", "none"),
        ("none", "none"),
    ),
    "mistralai__Mixtral-8x7B-Instruct-v0.1": (
        32,
        range(0, 32),
        0,
        8,
        2,
        4096,
        ("none", "none", None, "none", "none"),
        ("none", "none"),
    ),
    "moonshotai__Kimi-K2.5": (
        61,
        range(1, 61),
        0,
        384,
        8,
        7168,
        ("none", "none", None, "none", "none"),
        ("int4", "group"),
    ),
    "nvidia__DeepSeek-V3-0324-FP4": (
        62,
        range(3, 62),
        1,
        256,
        8,
        7168,
        ("nvfp4", "group", 16, "dynamic", "e4m3"),
        ("nvfp4", "group"),
    ),
    "nvidia__Qwen3-30B-A3B-NVFP4": (
        48,
        range(0, 48),
        0,
        128,
        8,
        2048,
        ("nvfp4", "group", 16, "dynamic", "e4m3"),
        ("nvfp4", "group"),
    ),
    "openai__gpt-oss-120b": (
        36,
        range(0, 36),
        0,
        128,
        4,
        2880,
        ("none", "none", None, "none", "none"),
        ("mxfp4", "group"),
    ),
}


def test_every_catalog_model_has_an_expectation():
    folders = {p.name for p in CATALOG.iterdir() if (p / "config.json").is_file()}
    assert folders == set(EXPECTED)


@pytest.mark.parametrize("folder", sorted(EXPECTED))
def test_catalog_model_facts(folder):
    path = CATALOG / folder
    entries, moe_idx, mtp, experts, top_k, hidden, act, weights = EXPECTED[folder]
    facts = read_model(str(path))
    assert len(facts.layers) == entries
    assert [layer.index for layer in facts.layers] == list(range(entries))
    assert [layer.index for layer in facts.moe_layers] == list(moe_idx)
    assert facts.num_mtp_layers == mtp
    assert [layer.index for layer in facts.layers if layer.is_mtp] == list(
        range(entries - mtp, entries)
    )
    # the first MoE layer carries the checkpoint's expert scheme (DeepSeek-FP4's MTP layer is excluded)
    layer = facts.moe_layers[0]
    assert (layer.num_experts, layer.top_k, layer.hidden_size) == (experts, top_k, hidden)
    a = layer.activations
    assert (a.dtype, a.granularity, a.group, a.dynamic, a.scale_format) == act
    assert (layer.weights.dtype, layer.weights.granularity) == weights


def test_deepseek_fp4_mtp_layer_excluded_by_glob():
    facts = read_model("nvidia/DeepSeek-V3-0324-FP4")
    mtp = facts.layers[61]
    assert mtp.is_mtp and mtp.kind == "moe"
    assert mtp.experts_ignored is not None
    assert mtp.experts_ignored.entry == "model.layers.61*"
    assert mtp.activations.dtype == "none"
    assert facts.layers[60].experts_ignored is None


def test_provenance_of_block_activation_granularity_is_vllm_convention():
    layer = read_model("DeepSeek-V3").moe_layers[0]
    granularity = layer.activations.origin_of("granularity")
    assert granularity.kind == "convention" and "vLLM" in granularity.note
    assert layer.activations.origin_of("dynamic").kind == "explicit"
    assert layer.weights.origin_of("block").kind == "explicit"


def test_partial_glm_block_marks_missing_fields_unknown():
    layer = read_model("GLM-4.6-FP8-dynamic").moe_layers[0]
    assert layer.weights.origin_of("granularity").kind == "unknown"
    assert "strategy" in layer.weights.origin_of("granularity").note
    assert layer.activations.origin_of("granularity").kind == "explicit"
