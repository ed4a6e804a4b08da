"""The plugin's DeepEP v2 classes (vLLM's ``deepep_v2`` backend, DeepEP's ElasticBuffer): the
policy's ``prefer_overlap_with_compute`` and ``allow_multiple_reduction`` in the buffer's kwargs
(vLLM reads them from VLLM_DEEPEP_V2_*), its ``num_sms`` passed to every dispatch (vLLM passes none),
and the per-layer orders v2 can carry: vLLM's own (block fp8 and MXFP8 first, the rest after), and
bf16 for a block layer or per-token precision on receive. A separate module: a v2 change leaves
high-throughput working.
"""

from __future__ import annotations

from vllm.distributed.device_communicators import all2all
from vllm.model_executor.layers.fused_moe.prepare_finalize import deepep_v2

from moepolicy.names import WireDtype
from moepolicy.export import vllm_actions as actions
from moepolicy.integrations.vllm import classes
from moepolicy.integrations.vllm.classes import _PolicyLayer, _quantize_received, _tag
from moepolicy.integrations.vllm.run import ManagerRun


class _V2NumSms:
    """DeepEP v2's buffer with the policy's SM count passed to every dispatch (vLLM passes none:
    deepep_v2.py:220-229; DeepEP's combine reuses the dispatch handle's)."""

    def __init__(self, buffer, num_sms: int):
        self._buffer, self._num_sms = buffer, num_sms

    def dispatch(self, *args, **kwargs):
        kwargs.setdefault("num_sms", self._num_sms)
        return self._buffer.dispatch(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._buffer, name)


class PolicyDeepEPV2PrepareAndFinalize(_PolicyLayer, deepep_v2.DeepEPV2PrepareAndFinalize):
    def __init__(self, buffer, *args, **kwargs):
        super().__init__(buffer, *args, **kwargs)
        self._moepolicy_init(buffer)
        v2 = self._moepolicy_run.plan.policy.deepep.v2 if self._moepolicy_run is not None else None
        if v2 is not None and v2.num_sms:
            self.buffer = _V2NumSms(self.buffer, v2.num_sms)

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
        if (
            self._moepolicy_run is None
            or self._moepolicy_entry(a1).action.kind != actions.BF16_THEN_QUANT
        ):
            return super().prepare_async(*args, defer_input_quant)
        receiver = super().prepare_async(*args, True)
        return lambda: _quantize_received(receiver(), quant_config)


class PolicyDeepEPV2All2AllManager(all2all.DeepEPV2All2AllManager):
    def __init__(self, cpu_group, tcp_store_group=None, device_group=None):
        super().__init__(cpu_group, tcp_store_group, device_group)
        self._moepolicy = ManagerRun(
            classes.SETTINGS, "v2", _no_config
        )  # v2 dispatches take no chunk config
        self._moepolicy.start(self)

    def _make_all2all_kwargs(self, num_max_tokens_per_rank, hidden, num_topk, use_fp8_dispatch):
        kwargs = super()._make_all2all_kwargs(
            num_max_tokens_per_rank, hidden, num_topk, use_fp8_dispatch
        )
        run = self._moepolicy
        if not run.applied:
            return kwargs
        v2, policy = run.plan.policy.deepep.v2, run.plan.policy
        if v2 is not None:
            kwargs["prefer_overlap_with_compute"] = v2.prefer_overlap_with_compute
            kwargs["allow_multiple_reduction"] = v2.allow_multiple_reduction
        if sends_bf16(
            policy
        ):  # room for bf16 rows where a block layer goes bf16 (vLLM sizes it for fp8)
            kwargs["use_fp8_dispatch"] = False
        return kwargs

    def get_handle(self, kwargs):
        return _tag(super().get_handle(kwargs), self._moepolicy)

    def max_sms_used(self):
        run = self._moepolicy
        v2 = run.plan.policy.deepep.v2 if run.applied else None
        return v2.num_sms if v2 is not None and v2.num_sms else super().max_sms_used()


def sends_bf16(policy) -> bool:
    """Whether any MoE layer's decision (any bucket) puts bf16 on the wire."""
    for index in policy.target.layer_kernels:
        d = policy.layer(index)
        if any(o.wire.dtype == WireDtype.BF16 for o in d.orders) or d.wire.dtype == WireDtype.BF16:
            return True
    return False


def _no_config(num_sms, *chunks):
    """A bucket's settings as a tuple: DeepEP v2 dispatches take no chunk ``Config``."""
    return (num_sms, *chunks)
