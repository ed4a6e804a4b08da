"""The patches the vLLM plugin installs on vLLM 0.33's DeepEP high-throughput classes.

Pinned: the vLLM release checked (0.33.x) and a hash of each patched function's source. Anything
else patches nothing and says so. What is patched (vLLM file and function):

- ``all2all.py`` ``DeepEPHTAll2AllManager.__init__``: after vLLM's own, load the policy with this
  process's EP size and the served model (``load_policy(path, ep_size=, model=)``); a fallback of
  any kind (key mismatch, damaged file, partial result), or CUDA graphs on, leaves vLLM as it is.
  Then the manager's ``num_sms`` is the policy's (vLLM fixes 20 and ``set_num_sms`` only lowers it;
  internode QPs follow it when the buffer is made).
- ``DeepEPHTAll2AllManager._make_all2all_kwargs``: the policy's NVLink/RDMA buffer sizes.
- ``deepep_ht.py`` ``DeepEPHTPrepareAndFinalize.prepare_async``: each MoE layer's order and wire
  from the policy (``integrations.vllm.actions``), for a token count every rank agrees on (the max
  over DP ranks); ``_receiver``: no re-quantization of per-token fp8 sent with its scales, and the
  receiver's quantization with the layer's per-token precision; ``_get_dispatch_config`` /
  ``_get_combine_config``: the policy's configs for that token bucket, combine with the bucket its
  dispatch used (per DBO micro-batch).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import inspect
from dataclasses import dataclass, field
from typing import Any, Optional

from moepolicy.export import vllm_actions as actions
from moepolicy.integrations.vllm.report import say

CHECKED_RELEASES = ("0.33.",)
# sha256 (first 16 hex digits) of inspect.getsource of each patched function in vLLM 0.33.0
PINNED = {
    "DeepEPHTPrepareAndFinalize.prepare_async": "66f8e54d3fd5db6f",
    "DeepEPHTPrepareAndFinalize._receiver": "4857f4885f02785f",
    "DeepEPHTPrepareAndFinalize._do_dispatch": "371fbc0b607f6411",
    "DeepEPHTPrepareAndFinalize._get_dispatch_config": "43c759ab45d71630",
    "DeepEPHTPrepareAndFinalize._get_combine_config": "e1fe7d9786c9bfd8",
    "DeepEPHTPrepareAndFinalize._finalize": "ee13b98dea43ba35",
    "DeepEPHTAll2AllManager._make_all2all_kwargs": "66cffb5f91e5176e",
    "DeepEPHTAll2AllManager.set_num_sms": "82dd9d6c45c6874b",
    "DeepEPAll2AllManagerBase.__init__": "29c3837c8edb91c5",
}


def digest(fn) -> str:
    return hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()[:16]


@dataclass
class PluginState:
    """This process's plugin: the policy once loaded (None: vLLM's own behaviour), and what it did."""

    path: str
    strict: bool
    policy: Any = None
    expert_kernel: str = ""  # the expert kernel the policy was made for (target.expert_kernel)
    applied: dict[int, str] = field(default_factory=dict)  # layer index -> action kind, said once

    def start(self, manager, facts: "ServingFacts") -> None:
        """Load the policy for what vLLM really runs; set the manager's SM count from it."""
        from moepolicy import load_policy

        if facts.cudagraphs:
            say(f"not applied: CUDA graphs are on ({facts.cudagraphs}); per-bucket choices cannot follow the token "
                "count inside a captured graph (vLLM turns them off for DeepEP high-throughput with DP > 1)")
            return
        policy = load_policy(self.path, ep_size=facts.ep_size, model=facts.model, strict=self.strict)
        if policy.is_fallback:
            say(f"not applied: {policy.fallback_reason}; vLLM's own DeepEP behaviour is kept")
            return
        if policy.deepep.num_nvl_bytes is None:
            say("not applied: the policy has no buffer sizes; vLLM's own DeepEP behaviour is kept")
            return
        from moepolicy.policy_reader import read_policy

        self.expert_kernel = read_policy(self.path).doc.target.expert_kernel
        self.policy = policy
        manager.num_sms = policy.deepep.num_sms
        say(f"applied: {self.path} (EP {facts.ep_size}, {facts.model}): DeepEP num_sms {policy.deepep.num_sms}, "
            f"{len(policy.deepep.buckets)} token bucket(s), NVLink buffer {policy.deepep.num_nvl_bytes} bytes")

    def note_layer(self, index: int, action: "actions.Action") -> None:
        if self.applied.get(index) != action.kind:
            self.applied[index] = action.kind
            say(f"layer {index}: {action.kind} ({action.why})")


@dataclass(frozen=True)
class ServingFacts:
    ep_size: int
    model: Optional[str]
    cudagraphs: str  # "" when off


def serving_facts(manager) -> ServingFacts:
    """What vLLM runs, from its current config: the EP group's size, the model, the CUDA-graph mode."""
    from vllm.config import get_current_vllm_config

    cfg = get_current_vllm_config()
    model = getattr(getattr(cfg, "model_config", None), "model", None)
    mode = getattr(getattr(cfg, "compilation_config", None), "cudagraph_mode", None)
    off = mode is None or getattr(mode, "name", str(mode)) == "NONE"
    return ServingFacts(manager.world_size, model, "" if off else getattr(mode, "name", str(mode)))


def install(path: str, strict: bool = False) -> Optional[PluginState]:
    """Patch vLLM if it is a release checked and its functions are the ones checked; else say why."""
    version = importlib.metadata.version("vllm")
    if not version.startswith(CHECKED_RELEASES):
        say(f"not applied: vLLM {version} is not a release this plugin was checked against "
            f"({', '.join(r + 'x' for r in CHECKED_RELEASES)}); vLLM runs as it is")
        return None
    try:
        from vllm.distributed.device_communicators import all2all
        from vllm.model_executor.layers.fused_moe.prepare_finalize import deepep_ht
    except ImportError as exc:
        say(f"not applied: vLLM's DeepEP modules do not import ({exc}); vLLM runs as it is")
        return None
    classes = {"DeepEPHTPrepareAndFinalize": deepep_ht.DeepEPHTPrepareAndFinalize,
               "DeepEPHTAll2AllManager": all2all.DeepEPHTAll2AllManager,
               "DeepEPAll2AllManagerBase": all2all.DeepEPAll2AllManagerBase}
    drift = [name for name, expected in PINNED.items()
             if digest(getattr(classes[name.split(".")[0]], name.split(".")[1])) != expected]
    if drift:
        say(f"not applied: vLLM {version}'s {', '.join(drift)} differ from the source this plugin was checked "
            "against; vLLM runs as it is")
        return None
    state = PluginState(path, strict)
    _patch_manager(all2all.DeepEPHTAll2AllManager, state)
    _patch_prepare_finalize(deepep_ht.DeepEPHTPrepareAndFinalize, state)
    say(f"installed for vLLM {version}: the policy is applied when DeepEP high-throughput starts (low-latency and "
        "DeepEP v2 are left to vLLM)")
    return state


def _patch_manager(cls, state: PluginState) -> None:
    original_init, original_kwargs = cls.__init__, cls._make_all2all_kwargs

    def __init__(self, cpu_group, tcp_store_group=None):
        original_init(self, cpu_group, tcp_store_group)
        try:
            state.start(self, serving_facts(self))
        except Exception as exc:  # noqa: BLE001 (vLLM's behaviour stays unless strict)
            if state.strict:
                raise
            say(f"not applied: {type(exc).__name__}: {exc}")

    def _make_all2all_kwargs(self):
        kwargs = original_kwargs(self)
        if state.policy is not None:
            deepep = state.policy.deepep
            kwargs["num_nvl_bytes"] = deepep.num_nvl_bytes
            if kwargs.get("num_rdma_bytes") and deepep.num_rdma_bytes:  # internode: the policy's RDMA buffer
                kwargs["num_rdma_bytes"] = deepep.num_rdma_bytes
        return kwargs

    cls.__init__, cls._make_all2all_kwargs = __init__, _make_all2all_kwargs


def agreed_tokens(a1) -> int:
    """A token count every rank agrees on: the max over data-parallel ranks (ranks that disagree on
    the wire, the SM count or the chunks corrupt or hang DeepEP); the local count without DP."""
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if is_forward_context_available():
        dp = get_forward_context().dp_metadata
        if dp is not None:
            return int(dp.num_tokens_across_dp_cpu.max())
    return int(a1.shape[0])


def layer_of(instance) -> tuple[Optional[int], str]:
    """The decoder layer index of the FusedMoE layer this prepare/finalize serves, and its experts'
    class (found once through vLLM's static forward context, then cached on the instance)."""
    cached = getattr(instance, "_moepolicy_layer", None)
    if cached is not None:
        return cached
    from vllm.forward_context import get_forward_context, is_forward_context_available
    from vllm.model_executor.models.utils import extract_layer_index

    if not is_forward_context_available():
        return None, ""  # not cached: the layer table is there once vLLM runs a forward pass
    found: tuple[Optional[int], str] = (None, "")
    for prefix, layer in get_forward_context().no_compile_layers.items():
        impl = _kernel_impl(layer)
        if impl is not None and getattr(impl, "prepare_finalize", None) is instance:
            found = (extract_layer_index(prefix), type(impl.fused_experts).__name__)
            break
    instance._moepolicy_layer = found
    return found


def _kernel_impl(layer):
    method = getattr(getattr(layer, "routed_experts", layer), "quant_method", None)
    kernel = getattr(method, "moe_kernel", None)
    return getattr(kernel, "impl", None)


def _layer_quant(quant_config, experts: str, defer: bool, policy_kernel: str) -> actions.LayerQuant:
    from vllm.platforms import current_platform

    static = quant_config.a1_scale is not None  # a static per-tensor input scale: not per-token dynamic
    return actions.LayerQuant(fp8=quant_config.quant_dtype == current_platform.fp8_dtype(),
                              block=bool(quant_config.is_block_quantized),
                              per_token=bool(quant_config.per_act_token_quant) and not static,
                              experts=experts, defer_input_quant=defer, policy_kernel=policy_kernel)


def _patch_prepare_finalize(cls, state: PluginState) -> None:
    cls.prepare_async = _patched_prepare(cls.prepare_async, state)
    cls._receiver = _patched_receiver(cls._receiver)
    cls._get_dispatch_config = _patched_config(cls._get_dispatch_config, state, "dispatch")
    cls._get_combine_config = _patched_config(cls._get_combine_config, state, "combine")


def _layer_action(instance, state: PluginState, tokens: int, quant_config, defer: bool) -> actions.Action:
    """What the plugin does for this layer's dispatch at ``tokens`` agreed tokens (noted per layer)."""
    index, experts = layer_of(instance)
    decision = state.policy.layer(index) if index is not None else None
    if decision is None or decision.kind != "moe":
        return actions.Action(actions.VLLM, "the layer is not in vLLM's forward context")
    chosen = decision.bucket_order(tokens)
    scale = chosen.wire.scale.granularity if chosen.wire.scale else None
    action = actions.action_for(chosen.order, chosen.wire.dtype, scale,
                                _layer_quant(quant_config, experts, defer, state.expert_kernel))
    state.note_layer(index, action)
    return action


def _patched_prepare(original, state: PluginState):
    def prepare_async(self, a1, topk_weights, topk_ids, num_experts, expert_map, apply_router_weight_on_input,
                      quant_config, defer_input_quant=False):
        args = (a1, topk_weights, topk_ids, num_experts, expert_map, apply_router_weight_on_input, quant_config,
                defer_input_quant)
        if state.policy is None:
            return original(self, *args)
        from vllm.v1.worker.ubatching import dbo_current_ubatch_id

        tokens = agreed_tokens(a1)
        action = _layer_action(self, state, tokens, quant_config, defer_input_quant)
        runs = getattr(self, "_moepolicy_runs", None) or {}
        runs[dbo_current_ubatch_id()] = (action.kind, tokens)
        self._moepolicy_runs = runs
        if action.kind in (actions.VLLM, actions.BLOCK_FIRST):
            return original(self, *args)
        if apply_router_weight_on_input:
            assert topk_ids.size(1) == 1, "apply_router_weight_on_input is only implemented for topk=1"
            a1 = a1 * topk_weights.to(a1.dtype)
        a1_scale, scales = quant_config.a1_scale, None
        if action.kind == actions.TOKEN_FIRST:
            from vllm.model_executor.layers.fused_moe.utils import moe_kernel_quantize_input

            a1, scales = moe_kernel_quantize_input(a1, None, quant_dtype=quant_config.quant_dtype,
                                                   per_act_token_quant=True, block_shape=None)
            a1_scale, scales = None, scales.view(-1, 1)
        return self._do_dispatch(tokens=a1, token_scales=scales, rank_topk_ids=topk_ids,
                                 rank_topk_weights=topk_weights, num_experts=num_experts, a1_scale=a1_scale,
                                 quant_config=quant_config, defer_input_quant=defer_input_quant)

    return prepare_async


def _patched_receiver(original):
    def _receiver(self, *args, defer_input_quant=False):
        # args as vLLM 0.33's _receiver: event, has_scales, token_data, expert_topk_ids, num_experts,
        # expert_num_tokens_per_expert_list, expert_topk_weights, a1_scale, quant_config[, defer_input_quant]
        if len(args) == 10:
            args, defer_input_quant = args[:9], args[9]
        kind = _run(self)[0]
        if kind == actions.TOKEN_FIRST:  # the fp8 rows and their [T, 1] scales arrive as the experts read them
            return original(self, *args, defer_input_quant=True)
        if kind != actions.BF16_THEN_QUANT:
            return original(self, *args, defer_input_quant=defer_input_quant)
        a1_scale, quant_config = args[7], args[8]
        expert_x, _, meta, topk_ids, topk_weights = original(self, *args, defer_input_quant=True)
        scales = None
        if expert_x.numel() != 0:
            from vllm.model_executor.layers.fused_moe.utils import moe_kernel_quantize_input

            expert_x, scales = moe_kernel_quantize_input(
                expert_x, a1_scale, quant_dtype=quant_config.quant_dtype,
                per_act_token_quant=quant_config.per_act_token_quant, block_shape=quant_config.block_shape,
                is_scale_swizzled=quant_config.is_scale_swizzled)
        return expert_x, scales, meta, topk_ids, topk_weights

    return _receiver


def _patched_config(original, state: PluginState, part: str):
    """``_get_dispatch_config`` / ``_get_combine_config``: the policy's bucket for the agreed tokens."""
    def get_config(self):
        bucket = _bucket(self, state)
        if bucket is None:
            return original(self)
        import deep_ep

        return deep_ep.Config(state.policy.deepep.num_sms, *getattr(bucket, part))

    return get_config


def _run(instance) -> tuple[str, Optional[int]]:
    """What this micro-batch's dispatch did: (action kind, agreed token count)."""
    from vllm.v1.worker.ubatching import dbo_current_ubatch_id

    runs = getattr(instance, "_moepolicy_runs", None) or {}
    return runs.get(dbo_current_ubatch_id(), (actions.VLLM, None))


def _bucket(instance, state: PluginState):
    """The policy's bucket for this micro-batch's agreed token count (combine reuses its dispatch's)."""
    tokens = _run(instance)[1]
    if state.policy is None or tokens is None:
        return None
    return state.policy.deepep.bucket_for(tokens)
