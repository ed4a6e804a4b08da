"""The plugin's classes: one subclass each of vLLM 0.33.0's DeepEP high-throughput manager and
prepare/finalize (the DeepEP v2 pair: :mod:`moepolicy.integrations.vllm.classes_v2`), installed where
vLLM constructs them
(:mod:`moepolicy.integrations.vllm.patches`). Where the policy does not apply, every method is
vLLM's own (``super()``).

- managers: after vLLM's ``__init__``, one :class:`~moepolicy.integrations.vllm.run.ManagerRun`
  (load, agree across ranks); the buffer's kwargs from the policy; the handle tagged with the run, so
  that the prepare/finalize vLLM builds on it knows its manager's policy.
- prepare/finalize: ``prepare_async`` looks the layer's entry up for the token count every rank
  agrees on (one bisect into a table built at the first dispatch) and either runs vLLM's prepare or
  the plugin's path; ``_get_dispatch_config`` / ``_get_combine_config`` return that entry's
  pre-built ``deep_ep.Config`` pair (per DBO micro-batch; under DBO with vLLM's SM split).
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Optional

import deep_ep
from vllm.distributed.device_communicators import all2all
from vllm.model_executor.layers.fused_moe.prepare_finalize import deepep_ht
from vllm.model_executor.layers.fused_moe.utils import moe_kernel_quantize_input
from vllm.v1.worker.ubatching import dbo_current_ubatch_id, dbo_enabled

from moepolicy.export import vllm_actions as actions
from moepolicy.integrations.vllm import report
from moepolicy.integrations.vllm.run import ManagerRun, PluginSettings

SETTINGS = PluginSettings(path=None, strict=False)  # set by patches.install


def agreed_tokens(a1) -> int:
    """A token count every rank agrees on: the max of the sequence-parallel local sizes when vLLM set
    them, else the max over DP ranks; the local count without DP metadata. DP metadata this code
    cannot read gives the largest count (the policy's last bucket, the same on every rank), said once."""
    from vllm.forward_context import get_forward_context, is_forward_context_available

    try:
        if is_forward_context_available():
            dp = get_forward_context().dp_metadata
            if dp is not None:
                if dp.local_sizes is not None:
                    return int(max(dp.local_sizes))
                return int(dp.num_tokens_across_dp_cpu.max())
    except Exception as exc:  # noqa: BLE001 (another vLLM's metadata: every rank reads it alike)
        report.say_once(
            0,
            f"could not read vLLM's token counts across DP ranks ({type(exc).__name__}: {exc}); "
            "every layer uses the policy's largest token bucket",
            logging.WARNING,
        )
        return sys.maxsize
    return int(a1.shape[0])


def layer_quant(experts, policy_kernel: str) -> actions.LayerQuant:
    """vLLM's layer as the action function reads it: its experts' quant config and class."""
    from vllm.platforms import current_platform

    qc = experts.quant_config
    block, per_token = (
        bool(qc.is_block_quantized),
        bool(qc.per_act_token_quant) and qc.a1_scale is None,
    )
    return actions.LayerQuant(
        fp8=qc.quant_dtype == current_platform.fp8_dtype(),
        block=block,
        per_token=per_token,
        experts=type(experts).__name__,
        defer_input_quant=bool(experts.expects_unquantized_inputs),
        policy_kernel=policy_kernel,
        static=qc.a1_scale is not None and not block and not qc.per_act_token_quant,
    )


def _quantize_received(result, quant_config):
    """The receiver's result quantized as vLLM's receiver would, but with the layer's own per-token
    precision (vLLM's passes per_act_token_quant=False: deepep_ht.py:266-278)."""
    expert_x, _, meta, topk_ids, topk_weights = result
    scales = None
    if expert_x.numel() != 0:
        expert_x, scales = moe_kernel_quantize_input(
            expert_x,
            quant_config.a1_scale,
            quant_dtype=quant_config.quant_dtype,
            per_act_token_quant=quant_config.per_act_token_quant,
            block_shape=quant_config.block_shape,
            is_scale_swizzled=quant_config.is_scale_swizzled,
        )
    return expert_x, scales, meta, topk_ids, topk_weights


def _with_scale(result, scale):
    expert_x, _, meta, topk_ids, topk_weights = result
    return expert_x, scale, meta, topk_ids, topk_weights


def _tag(handle, run: ManagerRun):
    try:
        handle._moepolicy_run = run
    except AttributeError:  # a handle that takes no attribute: its layers keep vLLM's path
        pass
    return handle


def _run_of(buffer) -> Optional[ManagerRun]:
    run = getattr(buffer, "_moepolicy_run", None)
    return run if run is not None and run.applied else None


class _PolicyLayer:
    """What both prepare/finalize subclasses keep: the manager's run, the layer's table, the entry
    each DBO micro-batch's dispatch used (its combine uses the same)."""

    _moepolicy_run: Optional[ManagerRun]
    _moepolicy_table: Any

    def _moepolicy_init(self, buffer) -> None:
        self._moepolicy_run = _run_of(buffer)
        self._moepolicy_table = None
        self._moepolicy_slots = [None, None]

    def _moepolicy_entry(self, a1):
        table = self._moepolicy_table or self._moepolicy_run.bind(self, type(self), layer_quant)
        entry = table.entry(agreed_tokens(a1))
        self._moepolicy_slots[dbo_current_ubatch_id()] = entry
        return entry

    def _moepolicy_configs(self):
        entry = (
            self._moepolicy_slots[dbo_current_ubatch_id()]
            if self._moepolicy_run is not None
            else None
        )
        if entry is None:
            return None
        configs = entry.dbo if dbo_enabled() else entry.serial
        return None if configs[0] is None else configs  # None: vLLM's own (DeepEP's defaults)


class PolicyDeepEPHTPrepareAndFinalize(_PolicyLayer, deepep_ht.DeepEPHTPrepareAndFinalize):
    def __init__(self, buffer, num_dispatchers: int, dp_size: int, rank_expert_offset: int):
        super().__init__(buffer, num_dispatchers, dp_size, rank_expert_offset)
        self._moepolicy_init(buffer)

    def prepare_async(
        self,
        a1,
        topk_weights,
        topk_ids,
        num_experts,
        expert_map,
        apply_router_weight_on_input,
        quant_config,
        defer_input_quant=False,
    ):
        args = (
            a1,
            topk_weights,
            topk_ids,
            num_experts,
            expert_map,
            apply_router_weight_on_input,
            quant_config,
        )
        if self._moepolicy_run is None:
            return super().prepare_async(*args, defer_input_quant)
        kind = self._moepolicy_entry(a1).action.kind
        if kind == actions.VLLM:
            return super().prepare_async(*args, defer_input_quant)
        if (
            kind == actions.BF16_THEN_QUANT
        ):  # vLLM's prepare, told the experts quantize; then we do, as they read
            receiver = super().prepare_async(*args, True)
            return lambda: _quantize_received(receiver(), quant_config)
        if apply_router_weight_on_input:  # as vLLM's prepare_async (deepep_ht.py:302-308)
            assert topk_ids.size(1) == 1, (
                "apply_router_weight_on_input is only implemented for topk=1"
            )
            a1 = a1 * topk_weights.to(a1.dtype)
        if kind == actions.TOKEN_FIRST:
            q, scales = moe_kernel_quantize_input(
                a1,
                None,
                quant_dtype=quant_config.quant_dtype,
                per_act_token_quant=True,
                block_shape=None,
            )
            return self._do_dispatch(
                tokens=q,
                token_scales=scales.view(-1, 1),
                rank_topk_ids=topk_ids,
                rank_topk_weights=topk_weights,
                num_experts=num_experts,
                a1_scale=None,
                quant_config=quant_config,
                defer_input_quant=True,
            )
        q, scale = moe_kernel_quantize_input(
            a1,
            quant_config.a1_scale,
            quant_dtype=quant_config.quant_dtype,
            per_act_token_quant=False,
            block_shape=None,
        )  # TENSOR_FIRST
        receiver = self._do_dispatch(
            tokens=q,
            token_scales=None,
            rank_topk_ids=topk_ids,
            rank_topk_weights=topk_weights,
            num_experts=num_experts,
            a1_scale=None,
            quant_config=quant_config,
            defer_input_quant=True,
        )
        return lambda: _with_scale(receiver(), scale)

    def _get_dispatch_config(self):
        configs = self._moepolicy_configs()
        return super()._get_dispatch_config() if configs is None else configs[0]

    def _get_combine_config(self):
        configs = self._moepolicy_configs()
        return super()._get_combine_config() if configs is None else configs[1]


class PolicyDeepEPHTAll2AllManager(all2all.DeepEPHTAll2AllManager):
    def __init__(self, cpu_group, tcp_store_group=None):
        super().__init__(cpu_group, tcp_store_group)
        self._moepolicy = ManagerRun(
            SETTINGS, "ht", deep_ep.Config
        )  # a fresh state on every start
        self._moepolicy.start(self)

    def _make_all2all_kwargs(self):
        kwargs = super()._make_all2all_kwargs()
        run = self._moepolicy
        if not run.applied or not run.plan.sets_deepep:
            return kwargs
        deepep = run.plan.policy.deepep
        kwargs["num_nvl_bytes"] = deepep.num_nvl_bytes
        if kwargs.get(
            "num_rdma_bytes"
        ):  # internode: the policy's RDMA buffer, and QPs for both SM counts
            kwargs["num_rdma_bytes"] = deepep.num_rdma_bytes or kwargs["num_rdma_bytes"]
            kwargs["num_qps_per_rank"] = internode_qps(deepep.num_sms, run.plan.dbo_num_sms)
        return kwargs

    def get_handle(self, kwargs):
        return _tag(super().get_handle(kwargs), self._moepolicy)


def internode_qps(num_sms: int, dbo_num_sms: Optional[int]) -> int:
    """QPs per rank for internode DeepEP: it asserts ``qps == num_sms / 2`` or ``qps >= num_sms``
    (internode.cu, notes §4) for every Config's num_sms: the plain one and vLLM's DBO share."""
    half = num_sms // 2
    if dbo_num_sms is None or dbo_num_sms == num_sms or half >= dbo_num_sms:
        return half
    return max(num_sms, dbo_num_sms)
