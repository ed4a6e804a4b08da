"""The vLLM plugin against the real vLLM 0.33.0 package (CPU; `.ci/run` installs vLLM into its own
virtual environment and runs this file there; elsewhere it skips).

Everything is vLLM's real code — ``DeepEPHTPrepareAndFinalize.prepare_async``, ``_do_dispatch``, the
receive path, ``DeepEPHTAll2AllManager.__init__`` / ``_make_all2all_kwargs``, its quant configs —
except these stand-ins, which CPU needs:
- ``deep_ep``: a recording ``Buffer`` (one rank's echo of what it is handed), ``Config``, ``EventOverlap``;
- vLLM's fp8 quantizers (CUDA/Triton ops) replaced by moepolicy's torch reference;
- parallel state (the DP/TP groups a manager reads) and the current vLLM config (it needs a device);
- pinned memory off (no CUDA);
- the forward context's layer table: one FusedMoE runner per layer whose kernel holds the instance.
"""

import importlib
import json
import sys
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm", reason="vLLM is installed by .ci/run into its own environment (.venv-vllm)")

from conftest import run_cli  # noqa: E402
from moepolicy._resources import data_dir  # noqa: E402

CATALOG = data_dir("catalog")


# ------------------------------------------------------------------------------------- stand-ins
class Config:
    def __init__(self, num_sms, *chunks):
        self.num_sms, self.chunks = num_sms, chunks


class EventOverlap:
    def __init__(self, event=None):
        self.event = event

    def current_stream_wait(self):
        pass


class RecordingBuffer:
    """One rank: what dispatch is handed comes back as received (all top-k experts local). Its
    constructor has DeepEP 29d31c0's parameters, by which moepolicy recognises the build."""

    num_sms = 20

    def __init__(self, group=None, num_nvl_bytes=0, num_rdma_bytes=0, low_latency_mode=False,
                 num_qps_per_rank=24, explicitly_destroy=False, enable_shrink=False):
        self.num_nvl_bytes, self.dispatched, self.combined = num_nvl_bytes, [], []

    def capture(self):
        return EventOverlap()

    @staticmethod
    def get_dispatch_config(n):
        return Config(20, "vllm-table-dispatch")

    @staticmethod
    def get_combine_config(n):
        return Config(20, "vllm-table-combine")

    @classmethod
    def set_num_sms(cls, n):
        cls.num_sms = n

    def get_dispatch_layout(self, topk_idx, num_experts, **_):
        per_expert = torch.bincount(topk_idx.flatten(), minlength=num_experts)
        return None, None, per_expert, None, EventOverlap()

    def dispatch(self, x, handle, topk_idx, topk_weights, config, num_tokens_per_expert, **_):
        self.dispatched.append({"x": x, "config": config})
        per_expert = num_tokens_per_expert.tolist()
        return x, topk_idx, topk_weights, per_expert, "handle", EventOverlap()

    def combine(self, x, handle, config, **_):
        self.combined.append({"config": config})
        return x, None, EventOverlap()


def _fake_deep_ep():
    import importlib.machinery

    module = types.ModuleType("deep_ep")
    module.__spec__ = importlib.machinery.ModuleSpec("deep_ep", None)
    module.Buffer, module.Config, module.EventOverlap = RecordingBuffer, Config, EventOverlap
    module.topk_idx_t = torch.int64
    return module


def _torch_fp8_ops(monkeypatch):
    """vLLM's CUDA quantizers → moepolicy's torch reference (same formats: [T,1] per token, [T,G] groups)."""
    from moepolicy.quant import reference
    from vllm.model_executor.layers.fused_moe import utils

    def scaled_fp8_quant(a, scale=None, use_per_token_if_dynamic=False, **_):
        if scale is not None:
            return reference.per_tensor_static(a, scale.view(1)), scale
        if use_per_token_if_dynamic:
            return reference.per_token(a)
        q, s = reference.per_tensor_dynamic(a)
        return q, s.view(1)

    def per_token_group_quant_fp8(a, group, column_major_scales=False, **_):
        return reference.per_token_group(a, group)

    monkeypatch.setattr(utils.ops, "scaled_fp8_quant", scaled_fp8_quant)
    monkeypatch.setattr(utils, "per_token_group_quant_fp8", per_token_group_quant_fp8)


@pytest.fixture
def vllm_env(monkeypatch):
    """Import vLLM's DeepEP modules over the stand-ins; the plugin's patches are undone afterwards."""
    if importlib.util.find_spec("deep_ep") is None:
        monkeypatch.setitem(sys.modules, "deep_ep", _fake_deep_ep())
    from vllm.distributed.device_communicators import all2all
    from vllm.model_executor.layers.fused_moe import modular_kernel
    from vllm.model_executor.layers.fused_moe.prepare_finalize import deepep_ht

    monkeypatch.setattr(modular_kernel, "PIN_MEMORY", False)
    _torch_fp8_ops(monkeypatch)
    for cls in (deepep_ht.DeepEPHTPrepareAndFinalize, all2all.DeepEPHTAll2AllManager):
        for name in ("prepare_async", "_receiver", "_get_dispatch_config", "_get_combine_config", "__init__",
                     "_make_all2all_kwargs"):
            if name in vars(cls):
                monkeypatch.setattr(cls, name, vars(cls)[name])  # restored after the test
    return types.SimpleNamespace(deepep_ht=deepep_ht, all2all=all2all)


class CpuGroup:
    def __init__(self, size):
        self._size = size

    def rank(self):
        return 0

    def size(self):
        return self._size


def make_manager(env, monkeypatch, ep_size, model, cudagraph_mode=None):
    from vllm.distributed import parallel_state

    group = types.SimpleNamespace(rank_in_group=0, world_size=ep_size)
    monkeypatch.setattr(parallel_state, "get_dp_group", lambda: group)
    monkeypatch.setattr(parallel_state, "get_tp_group", lambda: types.SimpleNamespace(rank_in_group=0, world_size=1))
    monkeypatch.setattr(parallel_state, "in_the_same_node_as", lambda g, source_rank=0: [True] * ep_size)
    import vllm.config

    cfg = types.SimpleNamespace(model_config=types.SimpleNamespace(model=model),
                                compilation_config=types.SimpleNamespace(cudagraph_mode=cudagraph_mode))
    monkeypatch.setattr(vllm.config, "get_current_vllm_config", lambda: cfg)
    return env.all2all.DeepEPHTAll2AllManager(CpuGroup(ep_size))


TritonExperts = type("TritonExperts", (), {})
DeepGemmExperts = type("DeepGemmExperts", (), {})


def forward_context(monkeypatch, instances, tokens_across_dp, experts=DeepGemmExperts):
    """vLLM's static forward context as the model runner builds it: prefix -> FusedMoE runner."""
    import vllm.forward_context as fc

    layers = {}
    for index, pf in instances.items():
        impl = types.SimpleNamespace(prepare_finalize=pf, fused_experts=experts())
        method = types.SimpleNamespace(moe_kernel=types.SimpleNamespace(impl=impl))
        layers[f"model.layers.{index}.mlp.experts"] = types.SimpleNamespace(
            routed_experts=types.SimpleNamespace(quant_method=method))
    dp = types.SimpleNamespace(num_tokens_across_dp_cpu=torch.tensor(tokens_across_dp)) if tokens_across_dp else None
    ctx = types.SimpleNamespace(no_compile_layers=layers, dp_metadata=dp)
    monkeypatch.setattr(fc, "get_forward_context", lambda: ctx)
    monkeypatch.setattr(fc, "is_forward_context_available", lambda: True)


def quant_config(kind):
    from vllm.model_executor.layers.fused_moe.config import fp8_w8a8_moe_quant_config

    one = torch.ones(1)
    if kind == "block":
        return fp8_w8a8_moe_quant_config(w1_scale=one, w2_scale=one, block_shape=[128, 128])
    return fp8_w8a8_moe_quant_config(w1_scale=one, w2_scale=one, per_act_token_quant=True)


def run_layer(env, pf, qc, tokens, hidden, seed=0):
    g = torch.Generator().manual_seed(seed)
    a1 = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)
    topk_ids = torch.randint(0, 8, (tokens, 2), generator=g)
    weights = torch.rand(tokens, 2, generator=g)
    receiver = pf.prepare_async(a1, weights, topk_ids, 8, None, False, qc)
    received = receiver()
    pf.finalize(torch.empty_like(a1), received[0].to(torch.bfloat16) if received[0].dtype != torch.bfloat16
                else received[0], weights, topk_ids, False, _weight_and_reduce())
    return a1, received


def _weight_and_reduce():
    from vllm.model_executor.layers.fused_moe.topk_weight_and_reduce import TopKWeightAndReduceNoOP

    return TopKWeightAndReduceNoOP()


# ----------------------------------------------------------------------------------------- policies
def policy_file(tmp_path, model, ep, *extra):
    out = tmp_path / f"{Path(model).name}-ep{ep}.yaml"
    result = run_cli("plan", "--model", str(model), "--ep-size", str(ep), *extra, "-o", str(out))
    assert result.returncode == 0, result.stderr
    return out


def per_token_checkpoint(tmp_path):
    """Qwen3-30B-A3B's shape with FP8-dynamic weights (per-channel weights, per-token dynamic activations)."""
    config = json.loads((CATALOG / "Qwen__Qwen3-30B-A3B-FP8" / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
        "config_groups": {"group_0": {"targets": ["Linear"],
                                      "weights": {"num_bits": 8, "type": "float", "strategy": "channel",
                                                  "dynamic": False, "symmetric": True},
                                      "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                                                            "dynamic": True, "symmetric": True}}}}
    folder = tmp_path / "qwen3-fp8-dynamic"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def tuned_policy(tmp_path):
    """A modelled tune (48 SMs, three buckets): something vLLM would not do by itself."""
    out = tmp_path / "qwen-tuned.yaml"
    result = run_cli("tune", "--model", "Qwen3-30B-A3B-FP8", "--ep-size", "2", "--storage",
                     f"sqlite:///{tmp_path}/s.db", "-o", str(out))
    assert result.returncode == 0, result.stderr
    return out


def install(env, path, monkeypatch):
    from moepolicy.integrations.vllm.patches import install as plugin_install

    return plugin_install(str(path))


def new_pf(env, buffer=None):
    return env.deepep_ht.DeepEPHTPrepareAndFinalize(buffer or RecordingBuffer(), num_dispatchers=2, dp_size=2,
                                                    rank_expert_offset=0)


# --------------------------------------------------------------------------------------------- tests
def test_a_tuned_policy_sets_num_sms_buffers_and_per_bucket_configs(vllm_env, tmp_path, monkeypatch):
    path = tuned_policy(tmp_path)
    state = install(vllm_env, path, monkeypatch)
    assert state is not None
    manager = make_manager(vllm_env, monkeypatch, 2, "Qwen3-30B-A3B-FP8")
    from moepolicy import load_policy

    policy = load_policy(path, ep_size=2, model="Qwen3-30B-A3B-FP8")
    assert manager.num_sms == policy.deepep.num_sms == 48  # above vLLM's fixed 20
    kwargs = manager._make_all2all_kwargs()
    assert kwargs["num_nvl_bytes"] == policy.deepep.num_nvl_bytes
    pf = new_pf(vllm_env)
    forward_context(monkeypatch, {3: pf}, tokens_across_dp=[100, 3000])  # two DP ranks, different counts
    run_layer(vllm_env, pf, quant_config("block"), tokens=100, hidden=2048)
    sent = pf.buffer.dispatched[-1]
    bucket = policy.deepep.bucket_for(3000)  # the max over DP ranks, not this rank's 100
    assert sent["config"].num_sms == 48 and sent["config"].chunks == tuple(bucket.dispatch)
    assert pf.buffer.combined[-1]["config"].chunks == tuple(bucket.combine)  # combine uses its dispatch's bucket
    x, scales = sent["x"]
    assert x.dtype == torch.float8_e4m3fn and scales.shape == (100, 2048 // 128)  # block fp8, as vLLM does


def test_two_ranks_with_different_local_counts_pick_the_same_bucket(vllm_env, tmp_path, monkeypatch):
    path = tuned_policy(tmp_path)
    install(vllm_env, path, monkeypatch)
    make_manager(vllm_env, monkeypatch, 2, "Qwen3-30B-A3B-FP8")
    configs = []
    for local in (100, 3000):
        pf = new_pf(vllm_env)
        forward_context(monkeypatch, {0: pf}, tokens_across_dp=[100, 3000])
        run_layer(vllm_env, pf, quant_config("block"), tokens=local, hidden=2048)
        configs.append(pf.buffer.dispatched[-1]["config"].chunks)
    assert configs[0] == configs[1]


def test_per_token_fp8_goes_quantized_with_t1_scales_and_is_not_quantized_again(vllm_env, tmp_path, monkeypatch):
    from moepolicy.quant import reference

    folder = per_token_checkpoint(tmp_path)
    path = policy_file(tmp_path, folder, 2, "--expert-kernel", "triton")
    install(vllm_env, path, monkeypatch)
    make_manager(vllm_env, monkeypatch, 2, str(folder))
    pf = new_pf(vllm_env)
    forward_context(monkeypatch, {5: pf}, tokens_across_dp=[64, 64], experts=TritonExperts)
    a1, received = run_layer(vllm_env, pf, quant_config("token"), tokens=64, hidden=2048)
    x, scales = pf.buffer.dispatched[-1]["x"]  # what DeepEP was handed
    ref_q, ref_s = reference.per_token(a1)
    assert x.dtype == torch.float8_e4m3fn and scales.shape == (64, 1)
    assert torch.equal(x.view(torch.uint8), ref_q.view(torch.uint8)) and torch.equal(scales, ref_s)
    # the receive path hands the experts exactly what arrived (no second quantization)
    assert received[0] is x and torch.equal(received[1], scales)


def test_a_layer_whose_experts_are_not_the_policys_kernel_is_left_to_vllm(vllm_env, tmp_path, monkeypatch, caplog):
    folder = per_token_checkpoint(tmp_path)
    path = policy_file(tmp_path, folder, 2, "--expert-kernel", "triton")
    install(vllm_env, path, monkeypatch)
    make_manager(vllm_env, monkeypatch, 2, str(folder))
    pf = new_pf(vllm_env)
    forward_context(monkeypatch, {5: pf}, tokens_across_dp=[64, 64], experts=DeepGemmExperts)
    run_layer(vllm_env, pf, quant_config("token"), tokens=64, hidden=2048)
    sent = pf.buffer.dispatched[-1]["x"]
    assert isinstance(sent, torch.Tensor) and sent.dtype == torch.bfloat16  # vLLM's own: bf16 on the wire
    assert any("made for triton experts; vLLM runs DeepGemmExperts" in r.getMessage() for r in caplog.records)


def test_experts_that_cannot_read_per_token_scales_get_vllms_path():
    from moepolicy.export.vllm_actions import TOKEN_FIRST, VLLM, LayerQuant, action_for

    def act(experts):
        return action_for("quant_then_dispatch", "fp8_e4m3", "token",
                          LayerQuant(fp8=True, block=False, per_token=True, experts=experts)).kind

    assert act("TritonExperts") == act("CutlassExpertsFp8") == TOKEN_FIRST
    assert act("DeepGemmExperts") == act("FlashInferExperts") == VLLM  # per-tensor or block readers


def test_bf16_on_the_wire_for_a_block_layer_is_quantized_on_receive(vllm_env, tmp_path, monkeypatch):
    """A policy that says dispatch_then_quant for a block-fp8 layer (vLLM would quantize first)."""
    import yaml

    from moepolicy.keys import compute_keys

    path = policy_file(tmp_path, "DeepSeek-V3", 2)
    doc = yaml.safe_load(path.read_text())
    for layer in doc["layers"]:
        if layer["kind"] == "moe":
            layer.update(order="dispatch_then_quant", wire={"dtype": "bf16"})
    doc["key"] = compute_keys(doc)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    install(vllm_env, path, monkeypatch)
    make_manager(vllm_env, monkeypatch, 2, "DeepSeek-V3")
    pf = new_pf(vllm_env)
    forward_context(monkeypatch, {3: pf}, tokens_across_dp=[32, 32])
    _, received = run_layer(vllm_env, pf, quant_config("block"), tokens=32, hidden=7168)
    sent = pf.buffer.dispatched[-1]["x"]
    assert isinstance(sent, torch.Tensor) and sent.dtype == torch.bfloat16
    assert received[0].dtype == torch.float8_e4m3fn and received[1].shape == (32, 7168 // 128)


def test_a_key_mismatch_leaves_vllm_untouched(vllm_env, tmp_path, monkeypatch, caplog):
    path = tuned_policy(tmp_path)  # made for EP 2
    install(vllm_env, path, monkeypatch)
    manager = make_manager(vllm_env, monkeypatch, 4, "Qwen3-30B-A3B-FP8")  # vLLM runs EP 4
    assert manager.num_sms == 20
    assert manager._make_all2all_kwargs()["num_nvl_bytes"] == 1024 * 1024 * 1024  # VLLM_DEEPEP_BUFFER_SIZE_MB
    pf = new_pf(vllm_env)
    forward_context(monkeypatch, {3: pf}, tokens_across_dp=[100, 100])
    run_layer(vllm_env, pf, quant_config("block"), tokens=100, hidden=2048)
    assert pf.buffer.dispatched[-1]["config"].chunks == ("vllm-table-dispatch",)
    assert any("not applied" in r.getMessage() for r in caplog.records)


def test_cuda_graphs_on_patch_nothing(vllm_env, tmp_path, monkeypatch, caplog):
    path = tuned_policy(tmp_path)
    install(vllm_env, path, monkeypatch)
    manager = make_manager(vllm_env, monkeypatch, 2, "Qwen3-30B-A3B-FP8",
                           cudagraph_mode=types.SimpleNamespace(name="FULL_AND_PIECEWISE"))
    assert manager.num_sms == 20 and any("CUDA graphs" in r.getMessage() for r in caplog.records)


def test_an_unchecked_vllm_version_patches_nothing(vllm_env, tmp_path, monkeypatch, caplog):
    import importlib.metadata

    from moepolicy.integrations.vllm import patches

    real = importlib.metadata.version
    monkeypatch.setattr(patches.importlib.metadata, "version",
                        lambda name: "0.34.0" if name == "vllm" else real(name))
    before = vllm_env.deepep_ht.DeepEPHTPrepareAndFinalize.prepare_async
    assert patches.install(str(tuned_policy(tmp_path))) is None
    assert vllm_env.deepep_ht.DeepEPHTPrepareAndFinalize.prepare_async is before
    assert any("vLLM 0.34.0 is not a release" in r.getMessage() for r in caplog.records)


def test_the_entry_point_does_nothing_without_the_variable(monkeypatch):
    import subprocess

    from importlib.metadata import entry_points

    assert any(ep.value == "moepolicy.integrations.vllm:register" for ep in entry_points(group="vllm.general_plugins"))
    code = ("import sys; from moepolicy.integrations.vllm import register; register(); "
            "print('torch' in sys.modules, 'vllm' in sys.modules)")
    env = {k: v for k, v in __import__("os").environ.items() if k != "MOEPOLICY_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.stdout.split() == ["False", "False"], out.stderr


# ------------------------------------------------------------- the vllm pack against vLLM's own code
def _vllm_quant_config(facts):
    """The FusedMoEQuantConfig vLLM 0.33 builds for a layer with these checkpoint facts (fp8 schemes
    and unquantized activations; None for schemes this test does not build)."""
    from vllm.model_executor.layers.fused_moe.config import FUSED_MOE_UNQUANTIZED_CONFIG, fp8_w8a8_moe_quant_config

    one = torch.ones(1)
    if facts["kernel.act_dtype"] == "bf16" or facts["ckpt.act_dtype"] == "none":
        return FUSED_MOE_UNQUANTIZED_CONFIG
    if facts["ckpt.act_dtype"] != "fp8_e4m3":
        return None
    granularity = facts["ckpt.act_granularity"]
    if granularity == "group" and facts["ckpt.act_group"] == 128:
        return fp8_w8a8_moe_quant_config(w1_scale=one, w2_scale=one, block_shape=[128, 128])
    if granularity == "token":
        return fp8_w8a8_moe_quant_config(w1_scale=one, w2_scale=one, per_act_token_quant=True)
    if granularity == "tensor":
        static = facts["ckpt.act_dynamic"] == "static"
        return fp8_w8a8_moe_quant_config(w1_scale=one, w2_scale=one, a1_scale=torch.tensor(0.05) if static else None)
    return None


def test_the_vllm_pack_says_what_vllms_own_code_does_for_every_catalog_model(vllm_env, monkeypatch):
    """vLLM's real prepare_async (no plugin) decides whether the tokens DeepEP is handed are fp8 or bf16;
    the ``vllm`` pack, replayed on each catalog model's facts, must say the same (h200, EP 8, HT)."""
    from moepolicy.checkpoint import catalog
    from moepolicy.checkpoint.reader import read_model
    from moepolicy.errors import InfeasibleError
    from moepolicy.planner import build_document, make_plan
    from moepolicy.rules.packs import pack_stack
    from moepolicy.target import TargetSpec, resolve_target

    checked = []
    for entry in catalog.entries():
        target = resolve_target(TargetSpec(gpu="h200", ep_size=8), probe=False)
        try:
            plan = make_plan(read_model(entry.repo_id, hub=False), target, pack_stack(["vllm"]))
        except InfeasibleError:
            continue
        layer = next(entry_ for entry_ in build_document(plan)["layers"] if entry_["kind"] == "moe")
        qc = _vllm_quant_config(layer["facts"])
        if qc is None:
            continue
        pf = new_pf(vllm_env)
        run_layer(vllm_env, pf, qc, tokens=16, hidden=plan.model.hidden_size)
        sent = pf.buffer.dispatched[-1]["x"]
        vllm_sends_fp8 = isinstance(sent, tuple) and sent[0].dtype == torch.float8_e4m3fn
        pack_sends_fp8 = layer["order"] == "quant_then_dispatch"
        assert vllm_sends_fp8 == pack_sends_fp8, (entry.repo_id, layer["order"], layer["rule"])
        checked.append(entry.repo_id)
    assert len(checked) >= 8, checked


def test_a_deepseek_v3_policy_sends_block_fp8_with_its_configs(vllm_env, tmp_path, monkeypatch):
    path = policy_file(tmp_path, "DeepSeek-V3", 2)
    install(vllm_env, path, monkeypatch)
    manager = make_manager(vllm_env, monkeypatch, 2, "DeepSeek-V3")
    from moepolicy import load_policy

    policy = load_policy(path, ep_size=2, model="DeepSeek-V3")
    assert manager.num_sms == policy.deepep.num_sms
    pf = new_pf(vllm_env)
    forward_context(monkeypatch, {3: pf}, tokens_across_dp=[40, 40])
    a1, received = run_layer(vllm_env, pf, quant_config("block"), tokens=40, hidden=7168)
    (x, scales), config = pf.buffer.dispatched[-1]["x"], pf.buffer.dispatched[-1]["config"]
    assert x.dtype == torch.float8_e4m3fn and scales.shape == (40, 56) and scales.dtype == torch.float32
    assert config.chunks == tuple(policy.deepep.bucket_for(40).dispatch)  # the policy's, not vLLM's table
    assert received[0] is x  # block layers are not quantized again on receive
