"""load_policy: round trip, key checks, fallbacks, bad input, import weight; exports."""

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from moepolicy import load_policy
from moepolicy.checkpoint import read_model
from moepolicy.document.yaml_io import write_document
from moepolicy.errors import PolicyError
from moepolicy.document.keys import compute_keys
from moepolicy.document.compose import build_document
from moepolicy.planner import make_plan
from moepolicy.rules.packs import pack_stack
from moepolicy.runtime import loader
from moepolicy.target import TargetSpec, resolve_target


def plan_doc(model="DeepSeek-V3", **target):
    # the experts that read block fp8 (vLLM 0.33.0's default on SM90 with EP, FlashInfer CUTLASS, takes bf16)
    target = {"gpu": "h200", "ep_size": 8, "expert_kernel": "deepgemm", **target}
    return build_document(
        make_plan(
            read_model(model), resolve_target(TargetSpec(**target), probe=False), pack_stack()
        )
    )


@pytest.fixture
def ds_policy(tmp_path):
    path = tmp_path / "ds.yaml"
    write_document(plan_doc(), path)
    return path


@pytest.fixture(autouse=True)
def fresh_warnings():
    loader._WARNED.clear()
    yield
    loader._WARNED.clear()


def rewrite(path: Path, mutate, rekey=True):
    raw = yaml.safe_load(path.read_text())
    mutate(raw)
    if rekey:
        raw["key"] = compute_keys(raw)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))


def test_round_trip_plan_file_load(ds_policy):
    policy = load_policy(ds_policy, ep_size=8, model="deepseek-ai/DeepSeek-V3")
    assert not policy.is_fallback and policy.fallback_reason is None
    assert policy.report == {"decision": "matched", "tuning": "matched"}
    assert policy.layer(0).order == "none"
    assert policy.layer(3).order == "quant_then_dispatch"
    assert policy.layer(3).wire.dtype == "fp8_e4m3"
    assert policy.layer(3).wire.scale.group == 128
    assert policy.layer(61).order == "quant_then_dispatch"
    assert policy.deepep.num_sms == 20
    assert policy.layer(3) is policy.layer(3)  # a stored, immutable object
    with pytest.raises(AttributeError):
        policy.layer(3).order = "no_quant"


def test_json_is_the_same_tree(tmp_path):
    doc = plan_doc()
    write_document(doc, tmp_path / "p.json")
    policy = load_policy(tmp_path / "p.json", ep_size=8)
    assert policy.layer(3).order == "quant_then_dispatch" and not policy.is_fallback


def test_unchecked_parts_without_model_or_ep(ds_policy):
    policy = load_policy(ds_policy)
    assert not policy.is_fallback
    assert policy.report == {"decision": "unchecked", "tuning": "unchecked"}


def test_model_facts_mismatch_gives_safe_policy(ds_policy, caplog):
    with caplog.at_level(logging.WARNING, logger="moepolicy"):
        policy = load_policy(ds_policy, ep_size=8, model="Qwen3-30B-A3B-FP8")
        again = load_policy(ds_policy, ep_size=8, model="Qwen3-30B-A3B-FP8")
    assert policy.is_fallback and "decision key mismatch" in policy.fallback_reason
    assert policy.report["decision"] == "mismatched"
    for index in (0, 3, 61, 500):
        layer = policy.layer(index)
        assert (layer.order, layer.wire.dtype) == ("dispatch_then_quant", "bf16")
    assert again.is_fallback
    assert len([r for r in caplog.records if "safe policy" in r.getMessage()]) == 1


def test_trimmed_catalog_copy_matches_real_checkpoint(ds_policy, tmp_path):
    raw = json.loads(
        (
            Path(
                read_model("DeepSeek-V3").source.split(":", 1)[0]
                and __import__("moepolicy.checkpoint.catalog", fromlist=["x"])
                .lookup("DeepSeek-V3")
                .folder
                / "config.json"
            )
        ).read_text()
    )
    real = {
        **raw,
        "vocab_size": 129280,
        "rope_theta": 10000,
        "torch_dtype": "bfloat16",
        "max_position_embeddings": 163840,
    }
    folder = tmp_path / "DeepSeek-V3-real"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(real))
    policy = load_policy(ds_policy, ep_size=8, model=str(folder))
    assert not policy.is_fallback and policy.report["decision"] == "matched"


def test_ep_layout_mismatch_is_a_decision_mismatch(ds_policy):
    policy = load_policy(ds_policy, ep_size=16)
    assert policy.is_fallback and policy.report["decision"] == "mismatched"
    assert "ep_layout" in policy.fallback_reason


def test_ep_size_mismatch_keeps_decisions_uses_defaults(ds_policy):
    rewrite(
        ds_policy, lambda d: d["deepep"].update(num_sms=24, num_nvl_bytes=2**30)
    )  # buffers fit 24 SMs
    policy = load_policy(ds_policy, ep_size=4)
    assert policy.is_fallback and policy.report["tuning"] == "mismatched"
    assert policy.report["decision"] != "mismatched"
    assert policy.layer(3).order == "quant_then_dispatch"  # decisions kept
    assert policy.deepep.is_default and policy.deepep.num_sms == 20  # DeepEP's defaults
    assert policy.deepep.bucket_for(4096).dispatch.nvl_send == 6  # DeepEP's 4-rank table


def test_gpu_arch_mismatch(ds_policy, monkeypatch):
    from moepolicy import hardware

    monkeypatch.setattr(hardware, "current_arch", lambda: ("sm100", "test"))
    policy = load_policy(ds_policy, ep_size=8)
    assert policy.is_fallback and "gpu_arch: mismatched" in policy.fallback_reason


def test_rule_pack_change_detected(ds_policy, tmp_path):
    rewrite(ds_policy, lambda d: d["rules"]["packs"][0].update(sha256="0" * 64))
    policy = load_policy(ds_policy, ep_size=8)
    assert policy.is_fallback and "rule_packs: mismatched" in policy.fallback_reason


def _deep_ep_build(monkeypatch, *, legacy_buffer: bool, elastic: bool, use_fabric=False):
    """An imported ``deep_ep`` with the features the probe reads: the legacy Buffer of a 29d31c0-era
    build (``use_fabric``) or of a 2.x build, and/or ElasticBuffer (what a 2.x build adds)."""
    import types

    fake = types.ModuleType("deep_ep")
    if legacy_buffer:
        if use_fabric:

            def init(self, group, num_nvl_bytes=0, use_fabric=False, enable_shrink=False):
                pass

        else:

            def init(self, group, num_nvl_bytes=0, allow_mnnvl=False, enable_shrink=False):
                pass

        fake.Buffer = type("Buffer", (), {"__init__": init})
        fake.Config, fake.topk_idx_t = object, object
    if elastic:
        fake.ElasticBuffer = object
        fake.Config = object
    monkeypatch.setitem(sys.modules, "deep_ep", fake)


def test_a_deep_ep_2x_build_serves_a_legacy_policy_by_its_buffer_api(ds_policy, monkeypatch):
    """A 2.x build offers the legacy Buffer (what the high-throughput path uses) beside ElasticBuffer:
    a policy planned for 29d31c0's Buffer is matched by that API (the same answers), not refused
    because the build also has ElasticBuffer."""
    _deep_ep_build(monkeypatch, legacy_buffer=True, elastic=True)
    policy = load_policy(ds_policy, ep_size=8, model="deepseek-ai/DeepSeek-V3")
    assert policy.report == {"decision": "matched", "tuning": "matched"}, policy.report_details
    detail = next(d for d in policy.report_details if "deep_ep" in d)
    assert "deepep-legacy-2.1.0-dd758ca" in detail and "answers as deepep-legacy-29d31c0" in detail
    assert not policy.is_fallback and policy.layer(3).order == "quant_then_dispatch"


def test_a_29d31c0_build_matches_its_own_sheet(ds_policy, monkeypatch):
    _deep_ep_build(monkeypatch, legacy_buffer=True, elastic=False, use_fabric=True)
    policy = load_policy(ds_policy, ep_size=8)
    assert not policy.is_fallback, policy.report_details
    assert any("offers deepep-legacy-29d31c0; policy" in d for d in policy.report_details)


def test_a_build_without_the_policys_api_is_a_decision_mismatch(ds_policy, monkeypatch):
    """An ElasticBuffer-only build cannot run a legacy policy's high-throughput path: the decisions
    rest on what the build carries, so the safe policy, and strict refuses."""
    _deep_ep_build(monkeypatch, legacy_buffer=False, elastic=True)
    policy = load_policy(ds_policy, ep_size=8)
    assert policy.report["decision"] == "mismatched" and not policy.keeps_decisions
    assert "deep_ep: mismatched" in policy.fallback_reason
    assert "offers deepep-v2-dd758ca" in policy.fallback_reason
    assert policy.layer(3).wire.dtype == "bf16"  # the safe policy: bf16 on the wire
    with pytest.raises(PolicyError, match="deep_ep: mismatched"):
        load_policy(ds_policy, ep_size=8, strict=True)


def test_the_layout_the_engine_runs_is_checked_not_inferred(ds_policy):
    """EP 8 planned for one node of 8 GPUs, served on 2 nodes of 4: the engine's layout decides
    (inferred from EP 8 and the policy's 8 GPUs per node it would read intranode)."""
    assert not load_policy(ds_policy, ep_size=8).is_fallback
    policy = load_policy(ds_policy, ep_size=8, layout="internode")
    assert policy.report["decision"] == "mismatched" and not policy.keeps_decisions
    assert "ep_layout: mismatched" in policy.fallback_reason
    assert not load_policy(ds_policy, ep_size=8, layout="intranode").is_fallback
    bad = load_policy(ds_policy, ep_size=8, layout="across")
    assert bad.is_fallback and "layout must be" in bad.fallback_reason


def test_a_tuning_mismatch_keeps_the_decisions_with_deepeps_defaults(ds_policy):
    policy = load_policy(ds_policy, ep_size=4)
    assert policy.is_fallback and policy.keeps_decisions
    assert policy.report["tuning"] == "mismatched"
    assert policy.deepep.is_default and policy.layer(3).order == "quant_then_dispatch"


def test_strict_raises_on_mismatch(ds_policy):
    with pytest.raises(PolicyError, match="key mismatch"):
        load_policy(ds_policy, ep_size=4, strict=True)


def test_each_key_part_changes_the_key():
    base = plan_doc()
    keys = compute_keys(base)
    decision_mutations = [
        lambda d: d["model"].update(facts_sha256="1" * 64),
        lambda d: d["rules"]["packs"][0].update(sha256="2" * 64),
        lambda d: d["target"]["deep_ep"].update(sheet="deepep-legacy-v1.2.1"),
        lambda d: d["target"].update(arch="sm100"),
        lambda d: d["target"].update(expert_kernel="triton"),
        lambda d: d["target"].update(layout="internode"),
        lambda d: d["target"].update(backend="deepep_ll"),
        lambda d: d["target"].update(engine="sglang"),
    ]
    tuning_mutations = [
        lambda d: d["target"].update(gpu="h100"),
        lambda d: d["target"].update(ep_size=4),
        lambda d: d["target"]["deep_ep"].update(version="other"),
    ]
    for mutate in decision_mutations:
        doc = json.loads(json.dumps(base))
        mutate(doc)
        assert compute_keys(doc)["decision"] != keys["decision"]
    for mutate in tuning_mutations:
        doc = json.loads(json.dumps(base))
        mutate(doc)
        new = compute_keys(doc)
        assert new["tuning"] != keys["tuning"] and new["decision"] == keys["decision"]


# --- bad input --------------------------------------------------------------------------------

BAD = [
    (
        "truncated",
        lambda text: text[: text.index("\nlayers:")],
        None,
        "missing (a policy needs it)",
    ),
    (
        "truncated mid-token",
        lambda text: text[: text.index("layers:") + 30] + "\n  - {index: [",
        None,
        "invalid YAML",
    ),
    ("not a mapping", lambda text: "- 1\n- 2\n", None, "a policy is a mapping"),
    (
        "newer major",
        None,
        lambda d: d.update(schema_version="3.0"),
        "needs a reader of major version 3",
    ),
    (
        "odd num_sms",
        None,
        lambda d: d["deepep"].update(num_sms=23),
        "deepep.num_sms: num_sms must be even",
    ),
    ("negative num_sms", None, lambda d: d["deepep"].update(num_sms=-2), "deepep.num_sms"),
    ("wrong type", None, lambda d: d["deepep"].update(num_sms="many"), "deepep.num_sms"),
    (
        "nvl send not below recv",
        None,
        lambda d: d["deepep"]["buckets"][0]["dispatch"].update(
            num_max_nvl_chunked_send_tokens=300
        ),
        "deepep.buckets[0].dispatch: NVLink send chunk must be below the receive capacity",
    ),
    (
        "rdma recv not a multiple",
        None,
        lambda d: d["deepep"]["buckets"][0]["combine"].update(
            num_max_rdma_chunked_recv_tokens=128
        ),
        "write the effective value 132",
    ),
    (
        "rdma send over half",
        None,
        lambda d: d["deepep"]["buckets"][0]["combine"].update(
            num_max_rdma_chunked_send_tokens=100, num_max_rdma_chunked_recv_tokens=100
        ),
        "at most half",
    ),
    ("skipped layer", None, lambda d: d["layers"].pop(5), "skips index 5"),
    (
        "repeated layer",
        None,
        lambda d: d["layers"].insert(5, dict(d["layers"][4])),
        "repeats index 4",
    ),
    ("bad order", None, lambda d: d["layers"][3].update(order="sometimes"), "layers[3].order"),
    (
        "buffer not aligned",
        None,
        lambda d: d["deepep"].update(num_nvl_bytes=1000),
        "multiple of 128",
    ),
]


@pytest.mark.parametrize("name, text_edit, doc_edit, fragment", BAD, ids=[b[0] for b in BAD])
def test_bad_documents(ds_policy, name, text_edit, doc_edit, fragment):
    if text_edit:
        ds_policy.write_text(text_edit(ds_policy.read_text()))
    else:
        rewrite(ds_policy, doc_edit)
    with pytest.raises(PolicyError) as err:
        load_policy(ds_policy, strict=True)
    assert fragment in str(err.value) and str(ds_policy) in str(err.value)
    assert "\n" not in str(err.value)
    policy = load_policy(ds_policy, ep_size=8)
    assert policy.is_fallback and "damaged policy" in policy.fallback_reason
    assert policy.layer(3).wire.dtype == "bf16"


def test_hand_edit_without_rekey_is_damage(ds_policy):
    rewrite(
        ds_policy,
        lambda d: d["layers"][3].update(order="dispatch_then_quant", wire={"dtype": "bf16"}),
        rekey=False,
    )
    policy = load_policy(ds_policy)
    assert policy.is_fallback and "key.content does not match" in policy.fallback_reason


def test_unknown_keys_from_newer_minor(ds_policy, caplog):
    rewrite(ds_policy, lambda d: (d.update(schema_version="2.7"), d["deepep"].update(new_knob=3)))
    with caplog.at_level(logging.WARNING, logger="moepolicy"):
        policy = load_policy(ds_policy, ep_size=8)
    assert not policy.is_fallback
    assert any("deepep.new_knob" in r.getMessage() for r in caplog.records)
    with pytest.raises(PolicyError, match="refused in strict mode"):
        load_policy(ds_policy, strict=True)


def test_unsafe_yaml_tag_is_refused(ds_policy):
    ds_policy.write_text("!!python/object/apply:os.system ['touch /tmp/moepolicy-pwned']\n")
    policy = load_policy(ds_policy)
    assert policy.is_fallback and not Path("/tmp/moepolicy-pwned").exists()


def test_missing_file_is_safe_not_a_crash(tmp_path):
    policy = load_policy(tmp_path / "nope.yaml", ep_size=8)
    assert policy.is_fallback and "cannot be read" in policy.fallback_reason


# --- deepep settings ---------------------------------------------------------------------------


def test_bucket_lookup_and_buffer_sizes(ds_policy):
    def buckets(d):
        first = dict(d["deepep"]["buckets"][0], max_tokens=512)
        second = dict(d["deepep"]["buckets"][0], max_tokens=None)
        second["dispatch"] = dict(second["dispatch"], num_max_nvl_chunked_send_tokens=8)
        d["deepep"]["buckets"] = [first, second]

    rewrite(ds_policy, buckets)
    deepep = load_policy(ds_policy, ep_size=8).deepep
    assert deepep.bucket_for(1).max_tokens == 512 and deepep.bucket_for(512).max_tokens == 512
    assert (
        deepep.bucket_for(513).dispatch.nvl_send == 8
        and deepep.bucket_for(10**6).max_tokens is None
    )
    nvl, rdma = deepep.buffer_bytes(7168, 8)
    # by hand: 10 channels x 8 peers x (5x4) + 10x8x256x(14336+8+1024+512+512) = 335,709,760 -> 128-aligned
    assert (
        nvl == 335_709_824 and round(nvl / 1e6, 1) == 335.7 and rdma == 0
    )  # research notes: 335.7 MB


def test_buffer_formulas_match_deepep_worked_values():
    from moepolicy.deepep.buffers import low_latency_bytes_hint, nvl_bytes_hint, rdma_bytes_hint

    # DeepEP's own hint formulas (deep_ep/buffer.py get_*_buffer_size_hint; PR#434)
    assert round(nvl_bytes_hint(20, 256, 14336, 2) / 1e6, 1) == 83.9
    assert round(nvl_bytes_hint(24, 256, 14336, 8) / 1e6, 1) == 402.9
    assert round(rdma_bytes_hint(20, 140, 14336, 16) / 1e6, 1) == 91.9
    assert (
        nvl_bytes_hint(24, 512, 7168, 16) == 453_380_736
        and rdma_bytes_hint(24, 128, 7168, 16) == 56_774_016
    )
    assert round(low_latency_bytes_hint(128, 7168, 256) / 1e9, 3) == 1.908
    assert round(low_latency_bytes_hint(128, 2048, 128) / 1e9, 3) == 0.273


# --- import weight ------------------------------------------------------------------------------


def test_loading_imports_neither_torch_nor_optuna(ds_policy):
    code = (
        "import sys\n"
        "from moepolicy import load_policy\n"
        f"p = load_policy({str(ds_policy)!r}, ep_size=8, model='DeepSeek-V3')\n"
        "assert p.layer(3).order == 'quant_then_dispatch'\n"
        "bad = [m for m in ('torch', 'optuna', 'deep_ep', 'triton') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", out.stdout


# --- exports ------------------------------------------------------------------------------------


def sglang_loader_accepts(config: dict) -> None:
    """The checks SGLang's loader applies to --deepep-config (sgl-project/sglang @003a81bf,
    python/sglang/srt/layers/moe/token_dispatcher/deepep.py, DeepEPConfig.__init__): both sections,
    each a deep_ep.Config(**section) (DeepEP config.hpp:40-49 asserts), equal num_sms; and
    Buffer.set_num_sms's even count."""
    kwargs = {
        "num_sms",
        "num_max_nvl_chunked_send_tokens",
        "num_max_nvl_chunked_recv_tokens",
        "num_max_rdma_chunked_send_tokens",
        "num_max_rdma_chunked_recv_tokens",
    }
    dispatch, combine = config["normal_dispatch"], config["normal_combine"]
    for section in (dispatch, combine):
        assert set(section) <= kwargs, set(section) - kwargs
        assert section["num_sms"] > 0 and section["num_sms"] % 2 == 0
        assert (
            0
            < section["num_max_nvl_chunked_send_tokens"]
            < section["num_max_nvl_chunked_recv_tokens"]
        )
        send, recv = (
            section["num_max_rdma_chunked_send_tokens"],
            section["num_max_rdma_chunked_recv_tokens"],
        )
        recv = -(-recv // send) * send
        assert 0 < send < recv and send <= recv // 2
    assert dispatch["num_sms"] == combine["num_sms"]


def test_sglang_export_passes_sglang_loader_checks(ds_policy):
    from conftest import run_cli

    result = run_cli("export", str(ds_policy), "--to", "sglang")
    assert result.returncode == 0, result.stderr
    config = json.loads(result.stdout)
    sglang_loader_accepts(config)
    assert config["normal_dispatch"]["num_max_nvl_chunked_send_tokens"] == 6


def test_sglang_export_refuses_low_latency(tmp_path):
    path = tmp_path / "ll.yaml"
    write_document(plan_doc(backend="deepep_ll"), path)
    from moepolicy.export.sglang import export
    from moepolicy.document.reader import read_policy

    with pytest.raises(PolicyError, match="normal \\(high-throughput\\) mode only"):
        export(read_policy(path).doc)


def test_vllm_export_buffer_and_plugin_settings(ds_policy):
    from moepolicy.export.vllm import export
    from moepolicy.document.reader import read_policy

    doc = read_policy(ds_policy).doc
    result = export(doc, str(ds_policy))
    assert (
        int(result["env"]["VLLM_DEEPEP_BUFFER_SIZE_MB"]) * 1024 * 1024 >= doc.deepep.num_nvl_bytes
    )
    assert result["env"]["MOEPOLICY_POLICY"] == str(
        ds_policy
    )  # where it lies on the nodes, as given
    assert result["args"][result["args"].index("--data-parallel-size") + 1] == str(
        doc.target.ep_size
    )
    rewrite(
        ds_policy,
        lambda d: (
            d["deepep"].update(num_sms=32, num_nvl_bytes=2**30),
            d["deepep"]["provenance"].update(source="measured"),
        ),
    )
    result = export(read_policy(ds_policy).doc, str(ds_policy))
    assert "VLLM_DBO_COMM_SMS" not in result["env"]  # no overlap split in a serial policy
    assert any("num_sms 32 (vLLM alone fixes 20; " in item for item in result["applied"])
    assert any("dispatch/combine configs" in item for item in result["applied"])


def test_vllm_export_names_what_the_plugin_applies_and_leaves_per_layer(tmp_path):
    from moepolicy.export.vllm import export
    from moepolicy.document.reader import read_policy

    path = (
        tmp_path / "mix.yaml"
    )  # static per-tensor fp8 on FlashInferExperts (vLLM's pick on SM90)
    write_document(
        plan_doc(model="amd/Mixtral-8x7B-Instruct-v0.1-FP8-KV", expert_kernel=None), path
    )
    result = export(read_policy(path).doc, str(path))
    assert (
        "layers 0-31: fp8 with the static per-tensor scale before dispatch, no scales on the wire (vLLM: bf16, "
        "then the same quantization after)" in result["applied"]
    )
    path = tmp_path / "nv.yaml"  # NVFP4 first on Blackwell: the plugin sends no NVFP4 of its own
    write_document(
        plan_doc(model="nvidia/Qwen3-30B-A3B-NVFP4", gpu="b200", expert_kernel=None), path
    )
    result = export(read_policy(path).doc, str(path))
    assert any(item.startswith("layers 0-47: left to vLLM:") for item in result["cannot_express"])


def test_vllm_export_refuses_low_latency_hidden(tmp_path):
    from moepolicy.export.vllm import export
    from moepolicy.document.reader import read_policy

    raw = plan_doc(model="DeepSeek-V3", backend="deepep_ll")
    raw["model"]["hidden_size"] = 2880
    raw["key"] = compute_keys(raw)
    path = tmp_path / "ll.yaml"
    write_document(raw, path)
    with pytest.raises(PolicyError, match="asserts hidden in"):
        export(read_policy(path).doc)


def test_loading_without_a_model_does_not_import_pydantic(ds_policy):
    """The runtime validates with pydantic-core alone (import weight: docs/BENCHMARKS.md)."""
    code = (
        "import sys\n"
        "from moepolicy import load_policy\n"
        f"p = load_policy({str(ds_policy)!r}, ep_size=8)\n"
        "assert p.layer(3).order == 'quant_then_dispatch' and not p.is_fallback\n"
        "print(','.join(m for m in ('pydantic', 'torch', 'optuna') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", out.stdout


def test_a_data_sheet_changed_since_the_plan_is_a_decision_mismatch(tmp_path, monkeypatch):
    """The document records the sheets it was planned from; a changed expert-kernel sheet (new kernel
    modes can change an order) makes the runtime fall back, as a changed rule pack does."""
    import shutil

    from moepolicy import _resources

    doc = plan_doc()
    path = tmp_path / "p.yaml"
    write_document(doc, path)
    assert load_policy(path, ep_size=8).report["decision"] != "mismatched"
    data = tmp_path / "data"
    shutil.copytree(_resources.DATA, data)
    sheet = data / "sheets" / "expert_kernels.yaml"
    sheet.write_text(sheet.read_text() + "\n# edited\n")
    monkeypatch.setattr(_resources, "DATA", data)
    loader._WARNED.clear()
    policy = load_policy(path, ep_size=8)
    assert policy.is_fallback and "data_sheets: mismatched" in policy.fallback_reason


def test_a_layer_the_policy_does_not_hold_raises(ds_policy):
    policy = load_policy(ds_policy, ep_size=8)
    assert policy.get(61) is policy.layer(61) and policy.get(62) is None and policy.get(-1) is None
    for index in (62, 99, -1):
        with pytest.raises(PolicyError, match=f"layer {index} is not in this policy"):
            policy.layer(index)


def test_the_served_model_matches_from_its_folder_or_the_config_the_engine_loaded(
    ds_policy, tmp_path
):
    from moepolicy.checkpoint import catalog
    from moepolicy.runtime.policy import ServedModel

    folder = catalog.lookup("DeepSeek-V3").folder
    config = json.loads((folder / "config.json").read_text())
    by_folder = load_policy(
        ds_policy, ep_size=8, model=ServedModel("acme/ds-v3-finetune", folder=str(folder))
    )
    assert not by_folder.is_fallback and "from the served folder" in " ".join(
        by_folder.report_details
    )
    by_config = load_policy(
        ds_policy, ep_size=8, model=ServedModel("s3://bucket/ds", config=config)
    )
    assert not by_config.is_fallback and "from the config the engine loaded" in " ".join(
        by_config.report_details
    )
    other = dict(config, num_hidden_layers=60)
    mismatched = load_policy(ds_policy, ep_size=8, model=ServedModel("acme/other", config=other))
    assert mismatched.is_fallback and "decision key mismatch" in mismatched.fallback_reason
    assert (
        load_policy(ds_policy, ep_size=8).target.content_key
        == yaml.safe_load(ds_policy.read_text())["key"]["content"]
    )


def test_the_key_check_says_where_the_served_model_was_read(tmp_path, monkeypatch):
    pytest.importorskip("huggingface_hub")
    from moepolicy.checkpoint.catalog import lookup

    policy = load_policy(_write(tmp_path / "cat.yaml", plan_doc()), ep_size=8, model="DeepSeek-V3")
    assert any("(from moepolicy's catalog)" in line for line in policy.report_details)
    repo = tmp_path / "hub" / "models--acme--ds-ft"  # a fine-tune in the Hugging Face cache
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("c0ffee")
    snapshot = repo / "snapshots" / "c0ffee"
    snapshot.mkdir(parents=True)
    config = json.loads((lookup("DeepSeek-V3").folder / "config.json").read_text())
    (snapshot / "config.json").write_text(json.dumps(config))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    doc = plan_doc("acme/ds-ft")
    cached = load_policy(_write(tmp_path / "ft.yaml", doc), ep_size=8, model="acme/ds-ft")
    line = next(x for x in cached.report_details if "model_facts" in x)
    assert "matched" in line and "(from the Hugging Face cache, acme/ds-ft@c0ffee)" in line


def _write(path, doc):
    write_document(doc, path)
    return path


@pytest.mark.parametrize("version", ["\u00b22.3", "2.\u0663", "\uff12.3"])
def test_a_schema_version_in_other_digits_is_a_one_line_error_not_a_crash(tmp_path, version):
    """'²2.3' passes ``str.isdigit`` but not ``int`` (found by the fuzz test in CI): the reader says
    what is wrong with schema_version, and serving falls back for that reason, not an unexpected one."""
    import moepolicy
    from moepolicy.document.yaml_io import dumps
    from moepolicy.errors import PolicyError

    plan = moepolicy.plan("Qwen3-30B-A3B-FP8", moepolicy.TargetSpec(gpu="h200", ep_size=2))
    doc = moepolicy.policy_document(plan)
    doc["schema_version"] = version
    path = tmp_path / "p.yaml"
    path.write_text(dumps(doc), encoding="utf-8")
    with pytest.raises(PolicyError, match="schema_version must be 'MAJOR.MINOR'"):
        moepolicy.load_policy(path, strict=True)
    policy = moepolicy.load_policy(path)
    assert policy.is_fallback and "schema_version" in policy.fallback_reason
    assert "unexpected error" not in policy.fallback_reason


def test_the_safe_path_sizes_buffers_for_the_served_model_an_engine_passes(tmp_path):
    # a policy that cannot be read falls back to DeepEP's default buffers, sized for the hidden size
    # of the model served: the engine's ServedModel (its folder, or the config it loaded) names it
    # as well as a catalog name does
    from moepolicy.checkpoint import catalog
    from moepolicy.runtime.policy import ServedModel

    folder = catalog.lookup("DeepSeek-V3").folder
    config = json.loads((folder / "config.json").read_text())
    missing = tmp_path / "nope.yaml"
    by_name = load_policy(missing, ep_size=8, model="DeepSeek-V3")
    assert by_name.is_fallback and by_name.deepep.num_nvl_bytes
    for served in (
        ServedModel("acme/ds-v3-finetune", folder=str(folder)),
        ServedModel("s3://bucket/ds", config=config),
    ):
        policy = load_policy(missing, ep_size=8, model=served)
        assert policy.is_fallback
        assert policy.deepep.num_nvl_bytes == by_name.deepep.num_nvl_bytes, served
