"""Hand-made edge cases for reading checkpoints: layer schedules, formats, ignore lists, bad input."""

import json

import pytest

from moepolicy.checkpoint import read_model
from moepolicy.checkpoint.ignore import entry_matches
from moepolicy.errors import CheckpointError

BASE = {"hidden_size": 1024, "num_hidden_layers": 6, "num_experts": 16, "num_experts_per_tok": 2}


def kinds(facts):
    return "".join("M" if layer.kind == "moe" else "d" for layer in facts.layers)


@pytest.mark.parametrize(
    "extra, expected",
    [
        ({}, "MMMMMM"),
        ({"first_k_dense_replace": 2, "moe_layer_freq": 1}, "ddMMMM"),
        ({"first_k_dense_replace": 1, "moe_layer_freq": 2}, "ddMdMd"),
        ({"mlp_only_layers": [0, 5], "decoder_sparse_step": 1}, "dMMMMd"),
        ({"mlp_only_layers": [], "decoder_sparse_step": 2}, "dMdMdM"),
        ({"interleave_moe_layer_step": 2}, "dMdMdM"),
        ({"interleave_moe_layer_step": 1}, "MMMMMM"),
        ({"moe_layers": [1, 4]}, "dMddMd"),
        (
            {"mlp_layer_types": ["dense", "sparse", "sparse", "dense", "sparse", "sparse"]},
            "dMMdMM",
        ),
        ({"first_k_dense_replace": 3, "num_nextn_predict_layers": 2}, "dddMMMMM"),
    ],
)
def test_layer_schedules(write_config, extra, expected):
    facts = read_model(str(write_config({**BASE, **extra})))
    assert kinds(facts) == expected


def test_fields_nested_under_text_config(write_config):
    config = {
        "architectures": ["Llama4ForConditionalGeneration"],
        "model_type": "llama4",
        "text_config": {
            "model_type": "llama4_text",
            "hidden_size": 5120,
            "num_hidden_layers": 4,
            "num_local_experts": 16,
            "num_experts_per_tok": 1,
            "interleave_moe_layer_step": 2,
        },
    }
    facts = read_model(str(write_config(config)))
    assert kinds(facts) == "dMdM" and facts.hidden_size == 5120


def test_dense_model_without_experts(write_config):
    facts = read_model(str(write_config({"hidden_size": 64, "num_hidden_layers": 3})))
    assert kinds(facts) == "ddd"


@pytest.mark.parametrize(
    "config, fragment",
    [
        (
            {"num_hidden_layers": 2, "num_experts": 4, "num_experts_per_tok": 2},
            "missing field 'hidden_size'",
        ),
        (
            {"hidden_size": 64, "num_experts": 4, "num_experts_per_tok": 2},
            "missing field 'num_hidden_layers'",
        ),
        ({**BASE, "num_experts_per_tok": None}, "no top-k field"),
        ({**BASE, "hidden_size": "big"}, "'hidden_size' must be an integer"),
        ({**BASE, "num_experts_per_tok": 32}, "larger than the expert count"),
        ({**BASE, "quantization_config": {"quant_method": "foo8"}}, "quant_method is 'foo8'"),
        ({**BASE, "quantization_config": {"quant_method": "fp8", "fmt": "e9m9"}}, "fmt is 'e9m9'"),
        (
            {**BASE, "quantization_config": {"quant_method": "fp8", "weight_block_size": [128]}},
            "weight_block_size",
        ),
        (
            {**BASE, "quantization_config": {"quant_method": "fp8", "activation_scheme": "weird"}},
            "activation_scheme",
        ),
        ({**BASE, "mlp_layer_types": ["sparse"]}, "'mlp_layer_types' has 1 entries"),
    ],
)
def test_bad_configs_name_file_and_field(write_config, config, fragment):
    folder = write_config(config)
    with pytest.raises(CheckpointError) as err:
        read_model(str(folder))
    assert fragment in str(err.value)
    assert "config.json" in str(err.value)


def test_malformed_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"hidden_size": 12,')
    with pytest.raises(CheckpointError, match=r"malformed JSON at line 1"):
        read_model(str(path))


def test_modelopt_unknown_algo_names_hf_quant_file(write_config):
    folder = write_config(BASE, {"quantization": {"quant_algo": "FP3"}})
    with pytest.raises(CheckpointError, match=r"hf_quant_config.json: quant_algo is 'FP3'"):
        read_model(str(folder))


def test_unknown_name_offline_lists_close_names(monkeypatch):
    monkeypatch.setenv("MOEPOLICY_OFFLINE", "1")
    with pytest.raises(CheckpointError) as err:
        read_model("Qwen3-30B-A3B-FP9")
    assert "unknown model 'Qwen3-30B-A3B-FP9'" in str(err.value)
    assert "Qwen3-30B-A3B-FP8" in str(err.value)


def test_catalog_names_both_spellings():
    assert read_model("Qwen3-30B-A3B-FP8").name == read_model("Qwen/Qwen3-30B-A3B-FP8").name


def ct_config(ignore=None, input_activations=None, weights=None, targets=("Linear",)):
    return {
        **BASE,
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "ignore": ignore or [],
            "config_groups": {
                "group_0": {
                    "targets": list(targets),
                    "weights": weights
                    or {"num_bits": 8, "type": "float", "strategy": "channel", "dynamic": False},
                    "input_activations": input_activations,
                }
            },
        },
    }


def test_compressed_tensors_per_token_dynamic(write_config):
    acts = {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}
    layer = read_model(str(write_config(ct_config(input_activations=acts)))).moe_layers[0]
    assert (layer.weights.dtype, layer.weights.granularity) == ("fp8_e4m3", "channel")
    assert (layer.activations.dtype, layer.activations.granularity, layer.activations.dynamic) == (
        "fp8_e4m3",
        "token",
        "dynamic",
    )


def test_compressed_tensors_int8_w8a8(write_config):
    acts = {"num_bits": 8, "type": "int", "strategy": "token", "dynamic": True}
    weights = {"num_bits": 8, "type": "int", "strategy": "channel", "dynamic": False}
    layer = read_model(
        str(write_config(ct_config(input_activations=acts, weights=weights)))
    ).moe_layers[0]
    assert (layer.weights.dtype, layer.activations.dtype) == ("int8", "int8")


def test_compressed_tensors_regex_ignore_excludes_experts(write_config):
    folder = write_config(ct_config(ignore=["lm_head", r"re:.*mlp\.experts.*"]))
    layer = read_model(str(folder)).moe_layers[0]
    assert layer.experts_ignored is not None and layer.experts_ignored.mode == "regex (re.match)"
    assert layer.activations.dtype == "none"


def test_compressed_tensors_group_targeting_other_modules_leaves_experts_unquantized(write_config):
    folder = write_config(ct_config(targets=[r"re:.*self_attn.*"]))
    layer = read_model(str(folder)).moe_layers[0]
    assert layer.weights.dtype == "none"


def test_modelopt_fp8_static_per_tensor(write_config):
    folder = write_config(
        BASE,
        {
            "producer": {"name": "modelopt"},
            "quantization": {"quant_algo": "FP8", "exclude_modules": ["lm_head"]},
        },
    )
    layer = read_model(str(folder)).moe_layers[0]
    assert (layer.activations.dtype, layer.activations.granularity, layer.activations.dynamic) == (
        "fp8_e4m3",
        "tensor",
        "static",
    )


def test_awq_weight_only(write_config):
    folder = write_config(
        {**BASE, "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 64}}
    )
    layer = read_model(str(folder)).moe_layers[0]
    assert (layer.weights.dtype, layer.weights.group, layer.activations.dtype) == (
        "int4",
        64,
        "none",
    )


def test_hf_fp8_ue8m0_scale_fmt(write_config):
    qc = {
        "quant_method": "fp8",
        "fmt": "float8_e4m3fn",
        "weight_block_size": [128, 128],
        "activation_scheme": "dynamic",
        "scale_fmt": "ue8m0",
    }
    layer = read_model(str(write_config({**BASE, "quantization_config": qc}))).moe_layers[0]
    assert layer.activations.scale_format == "ue8m0"
    assert layer.activations.origin_of("scale_format").kind == "explicit"


# --- ignore-list matching: engines differ --------------------------------------------------------


@pytest.mark.parametrize(
    "entry, module, vllm, sglang",
    [
        # the golden case: a short dotted name. vLLM's fp8 path matches exact names only; SGLang matches
        # at dot boundaries (sgl-project/sglang#23467), so it excludes the experts.
        ("mlp.experts", "model.layers.3.mlp.experts", None, "sglang dot-boundary"),
        (
            "model.layers.3.mlp.experts",
            "model.layers.3.mlp.experts",
            "vllm exact",
            "sglang dot-boundary",
        ),
        # dot boundaries do not match inside a number: layers.1 is not layers.11
        ("layers.1", "model.layers.11.mlp.experts", None, None),
        (
            "model.layers.*.mlp.experts",
            "model.layers.7.mlp.experts",
            "glob (fnmatch)",
            "glob (fnmatch)",
        ),
        ("re:.*experts.*", "model.layers.7.mlp.experts", "regex (re.match)", "regex (re.match)"),
    ],
)
def test_ignore_matching_by_engine(entry, module, vllm, sglang):
    assert entry_matches(entry, module, "vllm", "fp8") == vllm
    assert entry_matches(entry, module, "sglang", "fp8") == sglang


def test_ignore_substring_for_gptq_in_vllm():
    assert (
        entry_matches("layers.1", "model.layers.11.mlp.experts", "vllm", "gptq")
        == "vllm substring"
    )


def test_engine_changes_whether_experts_are_quantized(write_config):
    qc = {
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
        "activation_scheme": "dynamic",
        "modules_to_not_convert": ["mlp.experts"],
    }
    folder = str(write_config({**BASE, "quantization_config": qc}))
    vllm = read_model(folder, engine="vllm").moe_layers[0]
    sglang = read_model(folder, engine="sglang").moe_layers[0]
    assert vllm.experts_ignored is None and vllm.activations.dtype == "fp8_e4m3"
    assert (
        sglang.experts_ignored.mode == "sglang dot-boundary" and sglang.activations.dtype == "none"
    )
    assert (
        read_model(folder, engine="vllm").sha256() != read_model(folder, engine="sglang").sha256()
    )


def test_facts_hash_ignores_trimmed_keys(write_config):
    base = {
        **BASE,
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
    }
    full = {**base, "rope_theta": 1e6, "vocab_size": 151936, "torch_dtype": "bfloat16"}
    a = read_model(str(write_config(base, name="trim")))
    b = read_model(str(write_config(full, name="full")))
    assert a.sha256() == b.sha256()
    changed = read_model(str(write_config({**base, "num_experts_per_tok": 4}, name="k4")))
    assert changed.sha256() != a.sha256()


def test_folder_with_json_of_wrong_shape(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps([1, 2, 3]))
    with pytest.raises(CheckpointError, match="expected a JSON object"):
        read_model(str(tmp_path))
