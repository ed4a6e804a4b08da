"""The vLLM plugin against the real vLLM 0.33.0 package on CPU (`.ci/run` installs vLLM into its own
virtual environment and runs this file there; elsewhere it skips).

Layers are built the way vLLM builds them: its fp8 expert oracle (``select_fp8_moe_backend``) on a
platform whose device capability is set to 9.0 (FlashInfer present or absent), its kernel factory
(``make_fp8_moe_kernel`` → ``maybe_make_prepare_finalize``, over the DeepEP manager vLLM's CUDA
communicator would build), and every forward goes through ``FusedMoEKernel.apply``. What stands in
for hardware is listed in ``vllm_harness``.
"""

import importlib
import json
import logging
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip(
    "vllm",
    reason="vLLM 0.33.0 is installed by .ci/run into its own environment (.venv-vllm-ci); run this file with that python",
)

sys.path.insert(0, str(Path(__file__).parent))
import vllm_harness as h  # noqa: E402

from moepolicy._resources import data_dir  # noqa: E402
from moepolicy.checkpoint import read_model  # noqa: E402
from moepolicy.document.keys import compute_keys  # noqa: E402
from moepolicy.document.compose import build_document  # noqa: E402
from moepolicy.planner import make_plan  # noqa: E402
from moepolicy.document.yaml_io import parse_text, write_document  # noqa: E402
from moepolicy.rules.packs import pack_stack  # noqa: E402
from moepolicy.target import TargetSpec, resolve_target  # noqa: E402

CATALOG = data_dir("catalog")
QWEN, DEEPSEEK = "Qwen/Qwen3-30B-A3B-FP8", "deepseek-ai/DeepSeek-V3"
PLUGIN_LOG = "vllm.moepolicy"


# ------------------------------------------------------------------------------------------ fixtures
@pytest.fixture
def vllm_env(monkeypatch, caplog):
    """vLLM's DeepEP modules over the stand-in deep_ep; the plugin uninstalled afterwards."""
    monkeypatch.setitem(
        sys.modules, "deep_ep", h.fake_deep_ep()
    )  # CPU: the stand-in, even where DeepEP is installed
    h.Buffer.num_sms = 20
    h.cpu_runtime(monkeypatch)
    h.torch_fp8_ops(monkeypatch)
    h.cuda_platform(monkeypatch)
    caplog.set_level(logging.DEBUG, logger=PLUGIN_LOG)
    yield
    h.uninstall_plugin()


def plan_file(tmp_path, model, ep=2, name=None, mutate=None, **target):
    """A policy planned in process (``moepolicy plan``'s document), optionally edited and re-keyed."""
    spec = TargetSpec(gpu=target.pop("gpu", "h200"), ep_size=ep, **target)
    doc = build_document(
        make_plan(read_model(str(model)), resolve_target(spec, probe=False), pack_stack()),
        command=f"moepolicy plan --model {model}",
    )
    if mutate is not None:
        mutate(doc)
        doc["key"] = compute_keys(doc)
    path = tmp_path / (name or f"{Path(str(model)).name}-ep{ep}.yaml")
    write_document(doc, path)
    return path


def with_buckets(doc):
    """Three DeepEP buckets whose chunks differ (and buffers that fit the largest)."""

    def chunk(send, recv):
        return {
            "num_max_nvl_chunked_send_tokens": send,
            "num_max_nvl_chunked_recv_tokens": recv,
            "num_max_rdma_chunked_send_tokens": 6,
            "num_max_rdma_chunked_recv_tokens": 132,
        }

    doc["deepep"]["buckets"] = [
        {"max_tokens": 128, "dispatch": chunk(4, 256), "combine": chunk(2, 256)},
        {"max_tokens": 1024, "dispatch": chunk(8, 256), "combine": chunk(3, 256)},
        {"max_tokens": None, "dispatch": chunk(12, 512), "combine": chunk(5, 512)},
    ]
    doc["deepep"]["num_sms"] = 24
    doc["deepep"]["num_nvl_bytes"] = 2**30
    doc["deepep"]["provenance"] = {"source": "modelled", "note": "test buckets"}


def bucket_chunks(path, tokens):
    from moepolicy import load_policy

    bucket = load_policy(path).deepep.bucket_for(tokens)
    return tuple(bucket.dispatch), tuple(bucket.combine)


def effective(chunk):
    from moepolicy.deepep.configs import ChunkConfig

    return tuple(ChunkConfig(*chunk).effective())


def per_token_checkpoint(tmp_path, name="qwen3-fp8-dynamic"):
    """Qwen3-30B-A3B's shape with FP8-dynamic weights (per-channel weights, per-token dynamic activations)."""
    config = json.loads((CATALOG / "Qwen__Qwen3-30B-A3B-FP8" / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "ignore": ["lm_head"],
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {
                    "num_bits": 8,
                    "type": "float",
                    "strategy": "channel",
                    "dynamic": False,
                    "symmetric": True,
                },
                "input_activations": {
                    "num_bits": 8,
                    "type": "float",
                    "strategy": "token",
                    "dynamic": True,
                    "symmetric": True,
                },
            }
        },
    }
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def start(
    monkeypatch,
    path,
    ep=2,
    model=QWEN,
    strict=False,
    group=None,
    backend="ht",
    gpus_per_node=8,
    **config,
):
    """The plugin installed for ``path``, vLLM's config, and the manager vLLM builds."""
    h.install_plugin(path, strict=strict)
    h.vllm_config(monkeypatch, model=model, **config)
    return h.make_manager(
        monkeypatch, group or h.CpuGroup(ep), backend=backend, gpus_per_node=gpus_per_node
    )


def layer(
    manager,
    monkeypatch,
    scheme="block",
    hidden=2048,
    ep=2,
    moe_backend="auto",
    prefix="model.layers.3.mlp.experts",
    tokens_across_dp=None,
    **ctx,
):
    kernel = h.make_kernel(
        manager, monkeypatch, scheme, h.moe_config(hidden, ep, moe_backend=moe_backend)
    )
    h.forward_context(monkeypatch, {prefix: kernel}, tokens_across_dp=tokens_across_dp, **ctx)
    return kernel


def messages(caplog, level=logging.DEBUG):
    return [r.getMessage() for r in caplog.records if r.name == PLUGIN_LOG and r.levelno >= level]


# ----------------------------------------------------- vLLM's own expert selection, as the sheet says
@pytest.mark.parametrize(
    "scheme, flashinfer, deep_gemm, experts",
    [
        ("block", True, False, "FlashInferExperts"),  # oracle/fp8.py:122-130
        ("block", False, True, "TritonOrDeepGemmExperts"),  # no FlashInfer: DEEPGEMM next
        (
            "token",
            True,
            False,
            "TritonExperts",
        ),  # CUTLASS refuses DeepEP HT: cutlass_moe.py:416-425
        (
            "static",
            True,
            False,
            "FlashInferExperts",
        ),  # static per-tensor on 9.0+: flashinfer_cutlass_moe.py:154-162
    ],
)
def test_the_expert_sheet_says_which_experts_vllm_builds(
    vllm_env, monkeypatch, scheme, flashinfer, deep_gemm, experts
):
    """The sheet's default kernel for a scheme on SM90 with DeepEP HT is the class vLLM's own oracle
    picks (with FlashInfer installed, as vLLM 0.33.0 installs it)."""
    from moepolicy.expert_kernel import Deployment, default_kernel
    from moepolicy.export.vllm_actions import experts_for
    from moepolicy.schema.facts import LayerFacts, TensorQuant

    h.cuda_platform(monkeypatch, flashinfer=flashinfer, deep_gemm=deep_gemm)
    manager = start(monkeypatch, None)
    kernel = h.make_kernel(manager, monkeypatch, scheme, h.moe_config(2048, 2))
    assert type(kernel.fused_experts).__name__ == experts
    acts = {
        "block": ("fp8_e4m3", "group", "dynamic"),
        "token": ("fp8_e4m3", "token", "dynamic"),
        "static": ("fp8_e4m3", "tensor", "static"),
    }[scheme]
    weights = {"block": "block", "token": "channel", "static": "tensor"}[scheme]
    facts = LayerFacts(
        index=0,
        kind="moe",
        hidden_size=2048,
        weights=TensorQuant(dtype="fp8_e4m3", granularity=weights),
        activations=TensorQuant(dtype=acts[0], granularity=acts[1], dynamic=acts[2], group=128),
    )
    modelled = experts_for(
        default_kernel(facts, "sm90", Deployment("vllm", "deepep_ht", "legacy")), "fp8_e4m3"
    )
    if flashinfer:
        assert modelled == experts


def test_vllm_use_deep_gemm_builds_triton_or_deepgemm_experts(vllm_env, monkeypatch):
    from vllm import envs

    h.cuda_platform(monkeypatch, deep_gemm=True)
    monkeypatch.setenv("VLLM_USE_DEEP_GEMM", "1")
    monkeypatch.setattr(envs, "is_set", lambda name: name in os.environ)
    manager = start(monkeypatch, None)
    kernel = h.make_kernel(manager, monkeypatch, "block", h.moe_config(2048, 2))
    assert (
        type(kernel.fused_experts).__name__ == "TritonOrDeepGemmExperts"
    )  # oracle/fp8.py:484-496


# ---------------------------------------------------------------------- what reaches DeepEP and the experts
def test_default_h200_policy_sends_bf16_to_flashinfer_experts_with_its_configs(
    vllm_env, tmp_path, monkeypatch
):
    path = plan_file(tmp_path, "Qwen3-30B-A3B-FP8", mutate=with_buckets)
    manager = start(monkeypatch, path)
    assert manager.num_sms == 24  # above vLLM's fixed 20
    assert manager._make_all2all_kwargs()["num_nvl_bytes"] == 2**30
    kernel = layer(
        manager, monkeypatch, moe_backend="flashinfer_cutlass", tokens_across_dp=[100, 3000]
    )
    h.run_kernel(kernel, 100, 2048)
    sent = h.dispatched(kernel)
    assert sent["wire"] == ("torch.bfloat16", None)  # FlashInferExperts quantize their own input
    dispatch, combine = bucket_chunks(path, 3000)  # the max over DP ranks, not this rank's 100
    assert sent["config"].key() == (24, *effective(dispatch))
    assert kernel.prepare_finalize.buffer.combined[-1]["config"].key() == (24, *effective(combine))
    assert kernel.fused_experts.received[-1]["x"].dtype == torch.bfloat16


def test_two_ranks_with_different_local_counts_pick_the_same_bucket(
    vllm_env, tmp_path, monkeypatch
):
    path = plan_file(tmp_path, "Qwen3-30B-A3B-FP8", mutate=with_buckets)
    manager = start(monkeypatch, path)
    configs = []
    for local in (100, 3000):
        kernel = layer(
            manager, monkeypatch, moe_backend="flashinfer_cutlass", tokens_across_dp=[100, 3000]
        )
        h.run_kernel(kernel, local, 2048)
        configs.append(h.dispatched(kernel)["config"].key())
    assert configs[0] == configs[1]


def test_a_deepgemm_policy_sends_block_fp8_as_vllm_does_with_its_configs(
    vllm_env, tmp_path, monkeypatch
):
    path = plan_file(tmp_path, "DeepSeek-V3", expert_kernel="deepgemm", mutate=with_buckets)
    h.cuda_platform(monkeypatch, flashinfer=False, deep_gemm=True)
    manager = start(monkeypatch, path, model=DEEPSEEK)
    kernel = layer(manager, monkeypatch, hidden=7168, tokens_across_dp=[40, 40])
    assert type(kernel.fused_experts).__name__ == "TritonOrDeepGemmExperts"
    h.run_kernel(kernel, 40, 7168)
    sent = h.dispatched(kernel)
    assert sent["wire"] == ("torch.float8_e4m3fn", 56)
    assert sent["config"].key() == (24, *effective(bucket_chunks(path, 40)[0]))
    assert kernel.fused_experts.received[-1]["scale"].shape == (40, 56)


def test_per_token_fp8_reaches_triton_experts_with_n1_scales_and_is_not_quantized_again(
    vllm_env, tmp_path, monkeypatch
):
    from moepolicy.quant import reference

    folder = per_token_checkpoint(tmp_path)
    path = plan_file(tmp_path, folder)
    manager = start(monkeypatch, path, model=str(folder))
    kernel = layer(manager, monkeypatch, scheme="token", tokens_across_dp=[64, 64])
    assert (
        type(kernel.fused_experts).__name__ == "TritonExperts"
    )  # vLLM's pick on HT (the sheet's too)
    a1, _ = h.run_kernel(kernel, 64, 2048)
    x, scales = h.dispatched(kernel)["x"]
    ref_q, ref_s = reference.per_token(a1)
    assert x.dtype == torch.float8_e4m3fn and scales.shape == (64, 1)
    assert torch.equal(x.view(torch.uint8), ref_q.view(torch.uint8)) and torch.equal(scales, ref_s)
    received = kernel.fused_experts.received[-1]
    assert received["x"] is x and received["scale"].shape == (
        64,
        1,
    )  # as sent: no second quantization


def test_static_per_tensor_fp8_goes_bare_and_reaches_the_experts_as_vllms_own_path_would(
    vllm_env, tmp_path, monkeypatch
):
    path = plan_file(tmp_path, "amd/Mixtral-8x7B-Instruct-v0.1-FP8-KV")
    model = "amd/Mixtral-8x7B-Instruct-v0.1-FP8-KV"
    manager = start(monkeypatch, path, model=model)
    kernel = layer(manager, monkeypatch, scheme="static", hidden=4096, tokens_across_dp=[16, 16])
    assert type(kernel.fused_experts).__name__ == "FlashInferExperts"
    h.run_kernel(kernel, 16, 4096, seed=3)
    sent, received = h.dispatched(kernel), kernel.fused_experts.received[-1]
    assert sent["wire"] == ("torch.float8_e4m3fn", None)  # bare fp8: no scales on the wire
    h.uninstall_plugin()  # vLLM's own path, same layer and input
    plain = start(monkeypatch, None, model=model)
    own = layer(plain, monkeypatch, scheme="static", hidden=4096, tokens_across_dp=[16, 16])
    h.run_kernel(own, 16, 4096, seed=3)
    assert h.dispatched(own)["wire"] == ("torch.bfloat16", None)
    vllm_received = own.fused_experts.received[-1]
    assert torch.equal(received["x"].view(torch.uint8), vllm_received["x"].view(torch.uint8))
    assert torch.equal(received["scale"], vllm_received["scale"])


def test_bf16_for_a_block_layer_is_quantized_on_receive(vllm_env, tmp_path, monkeypatch):
    def bf16(doc):
        for entry in doc["layers"]:
            if entry["kind"] == "moe":
                entry.update(order="dispatch_then_quant", wire={"dtype": "bf16"})

    path = plan_file(tmp_path, "DeepSeek-V3", expert_kernel="deepgemm", mutate=bf16)
    h.cuda_platform(monkeypatch, flashinfer=False, deep_gemm=True)
    manager = start(monkeypatch, path, model=DEEPSEEK)
    kernel = layer(manager, monkeypatch, hidden=7168, tokens_across_dp=[32, 32])
    h.run_kernel(kernel, 32, 7168)
    assert h.dispatched(kernel)["wire"] == ("torch.bfloat16", None)
    received = kernel.fused_experts.received[-1]
    assert received["x"].dtype == torch.float8_e4m3fn and received["scale"].shape == (32, 56)


def test_experts_other_than_the_policys_leave_the_layer_to_vllm(
    vllm_env, tmp_path, monkeypatch, caplog
):
    """A policy made for FlashInfer's experts, on a node without FlashInfer (vLLM builds
    TritonOrDeepGemmExperts): vLLM's own wire, and the summary says why."""
    path = plan_file(tmp_path, "Qwen3-30B-A3B-FP8")
    h.cuda_platform(monkeypatch, flashinfer=False, deep_gemm=True)
    manager = start(monkeypatch, path)
    kernel = layer(manager, monkeypatch, tokens_across_dp=[8, 8])
    h.run_kernel(kernel, 8, 2048)
    assert h.dispatched(kernel)["wire"] == ("torch.float8_e4m3fn", 16)  # vLLM's block fp8 first
    summary = next(m for m in messages(caplog, logging.INFO) if "applied (digest" in m)
    assert (
        "0/1 MoE layers applied; 1 left to vLLM: the policy was made for flashinfer_cutlass experts; "
        "vLLM runs TritonOrDeepGemmExperts" in summary
    )
    # which experts vLLM built, beside the kernel the policy was made for
    assert summary.endswith(
        "vLLM built TritonOrDeepGemmExperts (the policy's expert kernel: flashinfer_cutlass)"
    ), summary


# -------------------------------------------------------------------------------- layers by module prefix
def test_layers_are_matched_by_prefix_and_what_the_policy_lacks_is_left_to_vllm(
    vllm_env, tmp_path, monkeypatch, caplog
):
    path = plan_file(tmp_path, "DeepSeek-V3", expert_kernel="deepgemm")
    h.cuda_platform(monkeypatch, flashinfer=False, deep_gemm=True)
    manager = start(monkeypatch, path, model=DEEPSEEK)
    moe = h.moe_config(7168, 2)
    prefixes = [
        "model.layers.3.mlp.experts",
        "model.layers.61.mlp.experts",  # the MTP layer, named by vLLM with its own index
        "language_model.model.layers.4.mlp.experts",
        "draft_model.model.layers.0.mlp.experts",
        "model.layers.99.mlp.experts",
        "mtp.layers.1.mlp.experts",
    ]
    kernels = {p: h.make_kernel(manager, monkeypatch, "block", moe) for p in prefixes}
    h.forward_context(monkeypatch, kernels, tokens_across_dp=[8, 8])
    for kernel in kernels.values():
        h.run_kernel(kernel, 8, 7168)
    tables = {p: k.prepare_finalize._moepolicy_table for p, k in kernels.items()}
    applied = {p for p, t in tables.items() if all(b.action.applied for b in t.bucket_actions)}
    assert applied == {
        "model.layers.3.mlp.experts",
        "model.layers.61.mlp.experts",
        "language_model.model.layers.4.mlp.experts",
    }
    summary = next(m for m in messages(caplog, logging.INFO) if "applied (digest" in m)
    assert "3/6 MoE layers applied; 3 left to vLLM" in summary and "draft model" in summary
    assert (
        "does not hold as a MoE layer" in summary
        and "an MTP module the policy does not hold" in summary
    )


def test_policy_layer_lookup_raises_for_an_index_it_does_not_hold(tmp_path):
    from moepolicy import load_policy
    from moepolicy.errors import PolicyError

    policy = load_policy(plan_file(tmp_path, "DeepSeek-V3"))
    assert policy.get(99) is None
    with pytest.raises(PolicyError, match="layer 99 is not in this policy"):
        policy.layer(99)


# ------------------------------------------------------------------------------------------------- DBO
def _dbo(monkeypatch, ubatch):
    """vLLM's DBO state as the ubatch threads see it: on, and this thread's micro-batch id."""
    from moepolicy.integrations.vllm import classes
    from vllm.model_executor.layers.fused_moe import modular_kernel
    from vllm.model_executor.layers.fused_moe.prepare_finalize import deepep_ht

    for module in (classes, deepep_ht, modular_kernel):
        monkeypatch.setattr(module, "dbo_enabled", lambda: True, raising=False)
        monkeypatch.setattr(module, "dbo_current_ubatch_id", lambda: ubatch[0], raising=False)
    for name in (
        "dbo_get_previous_event",
        "dbo_yield_and_switch_from_compute_to_comm",
        "dbo_switch_to_compute_sync",
        "dbo_switch_to_comm",
        "dbo_switch_to_compute",
        "dbo_yield_and_switch_from_comm_to_compute",
        "_dbo_record_stream",
    ):
        monkeypatch.setattr(deepep_ht, name, lambda *a, **k: None)
    for name in ("dbo_maybe_run_recv_hook", "dbo_register_recv_hook", "dbo_yield"):
        monkeypatch.setattr(modular_kernel, name, lambda *a, **k: None)


def test_dbo_micro_batches_use_vllms_sm_split_and_their_own_buckets(
    vllm_env, tmp_path, monkeypatch
):
    def overlapped(doc):
        with_buckets(doc)
        doc["deepep"]["schedule"] = "overlapped"

    path = plan_file(tmp_path, "Qwen3-30B-A3B-FP8", mutate=overlapped)
    monkeypatch.setenv("VLLM_DBO_COMM_SMS", "16")
    manager = start(monkeypatch, path, dbo=True)
    assert manager._moepolicy.applied
    kernel = layer(manager, monkeypatch, moe_backend="flashinfer_cutlass")
    ubatch = [0]
    _dbo(monkeypatch, ubatch)
    impl, pf = kernel.impl, kernel.prepare_finalize
    results = {}
    for ub, tokens in ((0, 64), (1, 2000)):  # both micro-batches dispatch before either combines
        ubatch[0] = ub
        h.forward_context(
            monkeypatch, {"model.layers.3.mlp.experts": kernel}, tokens_across_dp=[tokens, tokens]
        )
        a1 = torch.randn(tokens, 2048).to(torch.bfloat16)
        ids, weights = torch.randint(0, 8, (tokens, 2)), torch.rand(tokens, 2)
        results[ub] = (a1, ids, weights, impl._prepare(a1, weights, ids, 8, None, False))
    for ub in (0, 1):
        ubatch[0] = ub
        a1, ids, weights, prepared = results[ub]
        impl._finalize(
            torch.empty_like(a1),
            prepared[0].to(torch.bfloat16),
            a1,
            weights,
            ids,
            False,
            None,
            None,
        )
    dispatched = [d["config"].key() for d in pf.buffer.dispatched[-2:]]
    combined = [c["config"].key() for c in pf.buffer.combined[-2:]]
    for tokens, d, c in zip((64, 2000), dispatched, combined):
        dispatch, combine = bucket_chunks(path, tokens)
        assert d == (16, *effective(dispatch)) and c == (
            16,
            *effective(combine),
        )  # vLLM's split: 16 SMs


def test_a_serial_policy_under_dbo_applies_its_decisions_with_vllms_deepep_settings(
    vllm_env, tmp_path, monkeypatch, caplog
):
    """A tuning-key mismatch (the schedule): the decisions apply, DeepEP's settings stay vLLM's."""
    path = plan_file(tmp_path, "Qwen3-30B-A3B-FP8", mutate=with_buckets)
    manager = start(monkeypatch, path, dbo=True)
    run = manager._moepolicy
    assert run.applied and not run.plan.sets_deepep and manager.num_sms == 20
    kernel = layer(manager, monkeypatch, moe_backend="flashinfer_cutlass")
    h.run_kernel(kernel, 16, 2048)
    assert h.dispatched(kernel)["config"].key() == h.Buffer.get_dispatch_config(2).key()
    line = next(m for m in messages(caplog, logging.INFO) if "applied (digest" in m)
    assert "DeepEP's settings left to vLLM" in line
    assert "engine runs overlapped; policy tuned for serial" in line


def test_ubatch_size_2_micro_batches_as_dbo_does(vllm_env, tmp_path, monkeypatch, caplog):
    """vLLM micro-batches when enable_dbo or --ubatch-size > 1 (ParallelConfig.use_ubatching), under
    the same SM split: a serial policy keeps only its decisions there, an overlapped one gets vLLM's
    split (taken for serial, the policy's full SM count would reach DeepEP)."""
    path = plan_file(tmp_path, "Qwen3-30B-A3B-FP8", mutate=with_buckets)
    manager = start(monkeypatch, path, ubatch_size=2)
    assert manager._moepolicy.applied and not manager._moepolicy.plan.sets_deepep
    assert manager.num_sms == 20
    h.uninstall_plugin()

    def overlapped(doc):
        with_buckets(doc)
        doc["deepep"]["schedule"] = "overlapped"

    monkeypatch.setenv("VLLM_DBO_COMM_SMS", "16")
    path = plan_file(tmp_path, QWEN, mutate=overlapped, name="overlapped.yaml")
    manager = start(monkeypatch, path, ubatch_size=2)
    assert manager._moepolicy.applied and manager._moepolicy.plan.dbo_num_sms == 16
    assert manager.num_sms == 24
    h.uninstall_plugin()
    serial = start(monkeypatch, path, ubatch_size=1)  # one micro-batch: serial
    assert not serial._moepolicy.plan.sets_deepep  # the overlapped policy's schedule mismatches


def test_internode_runs_the_policys_rdma_buffer_and_qps(vllm_env, tmp_path, monkeypatch):
    """EP 16 over two nodes of 8 GPUs: vLLM's manager says internode; the buffer vLLM builds gets
    the policy's RDMA bytes and QPs for its SM count (vLLM's own: its buffer size, num_sms // 2)."""
    from moepolicy import load_policy
    from moepolicy.integrations.vllm.classes import internode_qps

    def internode_buckets(doc):
        with_buckets(doc)
        doc["deepep"]["num_rdma_bytes"] = 2**30

    path = plan_file(tmp_path, QWEN, ep=16, mutate=internode_buckets)
    policy = load_policy(path)
    assert policy.target is not None and policy.deepep.num_rdma_bytes
    manager = start(monkeypatch, path, ep=16)
    assert manager.internode and manager._moepolicy.applied, manager._moepolicy.reason
    kwargs = manager._make_all2all_kwargs()
    assert kwargs["num_rdma_bytes"] == policy.deepep.num_rdma_bytes
    assert kwargs["num_qps_per_rank"] == internode_qps(24, None) == 12
    assert kwargs["num_nvl_bytes"] == policy.deepep.num_nvl_bytes


def test_a_one_node_policy_served_across_nodes_is_not_applied(
    vllm_env, tmp_path, monkeypatch, caplog
):
    """The layout is vLLM's (manager.internode), not inferred from the policy's own GPUs per node:
    EP 8 planned for one node of 8 and served on two nodes of 4 keeps vLLM's behaviour."""
    path = plan_file(tmp_path, QWEN, ep=8)
    manager = start(monkeypatch, path, ep=8, gpus_per_node=4)
    assert manager.internode and not manager._moepolicy.applied
    kwargs = manager._make_all2all_kwargs()
    assert kwargs["num_qps_per_rank"] == manager.num_sms // 2  # vLLM's own
    refused = [m for m in messages(caplog, logging.WARNING) if "not applied" in m]
    assert len(refused) == 1 and "ep_layout: mismatched (the engine runs internode" in refused[0]


def test_a_tuning_mismatch_applies_the_decisions_and_leaves_deepep_to_vllm(
    vllm_env, tmp_path, monkeypatch, caplog
):
    """What validate predicts for a tuning-key mismatch is what the plugin does: the layers' orders
    apply; DeepEP's SM count, buffers and configs stay vLLM's (DeepEP's defaults)."""
    from moepolicy.runtime.outcome import DECISIONS_ONLY, predict

    def tuned_for_h100(doc):
        with_buckets(doc)
        doc["target"]["gpu"] = "h100"

    path = plan_file(tmp_path, "amd/Mixtral-8x7B-Instruct-v0.1-FP8-KV", mutate=tuned_for_h100)
    monkeypatch.setattr("moepolicy.hardware.nvml_gpus", lambda: ["NVIDIA H200"])
    assert predict(path).state == DECISIONS_ONLY
    manager = start(monkeypatch, path, model="amd/Mixtral-8x7B-Instruct-v0.1-FP8-KV")
    run = manager._moepolicy
    assert run.applied and not run.plan.sets_deepep, run.reason
    assert manager.num_sms == 20
    assert (
        manager._make_all2all_kwargs() == super(type(manager), manager)._make_all2all_kwargs()
    )  # vLLM's buffer
    kernel = layer(manager, monkeypatch, scheme="static", hidden=4096)
    h.run_kernel(kernel, 16, 4096)
    sent = h.dispatched(kernel)
    assert sent["x"][0].dtype == torch.float8_e4m3fn  # the policy's order: fp8 before dispatch
    assert sent["config"].key() == h.Buffer.get_dispatch_config(2).key()  # vLLM's (DeepEP's table)
    line = next(m for m in messages(caplog, logging.INFO) if "applied (digest" in m)
    assert "DeepEP's settings left to vLLM" in line and "gpu: mismatched" in line


def test_sequence_parallel_moe_buckets_on_the_local_sizes(vllm_env, tmp_path, monkeypatch):
    from vllm.forward_context import DPMetadata

    path = plan_file(tmp_path, "Qwen3-30B-A3B-FP8", mutate=with_buckets)
    manager = start(monkeypatch, path)
    kernel = layer(manager, monkeypatch, moe_backend="flashinfer_cutlass")
    dp = DPMetadata(torch.tensor([2000, 2000]))
    with dp.sp_local_sizes(
        4
    ):  # vLLM's own split: each of 4 SP ranks holds ceil(2000 / 4) = 500 tokens
        h.forward_context(
            monkeypatch,
            {"model.layers.3.mlp.experts": kernel},
            tokens_across_dp=[2000, 2000],
            local_sizes=dp.local_sizes,
        )
        h.run_kernel(kernel, 500, 2048)
    assert h.dispatched(kernel)["config"].key() == (24, *effective(bucket_chunks(path, 500)[0]))
    assert bucket_chunks(path, 500) != bucket_chunks(path, 2000)


def test_dp_metadata_it_cannot_read_takes_the_largest_bucket_on_every_rank(
    vllm_env, tmp_path, monkeypatch, caplog
):
    """Another vLLM's DP metadata (here: no token counts) must not fail the forward pass nor let the
    ranks pick different buckets: every rank takes the policy's last bucket, said once."""
    path = plan_file(tmp_path, "Qwen3-30B-A3B-FP8", mutate=with_buckets)
    manager = start(monkeypatch, path)
    kernel = layer(manager, monkeypatch, moe_backend="flashinfer_cutlass")
    ctx = h.forward_context(monkeypatch, {"model.layers.3.mlp.experts": kernel}, [100, 100])
    ctx.dp_metadata = types.SimpleNamespace(local_sizes=None)  # no num_tokens_across_dp_cpu
    h.run_kernel(kernel, 100, 2048)
    largest = bucket_chunks(path, 10**9)
    assert largest != bucket_chunks(path, 100)
    assert h.dispatched(kernel)["config"].key() == (24, *effective(largest[0]))
    said = [m for m in messages(caplog, logging.WARNING) if "token counts across DP" in m]
    assert len(said) == 1 and "largest token bucket" in said[0]


# --------------------------------------------------------------------------------- agreement and state
def test_a_rank_that_would_not_apply_makes_every_rank_keep_vllms_behaviour(
    vllm_env, tmp_path, monkeypatch, caplog
):
    path = plan_file(tmp_path, "Qwen3-30B-A3B-FP8", mutate=with_buckets)
    group = h.CpuGroup(2, peer_vote={"applied": False, "digest": "", "reason": "no such file"})
    manager = start(monkeypatch, path, group=group)
    assert not manager._moepolicy.applied and manager.num_sms == 20
    assert (
        manager._make_all2all_kwargs()["num_nvl_bytes"] == 1024 * 1024 * 1024
    )  # VLLM_DEEPEP_BUFFER_SIZE_MB
    kernel = layer(
        manager, monkeypatch, moe_backend="flashinfer_cutlass", tokens_across_dp=[100, 100]
    )
    h.run_kernel(kernel, 100, 2048)
    assert (
        h.dispatched(kernel)["config"].key() == h.Buffer.get_dispatch_config(2).key()
    )  # vLLM's table
    assert any(
        "rank(s) 1 of 2 would not apply it (rank 1: no such file)" in m for m in messages(caplog)
    )


def test_ranks_with_different_digests_all_keep_vllms_behaviour(
    vllm_env, tmp_path, monkeypatch, caplog
):
    path = plan_file(tmp_path, "Qwen3-30B-A3B-FP8")
    group = h.CpuGroup(2, peer_vote={"applied": True, "digest": "0123456789abcdef"})
    manager = start(monkeypatch, path, group=group)
    assert not manager._moepolicy.applied
    assert any("the ranks do not agree: the ranks' digests differ" in m for m in messages(caplog))
    votes = group.gathered[-1]
    assert votes[0]["digest"] == manager._moepolicy.digest and len(votes[0]["digest"]) == 16


def test_a_recreated_manager_starts_afresh(vllm_env, tmp_path, monkeypatch):
    path = plan_file(tmp_path, "Qwen3-30B-A3B-FP8", mutate=with_buckets)
    first = start(monkeypatch, path)
    assert first.num_sms == 24 and first._moepolicy.applied
    h.parallel_state(monkeypatch, 4)  # elastic EP: the group grows to 4 ranks, the policy is for 2
    from vllm.distributed.device_communicators import all2all

    second = all2all.DeepEPHTAll2AllManager(h.CpuGroup(4))
    # EP 4 against a policy for EP 2: a tuning-key mismatch, so the decisions only
    assert second._moepolicy is not first._moepolicy and not second._moepolicy.plan.sets_deepep
    assert (
        second.num_sms == 20
        and second._make_all2all_kwargs()["num_nvl_bytes"] == 1024 * 1024 * 1024
    )
    third = all2all.DeepEPHTAll2AllManager(h.CpuGroup(2))
    assert third._moepolicy.applied and third.num_sms == 24


def test_internode_qps_fit_both_sm_counts():
    from moepolicy.integrations.vllm.classes import internode_qps

    def ok(qps, sms):  # DeepEP's internode assert (internode.cu, notes §4)
        return qps == sms // 2 or qps >= sms

    for num_sms, dbo in ((24, None), (24, 20), (48, 20), (32, 32), (20, 16)):
        qps = internode_qps(num_sms, dbo)
        assert ok(qps, num_sms) and (dbo is None or ok(qps, dbo)), (num_sms, dbo, qps)


# ---------------------------------------------------------------------------------------- strict
def test_strict_refuses_an_unchecked_vllm_release(vllm_env, tmp_path, monkeypatch):
    from moepolicy.errors import PolicyError
    from moepolicy.integrations.vllm import patches

    real = importlib.metadata.version
    monkeypatch.setattr(
        patches.importlib.metadata, "version", lambda n: "0.35.0" if n == "vllm" else real(n)
    )
    with pytest.raises(PolicyError, match=r"vLLM 0.35.0 is not a release .*\(0.33.x or 0.34.x\)"):
        patches.install(str(plan_file(tmp_path, "Qwen3-30B-A3B-FP8")), strict=True)


def test_strict_refuses_source_drift(vllm_env, tmp_path, monkeypatch):
    from moepolicy.errors import PolicyError
    from moepolicy.integrations.vllm import patches, pins

    table = pins.PINNED[pins.release_of(importlib.metadata.version("vllm"))]
    monkeypatch.setitem(table, next(iter(table)), "0" * 16)
    with pytest.raises(PolicyError, match="DeepEPHTPrepareAndFinalize.__init__ differ"):
        patches.install(str(plan_file(tmp_path, "Qwen3-30B-A3B-FP8")), strict=True)


def test_strict_refuses_when_vllms_deepep_modules_do_not_import(vllm_env, tmp_path, monkeypatch):
    from moepolicy.errors import PolicyError
    from moepolicy.integrations.vllm import patches

    import moepolicy.integrations.vllm as plugin

    monkeypatch.delattr(plugin, "classes", raising=False)
    monkeypatch.setitem(
        sys.modules, "moepolicy.integrations.vllm.classes", None
    )  # as if deep_ep were missing
    with pytest.raises(PolicyError, match="DeepEP modules do not import"):
        patches.install(str(plan_file(tmp_path, "Qwen3-30B-A3B-FP8")), strict=True)


@pytest.mark.parametrize(
    "branch",
    [
        "cudagraphs",
        "key mismatch",
        "no buffer sizes",
        "other backend",
        "unknown keys",
        "ranks disagree",
        "load error",
        "serial policy under dbo",
    ],
)
def test_strict_refuses_every_not_applied_branch_at_start(vllm_env, tmp_path, monkeypatch, branch):
    from moepolicy.errors import PolicyError

    path = plan_file(tmp_path, "Qwen3-30B-A3B-FP8")
    kwargs, group = {}, h.CpuGroup(2)
    if branch == "cudagraphs":
        kwargs["cudagraph_mode"] = types.SimpleNamespace(name="FULL_AND_PIECEWISE")
    elif branch == "key mismatch":
        kwargs["model"] = DEEPSEEK
    elif branch == "no buffer sizes":
        import moepolicy

        real = moepolicy.load_policy

        def no_buffers(*a, **k):
            policy = real(*a, **k)
            policy.deepep = type(policy.deepep)(
                **{**policy.deepep.__dict__, "num_nvl_bytes": None}
            )
            return policy

        monkeypatch.setattr(moepolicy, "load_policy", no_buffers)
    elif branch == "other backend":
        path = plan_file(
            tmp_path, "Qwen3-30B-A3B-FP8", name="v2.yaml", deep_ep_version="v2-dd758ca"
        )
    elif branch == "unknown keys":
        path = plan_file(
            tmp_path,
            "Qwen3-30B-A3B-FP8",
            name="x.yaml",
            mutate=lambda d: d["target"].update(extra_key=1),
        )
    elif branch == "ranks disagree":
        group = h.CpuGroup(2, peer_vote={"applied": False, "reason": "strict elsewhere"})
    elif branch == "load error":
        path.write_text("not: [a policy")
    elif branch == "serial policy under dbo":
        kwargs["dbo"] = True
    with pytest.raises(PolicyError, match="MOEPOLICY_STRICT"):
        start(monkeypatch, path, strict=True, group=group, **kwargs)


def test_strict_refuses_deepep_v2_source_drift_when_vllm_builds_a_v2_manager(
    vllm_env, tmp_path, monkeypatch
):
    from moepolicy.errors import PolicyError
    from moepolicy.integrations.vllm import pins

    h.with_deep_ep_v2(monkeypatch)
    table = pins.PINNED_V2[pins.release_of(importlib.metadata.version("vllm"))]
    monkeypatch.setitem(table, next(iter(table)), "0" * 16)
    path = plan_file(tmp_path, "Qwen3-30B-A3B-FP8", deep_ep_version="v2-dd758ca")
    with pytest.raises(
        PolicyError,
        match="MOEPOLICY_STRICT: DeepEP v2: vLLM's deepep_v2.DeepEPV2PrepareAndFinalize",
    ):
        start(monkeypatch, path, strict=True, backend="v2")
    from vllm.distributed.device_communicators import all2all

    assert (
        all2all.DeepEPHTAll2AllManager.__name__ == "PolicyDeepEPHTAll2AllManager"
    )  # HT is still installed


def test_strict_refuses_policy_layers_left_to_vllm_at_the_first_dispatch(
    vllm_env, tmp_path, monkeypatch
):
    from moepolicy.errors import PolicyError

    path = plan_file(tmp_path, "Qwen3-30B-A3B-FP8")
    h.cuda_platform(monkeypatch, flashinfer=False, deep_gemm=True)
    manager = start(monkeypatch, path, strict=True)
    kernel = layer(manager, monkeypatch, tokens_across_dp=[8, 8])
    with pytest.raises(PolicyError, match="MOEPOLICY_STRICT: policy layers left to vLLM"):
        h.run_kernel(kernel, 8, 2048)


@pytest.mark.parametrize(
    "value, strict",
    [
        ("1", True),
        ("TRUE", True),
        ("yes", True),
        ("On", True),
        ("0", False),
        ("false", False),
        ("", False),
        ("off", False),
    ],
)
def test_strict_accepts_the_usual_spellings(value, strict):
    from moepolicy.integrations.vllm import strict_from_env

    assert strict_from_env({"MOEPOLICY_STRICT": value}) is strict


def test_strict_refuses_another_spelling_in_one_line(monkeypatch, tmp_path):
    env = {
        **os.environ,
        "MOEPOLICY_POLICY": str(tmp_path / "p.yaml"),
        "MOEPOLICY_STRICT": "maybe\x1b[2J",
    }
    code = "from moepolicy.integrations.vllm import register; register()"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode != 0
    assert (
        "MOEPOLICY_STRICT='maybe\\x1b[2J' is not one of 1/true/yes/on or 0/false/no/off"
        in out.stderr
    )
    assert "\x1b" not in out.stderr


# ------------------------------------------------------------------------------ the served model's facts
def _hf_cache(tmp_path, repo_id, config):
    """A Hugging Face cache holding ``repo_id``'s config.json, laid out as huggingface_hub writes it."""
    cache = tmp_path / "hub"
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    blob = repo / "blobs" / "c0ffee"
    blob.parent.mkdir()
    blob.write_text(json.dumps(config))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").symlink_to(blob)
    return cache


def test_a_non_catalog_hugging_face_id_served_from_the_hf_cache_applies(
    vllm_env, tmp_path, monkeypatch
):
    folder = per_token_checkpoint(tmp_path, name="acme-qwen3-ft")
    path = plan_file(tmp_path, folder)
    config = json.loads((folder / "config.json").read_text())
    cache = _hf_cache(tmp_path, "acme/qwen3-moe-finetune", config)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    manager = start(monkeypatch, path, model="acme/qwen3-moe-finetune")
    assert manager._moepolicy.applied, manager._moepolicy.reason
    assert manager._moepolicy.facts.model.folder.startswith(str(cache))


def test_without_the_cache_the_same_id_is_not_applied_and_says_why(
    vllm_env, tmp_path, monkeypatch, caplog
):
    folder = per_token_checkpoint(tmp_path, name="acme-qwen3-ft")
    path = plan_file(tmp_path, folder)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    manager = start(monkeypatch, path, model="acme/qwen3-moe-finetune")
    assert (
        not manager._moepolicy.applied and "model could not be read" in manager._moepolicy.reason
    )


def test_the_config_vllm_loaded_is_used_when_no_folder_holds_it(vllm_env, tmp_path, monkeypatch):
    folder = per_token_checkpoint(tmp_path, name="acme-qwen3-ft")
    path = plan_file(tmp_path, folder)
    config = json.loads((folder / "config.json").read_text())
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    hf_config = types.SimpleNamespace(
        to_dict=lambda: dict(config)
    )  # what transformers' PretrainedConfig gives
    manager = start(monkeypatch, path, model="s3://bucket/acme-qwen3", hf_config=hf_config)
    assert manager._moepolicy.applied, manager._moepolicy.reason


# ------------------------------------------------------------------------------------------------ logging
def test_applied_is_said_once_at_the_first_dispatch_and_never_without_one(
    vllm_env, tmp_path, monkeypatch, caplog
):
    path = plan_file(tmp_path, "Qwen3-30B-A3B-FP8")
    manager = start(monkeypatch, path)
    assert not [
        m for m in messages(caplog, logging.INFO) if "applied (digest" in m
    ]  # no dispatch yet
    kernel = layer(manager, monkeypatch, moe_backend="flashinfer_cutlass", tokens_across_dp=[8, 8])
    for _ in range(3):
        h.run_kernel(kernel, 8, 2048)
    said = [m for m in messages(caplog, logging.INFO) if "applied (digest" in m]
    assert len(said) == 1 and manager._moepolicy.digest in said[0]


def test_the_plugin_logs_through_vllms_handler_once():
    """With vLLM's logging configured (as ``vllm serve`` does), each line appears once, in vLLM's format."""
    code = (
        "from vllm.logger import _configure_vllm_root_logger; _configure_vllm_root_logger()\n"
        "from moepolicy.integrations.vllm import report\n"
        "report.say('one summary'); report.warn('one refusal'); report.debug('a detail')\n"
    )
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "INFO", "VLLM_CONFIGURE_LOGGING": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    lines = [line for line in (out.stdout + out.stderr).splitlines() if "moepolicy:" in line]
    assert len(lines) == 2, out.stdout + out.stderr
    assert (
        "INFO" in lines[0] and "one summary" in lines[0] and "WARNING" in lines[1]
    )  # vLLM's format: the level


def test_policy_text_reaches_the_log_escaped(vllm_env, tmp_path, monkeypatch, caplog):
    hostile = "evil\x1b]0;pwned\x07\u202egpj.exe\nINFO fake line"
    path = plan_file(
        tmp_path, "Qwen3-30B-A3B-FP8", mutate=lambda d: d["model"].update(name=hostile)
    )
    start(
        monkeypatch, path, model=DEEPSEEK
    )  # a facts mismatch: the reason names the policy's model
    lines = messages(caplog)
    refused = next(m for m in lines if "not applied" in m)
    assert "\\x1b]0;pwned\\x07\\u202egpj.exe\\nINFO fake line" in refused
    assert not any(c in m for m in lines for c in ("\x1b", "\x07", "\u202e", "\n"))


def test_the_entry_point_does_nothing_without_the_variable_outside_vllm():
    from importlib.metadata import entry_points

    assert any(
        ep.value == "moepolicy.integrations.vllm:register"
        for ep in entry_points(group="vllm.general_plugins")
    )
    code = (
        "import sys; from moepolicy.integrations.vllm import register; register(); "
        "print('torch' in sys.modules, 'vllm' in sys.modules)"
    )
    env = {k: v for k, v in os.environ.items() if k != "MOEPOLICY_POLICY"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.stdout.split() == ["False", "False"], out.stderr


def test_without_the_variable_even_inside_vllm_nothing_is_installed():
    """A moepolicy installed into vLLM's environment but not asked for changes nothing, also in a
    process where vLLM is imported: vLLM's own classes stay in place."""
    code = (
        "import vllm.distributed.device_communicators.all2all as a; before = a.DeepEPHTAll2AllManager; "
        "from moepolicy.integrations.vllm import register; register(); "
        "print(a.DeepEPHTAll2AllManager is before, 'moepolicy.integrations.vllm.patches' in __import__('sys').modules)"
    )
    env = {k: v for k, v in os.environ.items() if k != "MOEPOLICY_POLICY"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.stdout.split()[-2:] == ["True", "False"], out.stderr[-2000:]


# ----------------------------------------------------------------------------- two ranks over gloo
def _two_ranks(tmp_path, policies, vote_timeout_s=None):
    script = Path(__file__).parent / "vllm_two_ranks.py"
    init = tmp_path / "gloo-init"
    procs, outs = [], []
    for rank, (policy, local) in enumerate(zip(policies, (100, 3000))):
        out = tmp_path / f"rank{rank}.json"
        outs.append(out)
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    str(script),
                    str(rank),
                    str(init),
                    str(policy),
                    str(out),
                    str(local),
                    *([] if vote_timeout_s is None else [str(vote_timeout_s)]),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    logs = [p.communicate(timeout=500)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-3000:] for log in logs)
    return [json.loads(out.read_text()) for out in outs]


@pytest.mark.slow
def test_two_ranks_over_gloo_apply_equal_configs_and_wire(vllm_env, tmp_path):
    path = plan_file(tmp_path, "Qwen3-30B-A3B-FP8", mutate=with_buckets)
    ranks = _two_ranks(tmp_path, [path, path])
    assert all(r["applied"] for r in ranks) and ranks[0]["digest"] == ranks[1]["digest"]
    assert (
        ranks[0]["dispatch"]
        == ranks[1]["dispatch"]
        == [24, *effective(bucket_chunks(path, 3000)[0])]
    )
    assert ranks[0]["wire"] == ranks[1]["wire"] == ["torch.bfloat16", None]
    assert ranks[0]["combine"] == ranks[1]["combine"]


@pytest.mark.slow
def test_over_gloo_a_rank_with_another_policy_makes_both_keep_vllms_behaviour(vllm_env, tmp_path):
    mine = plan_file(tmp_path, "Qwen3-30B-A3B-FP8", mutate=with_buckets)
    other = plan_file(
        tmp_path, "Qwen3-30B-A3B-FP8", name="other.yaml"
    )  # DeepEP's defaults at 20 SMs
    ranks = _two_ranks(tmp_path, [mine, other])
    assert not any(r["applied"] for r in ranks) and all(r["num_sms"] == 20 for r in ranks)
    assert "digests differ" in ranks[0]["reason"]
    assert (
        ranks[0]["dispatch"] == ranks[1]["dispatch"] == list(h.Buffer.get_dispatch_config(2).key())
    )


@pytest.mark.slow
def test_over_gloo_a_rank_without_the_plugin_leaves_both_on_vllms_behaviour(vllm_env, tmp_path):
    """Rank 1 has no plugin (MOEPOLICY_POLICY unset there): it casts no vote and goes straight to
    DeepEP, whose stand-in exchanges the Config over the same gloo group. Rank 0 waits for the vote
    through the group's store, gives up and keeps vLLM's behaviour, so both hand DeepEP the same
    Config; a vote sent as a collective would have met rank 1's exchange instead."""
    mine = plan_file(tmp_path, "Qwen3-30B-A3B-FP8", mutate=with_buckets)
    ranks = _two_ranks(tmp_path, [mine, "none"], vote_timeout_s=5)
    assert ranks[0]["plugin"] and not ranks[1]["plugin"]
    assert (
        not ranks[0]["applied"] and "rank(s) 1 of 2 had not voted within 5 s" in ranks[0]["reason"]
    )
    assert ranks[0]["num_sms"] == ranks[1]["num_sms"] == 20
    assert (
        ranks[0]["dispatch"] == ranks[1]["dispatch"] == list(h.Buffer.get_dispatch_config(2).key())
    )


# ------------------------------------------------------------------------------------------- DeepEP v2
def test_a_v2_policy_reaches_vllms_deepep_v2_path(vllm_env, tmp_path, monkeypatch, caplog):
    """vLLM 0.33 builds FlashInfer CUTLASS experts for block fp8 on deepep_v2 (SM90); 0.34's v2 path
    hands PaddedStandard rows, which those refuse, and its oracle builds TritonExperts there: a v2
    policy names the experts of the release it is planned for (the expert sheet records 0.33's pick,
    so for 0.34 it is planned with --expert-kernel triton)."""
    from moepolicy.integrations.vllm import pins

    def settings(doc):
        doc["deepep"]["v2"] = {
            "num_sms": 24,
            "prefer_overlap_with_compute": False,
            "allow_multiple_reduction": False,
        }

    release = pins.release_of(importlib.metadata.version("vllm"))
    built, asked = {"0.33": ("FlashInferExperts", None), "0.34": ("TritonExperts", "triton")}[
        release
    ]
    h.with_deep_ep_v2(monkeypatch)
    path = plan_file(
        tmp_path,
        "Qwen3-30B-A3B-FP8",
        deep_ep_version="v2-dd758ca",
        mutate=settings,
        expert_kernel=asked,
    )
    manager = start(monkeypatch, path, backend="v2")
    assert (
        type(manager).__name__ == "PolicyDeepEPV2All2AllManager" and manager._moepolicy.applied
    ), manager._moepolicy.reason
    kernel = h.make_kernel(
        manager, monkeypatch, "block", h.moe_config(2048, 2, all2all_backend="deepep_v2")
    )
    h.forward_context(
        monkeypatch, {"model.layers.3.mlp.experts": kernel}, tokens_across_dp=[16, 16]
    )
    assert type(kernel.prepare_finalize).__name__ == "PolicyDeepEPV2PrepareAndFinalize"
    assert type(kernel.fused_experts).__name__ == built
    h.run_kernel(kernel, 16, 2048)
    buffer = h.ElasticBuffer.instances[-1]
    assert (
        buffer.kwargs["prefer_overlap_with_compute"] is False
        and buffer.kwargs["allow_multiple_reduction"] is False
    )
    assert (
        buffer.dispatched[-1]["num_sms"] == 24
    )  # vLLM alone passes none (DeepEP's analytical count)
    assert manager.max_sms_used() == 24  # what vLLM's DBO split reads
    assert any("1/1 MoE layers applied" in m for m in messages(caplog, logging.INFO))


def test_on_v2_a_block_layer_may_go_bf16_and_is_quantized_on_receive(
    vllm_env, tmp_path, monkeypatch
):
    def bf16(doc):
        for entry in doc["layers"]:
            if entry["kind"] == "moe":
                entry.update(order="dispatch_then_quant", wire={"dtype": "bf16"})

    h.with_deep_ep_v2(monkeypatch)
    h.cuda_platform(monkeypatch, flashinfer=False, deep_gemm=True)
    path = plan_file(
        tmp_path,
        "DeepSeek-V3",
        deep_ep_version="v2-dd758ca",
        expert_kernel="deepgemm",
        mutate=bf16,
    )
    manager = start(monkeypatch, path, model=DEEPSEEK, backend="v2")
    assert manager._moepolicy.applied, manager._moepolicy.reason
    kernel = h.make_kernel(
        manager, monkeypatch, "block", h.moe_config(7168, 2, all2all_backend="deepep_v2")
    )
    h.forward_context(monkeypatch, {"model.layers.3.mlp.experts": kernel}, tokens_across_dp=[8, 8])
    h.run_kernel(kernel, 8, 7168)
    buffer = h.ElasticBuffer.instances[-1]
    assert (
        buffer.kwargs["use_fp8_dispatch"] is False
    )  # room for bf16 rows (vLLM sizes block layers for fp8)
    sent = buffer.dispatched[-1]["x"]
    assert isinstance(sent, torch.Tensor) and sent.dtype == torch.bfloat16
    received = kernel.fused_experts.received[-1]
    assert received["x"].dtype == torch.float8_e4m3fn and received["scale"].shape == (8, 56)


# ------------------------------------------------------ the export says what the plugin does, and vLLM
def _vllm_prefix(index: int, num_hidden_layers: int) -> str:
    """vLLM's module name for a policy layer; DeepSeek's MTP layer too is named with its own index
    (deepseek_mtp.py:157-158 passes ``model.layers.N`` to the decoder layer it builds)."""
    return f"model.layers.{index}.mlp.experts"


@pytest.mark.parametrize("model", ["Qwen3-30B-A3B-FP8", "DeepSeek-V3"])
def test_the_exports_launch_and_applies_lines_are_what_the_plugin_logs(
    vllm_env, tmp_path, monkeypatch, caplog, model
):
    """The default H200 target, EP 8: the plugin, set up as the export's launch says (model, EP size,
    --moe-backend, environment), logs the export's per-layer lines word for word. The launch has no
    --speculative-config, so vLLM builds no MTP layer: the export lists DeepSeek's apart."""
    from conftest import run_cli
    from moepolicy.export.vllm import render_shell

    path = tmp_path / "policy.yaml"
    assert run_cli("plan", "--model", model, "--ep-size", "8", "-o", str(path)).returncode == 0
    exported = run_cli(
        "export", str(path), "--to", "vllm", "--format", "json", "--policy-path", str(path)
    )
    assert exported.returncode == 0, exported.stderr
    result = json.loads(exported.stdout)
    flags = dict(zip(result["args"], result["args"][1:]))
    serve = next(
        line for line in render_shell(result, model).splitlines() if line.startswith("vllm serve")
    )
    assert (
        serve.split()[2]
        == result["model"]
        == {"Qwen3-30B-A3B-FP8": QWEN, "DeepSeek-V3": DEEPSEEK}[model]
    )
    for name, value in result["env"].items():
        monkeypatch.setenv(name, value)
    ep = int(flags["--data-parallel-size"])
    manager = start(monkeypatch, result["env"]["MOEPOLICY_POLICY"], ep=ep, model=result["model"])
    assert manager._moepolicy.applied, manager._moepolicy.reason
    doc = json.loads(
        json.dumps(parse_text(path.read_text()))
    )  # the tree: each layer with its facts
    hidden, layers = doc["model"]["hidden_size"], doc["model"]["num_layers"]
    moe = h.moe_config(hidden, ep, moe_backend=flags.get("--moe-backend", "auto"))
    kernels = {
        _vllm_prefix(e["index"], layers): h.make_kernel(
            manager, monkeypatch, h.scheme_of(e["facts"]), moe
        )
        for e in doc["layers"]
        if e["kind"] == "moe" and not e["facts"].get("layer.is_mtp")
    }
    h.forward_context(monkeypatch, kernels, tokens_across_dp=[4] * ep)
    h.run_kernel(next(iter(kernels.values())), 4, hidden)
    logged = [
        m.removeprefix("moepolicy: ")
        for m in messages(caplog)
        if m.startswith("moepolicy: layers ")
    ]
    exported_lines = [
        line for line in result["applied"] + result["cannot_express"] if line.startswith("layers ")
    ]
    assert logged == exported_lines and logged
    mtp_lines = [
        line for line in result["applied"] + result["cannot_express"] if line.startswith("MTP ")
    ]
    assert [line.split(" (")[0] for line in mtp_lines] == (
        ["MTP layers 61"] if model == "DeepSeek-V3" else []
    )
    summary = next(m for m in messages(caplog, logging.INFO) if "applied (digest" in m)
    assert (
        f"for {result['model']} (EP {ep})" in summary
        and f"{len(kernels)}/{len(kernels)} MoE layers applied" in summary
    )


def test_the_vllm_pack_says_what_vllms_own_code_does_for_every_catalog_model(
    vllm_env, tmp_path, monkeypatch
):
    """vLLM's real expert selection (SM90, FlashInfer installed) and prepare, without the plugin,
    decide whether DeepEP is handed fp8 or bf16; the ``vllm`` pack on each catalog model's facts (H200,
    EP 8, high-throughput) must say the same, and the expert sheet must name the experts vLLM built."""
    from moepolicy.checkpoint import catalog
    from moepolicy.errors import InfeasibleError
    from moepolicy.export.vllm_actions import experts_for

    manager = start(monkeypatch, None)
    checked = []
    for entry in catalog.entries():
        target = resolve_target(TargetSpec(gpu="h200", ep_size=8), probe=False)
        try:
            plan = make_plan(read_model(entry.repo_id, hub=False), target, pack_stack(["vllm"]))
        except InfeasibleError:
            continue
        first = next(e for e in build_document(plan)["layers"] if e["kind"] == "moe")
        scheme = h.scheme_of(first["facts"])
        if scheme is None:
            continue
        hidden = plan.model.hidden_size
        kernel = h.make_kernel(manager, monkeypatch, scheme, h.moe_config(hidden, 2))
        if scheme != "none":
            assert type(kernel.fused_experts).__name__ == experts_for(
                first["facts"]["kernel.name"], "fp8_e4m3"
            ), entry.repo_id
        h.forward_context(
            monkeypatch, {"model.layers.0.mlp.experts": kernel}, tokens_across_dp=[16, 16]
        )
        h.run_kernel(kernel, 16, hidden)
        vllm_sends_fp8 = h.dispatched(kernel)["wire"][0] == "torch.float8_e4m3fn"
        assert vllm_sends_fp8 == (first["order"] == "quant_then_dispatch"), (
            entry.repo_id,
            first["order"],
            first["rule"],
        )
        checked.append(entry.repo_id)
    assert len(checked) >= 8, checked


# -------------------------------------------------------------------------------- releases and pins
def test_the_installed_vllm_is_a_checked_release_and_matches_its_pins(vllm_env, monkeypatch):
    """Each release CI installs (0.33.0, 0.34.0) is pinned; its sources hash as pinned."""
    from moepolicy.integrations.vllm import pins

    h.with_deep_ep_v2(monkeypatch)  # vLLM's deepep_v2 module imports over a v2-era deep_ep

    release = pins.release_of(importlib.metadata.version("vllm"))
    assert release is not None
    assert pins.drift(pins.PINNED[release]) == [] and pins.drift(pins.PINNED_V2[release]) == []


def test_the_pins_tool_reads_a_vllm_tree_as_the_plugin_reads_the_installed_one(vllm_env):
    """tools/vllm_pins.py (how a new release is checked from its wheel, without installing it)
    finds each pinned function's text as inspect does on the imported vLLM."""
    import vllm

    from moepolicy.integrations.vllm import pins

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    import vllm_pins

    tree = Path(vllm.__file__).parent.parent
    release = pins.release_of(importlib.metadata.version("vllm"))
    for table in (pins.PINNED[release], pins.PINNED_V2[release]):
        for (module, attribute), expected in table.items():
            if attribute.endswith("()"):
                continue
            text = vllm_pins.source_of(tree, module, attribute)
            assert text is not None and vllm_pins.pin_hash(text) == expected, attribute


def test_the_plugin_imports_vllms_moe_modules_only_where_a_manager_is_built(tmp_path):
    """register() in a process that builds no DeepEP manager (vLLM's API server, its engine core)
    imports none of vLLM's MoE modules for the plugin; the first import of the managers' module (what
    a worker's CUDA communicator does) installs the plugin's classes there."""
    path = plan_file(tmp_path, "Qwen3-30B-A3B-FP8")
    script = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
import vllm_harness as h
sys.modules["deep_ep"] = h.fake_deep_ep()
import moepolicy.integrations.vllm as plugin
heavy = "vllm.model_executor.layers.fused_moe.prepare_finalize.deepep_ht"
managers = "vllm.distributed.device_communicators.all2all"
plugin.register()
print("after register:", heavy in sys.modules, managers in sys.modules)
from vllm.distributed.device_communicators import all2all
print("after import:", all2all.DeepEPHTAll2AllManager.__name__)
"""
    env = {**os.environ, "MOEPOLICY_POLICY": str(path)}
    env.pop("MOEPOLICY_STRICT", None)
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "after register: False False" in out.stdout, out.stdout
    assert "after import: PolicyDeepEPHTAll2AllManager" in out.stdout, out.stdout
