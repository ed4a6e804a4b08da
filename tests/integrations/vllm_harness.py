"""Stand-ins the vLLM plugin tests need on CPU, around vLLM 0.33.0's real code.

Real: vLLM's expert selection (``select_fp8_moe_backend``), its kernel factory
(``make_fp8_moe_kernel`` → ``maybe_make_prepare_finalize``), ``FusedMoEKernel.apply`` with its
``_prepare`` (``defer_input_quant`` from the real experts' ``expects_unquantized_inputs``), the
DeepEP managers' and prepare/finalize code, the quant configs.

Stand-ins (each says what it replaces):
- ``deep_ep``: ``Config`` enforcing DeepEP's constructor asserts (csrc/config.hpp:40-49 at 29d31c0:
  num_sms >= 0; 0 < nvl_send < nvl_recv; rdma_recv rounded up to a multiple of rdma_send, then
  rdma_send < rdma_recv and rdma_send <= rdma_recv / 2), a ``Buffer`` that echoes one rank's
  dispatch (all top-k experts local) and checks what DeepEP's kernels assert (an even num_sms,
  2-D scales with one row per token), and, given a gloo group, exchanges what every rank hands it
  (ranks that disagree on the Config or the wire would hang or corrupt the real DeepEP: here they
  fail);
- the platform's device capability (9.0 unless told) and CUDA-ness, FlashInfer's presence;
- vLLM's fp8 quantizers (CUDA/Triton ops) → moepolicy's torch reference (same formats);
- the experts' GEMMs (``apply``): they record what reached them and write zeros;
- the current vLLM config, the parallel state a manager reads, and the forward context.
"""

from __future__ import annotations

import importlib.machinery
import math
import types
from typing import Any, Optional

import torch

from moepolicy import datasheets


# ------------------------------------------------------------------------------------------- deep_ep
class Config:
    """deep_ep.Config with DeepEP's constructor asserts."""

    def __init__(self, num_sms=20, nvl_send=6, nvl_recv=256, rdma_send=6, rdma_recv=256):
        assert num_sms >= 0, "num_sms >= 0"
        assert 0 < nvl_send < nvl_recv, "0 < nvl_send < nvl_recv"
        assert rdma_send > 0 and rdma_recv > 0, "rdma chunks > 0"
        rdma_recv = math.ceil(rdma_recv / rdma_send) * rdma_send
        assert rdma_send < rdma_recv and rdma_send <= rdma_recv // 2, "rdma_send <= rdma_recv / 2"
        self.num_sms = num_sms
        self.chunks = (nvl_send, nvl_recv, rdma_send, rdma_recv)

    def key(self):
        return (self.num_sms, *self.chunks)

    def __eq__(self, other):
        return isinstance(other, Config) and self.key() == other.key()

    def __hash__(self):
        return hash(self.key())

    def __repr__(self):
        return f"Config{self.key()}"


class EventOverlap:
    def __init__(self, event=None):
        self.event = event

    def current_stream_wait(self):
        pass


def _sheet_table(part: str, ranks: int):
    sheet = datasheets.deepep_sheet(datasheets.NEWEST_SHEET)
    return getattr(sheet.defaults, part)[ranks]


class Buffer:
    """One rank's DeepEP buffer: dispatch hands back what it was handed (all top-k experts local).
    ``group`` (a gloo process group) makes every rank check that all ranks hand it the same Config
    and wire, as the real kernels need."""

    num_sms = 20
    instances: list = []

    exchange_over = (
        None  # a gloo group: ranks exchange what they hand DeepEP (the two-rank test sets it)
    )

    def __init__(
        self,
        group=None,
        num_nvl_bytes=0,
        num_rdma_bytes=0,
        low_latency_mode=False,
        num_qps_per_rank=24,
        explicitly_destroy=False,
        enable_shrink=False,
    ):
        self.group = group if group is not None and group is Buffer.exchange_over else None
        self.kwargs = dict(
            num_nvl_bytes=num_nvl_bytes,
            num_rdma_bytes=num_rdma_bytes,
            num_qps_per_rank=num_qps_per_rank,
        )
        self.dispatched, self.combined = [], []
        Buffer.instances.append(self)

    def capture(self):
        return EventOverlap()

    def destroy(self):
        pass

    @classmethod
    def get_dispatch_config(cls, ranks):
        return Config(cls.num_sms, *_sheet_table("dispatch", ranks))

    @classmethod
    def get_combine_config(cls, ranks):
        return Config(cls.num_sms, *_sheet_table("combine", ranks))

    @classmethod
    def set_num_sms(cls, n):
        assert n % 2 == 0, "set_num_sms: even"
        cls.num_sms = n

    def get_dispatch_layout(self, topk_idx, num_experts, **_):
        per_expert = torch.bincount(topk_idx.flatten(), minlength=num_experts)
        return None, None, per_expert, None, EventOverlap()

    def _agree(self, what):
        if self.group is None:
            return
        import torch.distributed as dist

        seen = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(seen, what, group=self.group)
        assert all(s == seen[0] for s in seen), f"ranks disagree in DeepEP: {seen}"

    def dispatch(
        self,
        x,
        handle=None,
        topk_idx=None,
        topk_weights=None,
        config=None,
        num_tokens_per_expert=None,
        **_,
    ):
        tokens, scales = x if isinstance(x, tuple) else (x, None)
        assert tokens.dim() == 2 and tokens.is_contiguous(), "x: 2-D, contiguous"
        if scales is not None:
            assert tokens.element_size() == 1 and scales.dtype in (torch.float32, torch.int32), (
                "x_scales dtype"
            )
            assert scales.dim() == 2 and scales.size(0) == tokens.size(0), (
                "x_scales: [num_tokens, num_scales]"
            )
        if config is not None:
            assert isinstance(config, Config) and config.num_sms % 2 == 0, (
                f"dispatch config {config!r}"
            )
        wire = (str(tokens.dtype), None if scales is None else scales.size(1))
        self._agree(("dispatch", None if config is None else config.key(), wire))
        self.dispatched.append({"x": x, "config": config, "wire": wire})
        return x, topk_idx, topk_weights, num_tokens_per_expert.tolist(), "handle", EventOverlap()

    def combine(self, x, handle=None, topk_weights=None, config=None, **_):
        assert x.dtype == torch.bfloat16, "combine: bf16 only"
        if config is not None:
            assert isinstance(config, Config) and config.num_sms % 2 == 0, (
                f"combine config {config!r}"
            )
        self._agree(("combine", None if config is None else config.key()))
        self.combined.append({"config": config})
        return x, None, EventOverlap()


class EPHandle:
    def __init__(self, n):
        self.num_recv_tokens_per_expert_list = [n]
        self.psum_num_recv_tokens_per_scaleup_rank = torch.tensor([n])


class ElasticBuffer:
    """DeepEP v2's ElasticBuffer (do_expand path): dispatch hands back what it was handed."""

    instances: list = []

    def __init__(self, **kwargs):
        self.kwargs, self.dispatched = kwargs, []
        ElasticBuffer.instances.append(self)

    def get_theoretical_num_sms(self, num_experts, num_topk):
        return 24

    def dispatch(
        self,
        x,
        topk_idx=None,
        topk_weights=None,
        num_experts=None,
        num_max_tokens_per_rank=None,
        do_expand=True,
        do_cpu_sync=True,
        async_with_compute_stream=False,
        num_sms=0,
        **_,
    ):
        tokens = x[0] if isinstance(x, tuple) else x
        self.dispatched.append({"x": x, "num_sms": num_sms})
        return x, None, topk_weights[:, 0].contiguous(), EPHandle(tokens.size(0)), EventOverlap()

    def combine(self, x, handle=None, topk_weights=None, **_):
        return x, None, EventOverlap()

    def destroy(self):
        pass


_FAKE = None


def fake_deep_ep() -> types.ModuleType:
    """One stand-in module per process (vLLM's modules keep the deep_ep they imported)."""
    global _FAKE
    if _FAKE is not None:
        return _FAKE
    _FAKE = module = types.ModuleType("deep_ep")
    module.__spec__ = importlib.machinery.ModuleSpec("deep_ep", None)
    module.Buffer, module.Config, module.EventOverlap = Buffer, Config, EventOverlap
    module.topk_idx_t = torch.int64
    return module


# ------------------------------------------------------------------------------------------- vLLM
def with_deep_ep_v2(monkeypatch) -> None:
    """The stand-in grows DeepEP v2's ElasticBuffer (moepolicy then recognises a v2 build); vLLM's
    checks for a v2 build and for NCCL GIN (a CUDA probe) pass."""
    from vllm.distributed.device_communicators import all2all

    module = fake_deep_ep()
    monkeypatch.setattr(module, "ElasticBuffer", ElasticBuffer, raising=False)
    monkeypatch.setattr(module, "EPHandle", EPHandle, raising=False)
    monkeypatch.setattr(all2all, "has_deep_ep_v2", lambda: True)
    monkeypatch.setattr(
        all2all.DeepEPV2All2AllManager, "_check_gin_support", lambda self, group: None
    )


def cpu_runtime(monkeypatch) -> None:
    """What a GPU model runner sets up: pinned memory off (modular_kernel.py make_from_list), vLLM's
    workspace manager on the CPU device (GPUModelRunner calls init_workspace_manager)."""
    from vllm.model_executor.layers.fused_moe import modular_kernel
    from vllm.v1.worker import workspace

    monkeypatch.setattr(modular_kernel, "PIN_MEMORY", False)
    if getattr(workspace, "_manager", None) is None:
        try:
            workspace.init_workspace_manager(torch.device("cpu"))
        except Exception:  # noqa: BLE001 (already initialised in this process)
            pass


def torch_fp8_ops(monkeypatch) -> None:
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


def cuda_platform(monkeypatch, capability=(9, 0), flashinfer=True, deep_gemm=False) -> None:
    """The platform vLLM sees: CUDA with this device capability; FlashInfer's CUTLASS MoE present or
    not; DeepGEMM supported or not."""
    from vllm.model_executor.layers.fused_moe.experts import deep_gemm_moe, flashinfer_cutlass_moe
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability

    cls = type(current_platform)
    monkeypatch.setattr(
        cls,
        "get_device_capability",
        classmethod(lambda c, device_id=0: DeviceCapability(*capability)),
    )
    monkeypatch.setattr(cls, "is_cuda", lambda self: True)
    monkeypatch.setattr(cls, "is_cuda_alike", lambda self: True)
    monkeypatch.setattr(
        cls, "supports_fp8", classmethod(lambda c: True)
    )  # CudaPlatform: capability >= 8.9
    monkeypatch.setattr(
        flashinfer_cutlass_moe, "has_flashinfer_cutlass_fused_moe", lambda: flashinfer
    )
    monkeypatch.setattr(deep_gemm_moe, "is_deep_gemm_supported", lambda: deep_gemm)


def parallel_config(enable_dbo: bool, ubatch_size: int) -> types.SimpleNamespace:
    """The parallel config's micro-batching fields, with vLLM's own ``use_ubatching`` and
    ``num_ubatches`` properties evaluated on them (vLLM micro-batches for DBO or ubatch_size > 1)."""
    from vllm.config import ParallelConfig

    ns = types.SimpleNamespace(enable_dbo=enable_dbo, ubatch_size=ubatch_size)
    ns.use_ubatching = ParallelConfig.use_ubatching.fget(ns)
    ns.num_ubatches = ParallelConfig.num_ubatches.fget(ns)
    return ns


class VllmConfigStandIn(types.SimpleNamespace):
    """The parts of VllmConfig the plugin and the oracle read."""


def vllm_config(
    monkeypatch,
    model="Qwen/Qwen3-30B-A3B-FP8",
    hf_config=None,
    dbo=False,
    cudagraph_mode=None,
    download_dir=None,
    ubatch_size=0,
) -> VllmConfigStandIn:
    import vllm.config
    from vllm.model_executor.layers.fused_moe.oracle import fp8 as oracle

    cfg = VllmConfigStandIn(
        model_config=types.SimpleNamespace(
            model=model,
            revision=None,
            hf_config=hf_config,
            enforce_eager=True,
            hf_text_config=types.SimpleNamespace(model_type="qwen3_moe"),
        ),
        compilation_config=types.SimpleNamespace(
            cudagraph_mode=cudagraph_mode, static_forward_context={}
        ),
        parallel_config=parallel_config(enable_dbo=dbo, ubatch_size=ubatch_size),
        load_config=types.SimpleNamespace(download_dir=download_dir),
    )
    monkeypatch.setattr(vllm.config, "get_current_vllm_config", lambda: cfg)
    monkeypatch.setattr(oracle, "get_current_vllm_config", lambda: cfg)
    from vllm.model_executor.layers.fused_moe import all2all_utils

    monkeypatch.setattr(all2all_utils, "get_current_vllm_config", lambda: cfg)
    return cfg


class CpuGroup:
    """The manager's CPU group for one process standing in for ``size`` ranks: every other rank's
    start-up vote is ``peer_vote`` (None: the same as this rank's), as vLLM's StatelessProcessGroup
    answers ``all_gather_obj``."""

    def __init__(self, size, rank=0, peer_vote=None):
        self._size, self._rank, self.peer_vote, self.gathered = size, rank, peer_vote, []

    def rank(self):
        return self._rank

    def size(self):
        return self._size

    def all_gather_obj(self, mine):
        peers = [
            dict(mine, rank=r) if self.peer_vote is None else dict(self.peer_vote, rank=r)
            for r in range(self._size)
            if r != self._rank
        ]
        out = peers[: self._rank] + [mine] + peers[self._rank :]
        self.gathered.append(out)
        return out


def parallel_state(monkeypatch, ep_size: int, gpus_per_node: int = 8) -> None:
    """vLLM's groups for one EP group of ``ep_size`` ranks, ``gpus_per_node`` to a node (vLLM's own
    manager reads ``in_the_same_node_as`` to set ``internode``)."""
    from vllm.distributed import parallel_state as ps

    monkeypatch.setattr(
        ps, "get_dp_group", lambda: types.SimpleNamespace(rank_in_group=0, world_size=ep_size)
    )
    monkeypatch.setattr(
        ps, "get_tp_group", lambda: types.SimpleNamespace(rank_in_group=0, world_size=1)
    )
    monkeypatch.setattr(
        ps,
        "in_the_same_node_as",
        lambda g, source_rank=0: [r // gpus_per_node == 0 for r in range(g.size())],
    )


def make_manager(monkeypatch, group, backend="ht", gpus_per_node=8):
    """The manager vLLM's CUDA communicator builds (cuda_communicator.py:210-237 takes the class
    from the all2all module, where the plugin put its own)."""
    from vllm.distributed.device_communicators import all2all

    parallel_state(monkeypatch, group.size(), gpus_per_node)
    if backend == "v2":
        return all2all.DeepEPV2All2AllManager(group)
    return all2all.DeepEPHTAll2AllManager(group)


def moe_config(
    hidden: int,
    ep_size: int,
    moe_backend="auto",
    num_experts=8,
    intermediate=256,
    sp_size=1,
    all2all_backend="deepep_high_throughput",
):
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import FusedMoEConfig, FusedMoEParallelConfig
    from vllm.model_executor.layers.fused_moe.config import RoutingMethodType

    parallel = FusedMoEParallelConfig(
        tp_size=1,
        pcp_size=1,
        dp_size=ep_size,
        ep_size=ep_size,
        tp_rank=0,
        pcp_rank=0,
        dp_rank=0,
        ep_rank=0,
        sp_size=sp_size,
        use_ep=True,
        all2all_backend=all2all_backend,
        enable_eplb=False,
    )
    return FusedMoEConfig(
        num_experts=num_experts,
        experts_per_token=2,
        hidden_dim=hidden,
        intermediate_size=intermediate,
        num_local_experts=num_experts // ep_size,
        num_logical_experts=num_experts,
        activation=MoEActivation.SILU,
        device="cpu",
        routing_method=RoutingMethodType.Renormalize,
        moe_parallel_config=parallel,
        in_dtype=torch.bfloat16,
        moe_backend=moe_backend,
    )


SCHEMES = {  # (weight key, activation key, quant config kwargs) as vLLM's fp8 methods build them
    "block": ("kFp8Static128BlockSym", "kFp8Dynamic128Sym", {"block_shape": [128, 128]}),
    "token": (
        "kFp8StaticChannelSym",
        "kFp8DynamicTokenSym",
        {"per_act_token_quant": True, "per_out_ch_quant": True},
    ),
    "static": ("kFp8StaticTensorSym", "kFp8StaticTensorSym", {"static": True}),
    "dynamic_tensor": ("kFp8StaticTensorSym", "kFp8DynamicTensorSym", {}),
}


def scheme_of(facts: dict) -> Optional[str]:
    """The fp8 scheme a policy layer's recorded facts describe (None: not an fp8 scheme built here)."""
    if facts.get("ckpt.weight_dtype") == "none" and facts.get("ckpt.act_dtype") == "none":
        return "none"
    if facts.get("ckpt.weight_dtype") != "fp8_e4m3" or facts.get("ckpt.act_dtype") != "fp8_e4m3":
        return None
    granularity, dynamic = facts.get("ckpt.act_granularity"), facts.get("ckpt.act_dynamic")
    if (
        granularity == "group"
        and facts.get("ckpt.act_group") == 128
        and facts.get("ckpt.weight_granularity") == "block"
    ):
        return "block"
    if granularity == "token" and dynamic == "dynamic":
        return "token"
    if granularity == "tensor":
        return "static" if dynamic == "static" else "dynamic_tensor"
    return None


def make_kernel(manager, monkeypatch, scheme: str, moe) -> Any:
    """vLLM's own selection and construction: select_fp8_moe_backend, make_fp8_moe_quant_config,
    make_fp8_moe_kernel (its prepare/finalize from maybe_make_prepare_finalize, over ``manager``)."""
    from vllm.model_executor.layers.fused_moe import all2all_utils
    from vllm.model_executor.layers.fused_moe.oracle import fp8 as oracle
    from vllm.model_executor.layers.quantization.utils import quant_utils

    monkeypatch.setattr(all2all_utils, "get_ep_all2all_manager", lambda ep_group=None: manager)
    if scheme == "none":  # vLLM's unquantized oracle (oracle/unquantized.py)
        from vllm.model_executor.layers.fused_moe.config import FUSED_MOE_UNQUANTIZED_CONFIG
        from vllm.model_executor.layers.fused_moe.oracle import unquantized

        backend, experts_cls = unquantized.select_unquantized_moe_backend(moe)
        kernel = unquantized.make_unquantized_moe_kernel(
            FUSED_MOE_UNQUANTIZED_CONFIG, moe, backend, experts_cls
        )
        record_experts(kernel.fused_experts, monkeypatch)
        return kernel
    weight_key, act_key, extra = SCHEMES[scheme]
    backend, experts_cls = oracle.select_fp8_moe_backend(
        moe,
        getattr(quant_utils, weight_key),
        getattr(quant_utils, act_key),
        allow_vllm_cutlass=scheme == "token",
    )
    one = torch.ones(moe.num_local_experts)
    extra = dict(extra)
    static = extra.pop("static", False)
    scale = torch.tensor(0.02) if static else None
    qc = oracle.make_fp8_moe_quant_config(
        backend, w1_scale=one, w2_scale=one, a1_scale=scale, a2_scale=scale, **extra
    )
    kernel = oracle.make_fp8_moe_kernel(qc, moe, experts_cls, backend)
    record_experts(kernel.fused_experts, monkeypatch)
    return kernel


def record_experts(experts, monkeypatch) -> None:
    """The experts' GEMMs: what reached them is recorded; they write zeros."""
    experts.received = []

    def apply(
        output,
        hidden_states,
        w1,
        w2,
        topk_weights,
        topk_ids,
        activation,
        global_num_experts,
        expert_map,
        a1q_scale,
        a2_scale,
        workspace13,
        workspace2,
        expert_tokens_meta,
        apply_router_weight_on_input,
    ):
        experts.received.append({"x": hidden_states, "scale": a1q_scale})
        output.zero_()

    monkeypatch.setattr(experts, "apply", apply)


def forward_context(monkeypatch, kernels: dict, tokens_across_dp=None, local_sizes=None):
    """vLLM's forward context as the model runner builds it: prefix -> MoE runner (the kernel under
    routed_experts.quant_method.moe_kernel), the DP metadata."""
    import vllm.forward_context as fc

    layers = {
        prefix: types.SimpleNamespace(
            routed_experts=types.SimpleNamespace(
                quant_method=types.SimpleNamespace(moe_kernel=kernel)
            )
        )
        for prefix, kernel in kernels.items()
    }
    dp = None
    if tokens_across_dp is not None:
        dp = fc.DPMetadata(torch.tensor(tokens_across_dp))
        dp.local_sizes = local_sizes
    ctx = types.SimpleNamespace(no_compile_layers=layers, dp_metadata=dp)
    monkeypatch.setattr(fc, "get_forward_context", lambda: ctx)
    monkeypatch.setattr(fc, "is_forward_context_available", lambda: True)
    return ctx


def run_kernel(kernel, tokens: int, hidden: int, seed=0, local_experts=4):
    """One MoE forward through vLLM's FusedMoEKernel.apply; (input, output)."""
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation

    g = torch.Generator().manual_seed(seed)
    a1 = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)
    topk_ids = torch.randint(0, 8, (tokens, 2), generator=g)
    topk_weights = torch.rand(tokens, 2, generator=g)
    w1 = torch.empty(local_experts, 512, 1).expand(local_experts, 512, hidden)
    w2 = torch.empty(local_experts, hidden, 1).expand(local_experts, hidden, 256)
    out = kernel.apply(a1, w1, w2, topk_weights, topk_ids, MoEActivation.SILU, 8, None, False)
    return a1, out


def dispatched(kernel) -> dict:
    return kernel.prepare_finalize.buffer.dispatched[-1]


def install_plugin(path: Optional[str], strict=False):
    from moepolicy.integrations.vllm.patches import install

    return install(None if path is None else str(path), strict=strict)


def uninstall_plugin():
    from moepolicy.integrations.vllm.patches import uninstall

    uninstall()
