"""The vLLM source the plugin relies on, pinned per release checked: a hash of each function's
source as the vLLM 0.33.0 and 0.34.0 wheels ship it. The plugin subclasses four classes and overrides
few methods, but relies on much more: how vLLM builds the prepare/finalize and the manager, how the
modular kernel calls prepare (``defer_input_quant`` from the experts), how the receiver treats
``defer_input_quant``, the quantizer's signature, the DP metadata it reads token counts from, when
vLLM micro-batches and its SM split, and the expert oracle the expert sheet models. Any difference
and the plugin installs nothing and says which.

A release's table is the one before it with what changed, each change read in the source and found
not to touch what the plugin relies on (the reading is beside each entry). ``tools/vllm_pins.py``
computes the hashes from a wheel without installing it.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect

from moepolicy.names import checked_vllm_release

_FUSED = "vllm.model_executor.layers.fused_moe"
_A2A = "vllm.distributed.device_communicators.all2all"

# (module, dotted attribute) -> sha256 (first 16 hex digits) of inspect.getsource (a signature for
# moe_kernel_quantize_input: its body is free to change, its parameters are not)
_PINNED_0_33 = {
    (
        f"{_FUSED}.prepare_finalize.deepep_ht",
        "DeepEPHTPrepareAndFinalize.__init__",
    ): "82d3446d4e50fcb4",
    (
        f"{_FUSED}.prepare_finalize.deepep_ht",
        "DeepEPHTPrepareAndFinalize.prepare_async",
    ): "66f8e54d3fd5db6f",
    (
        f"{_FUSED}.prepare_finalize.deepep_ht",
        "DeepEPHTPrepareAndFinalize._do_dispatch",
    ): "371fbc0b607f6411",
    (
        f"{_FUSED}.prepare_finalize.deepep_ht",
        "DeepEPHTPrepareAndFinalize._receiver",
    ): "4857f4885f02785f",
    (
        f"{_FUSED}.prepare_finalize.deepep_ht",
        "DeepEPHTPrepareAndFinalize._finalize",
    ): "ee13b98dea43ba35",
    (
        f"{_FUSED}.prepare_finalize.deepep_ht",
        "DeepEPHTPrepareAndFinalize._get_dispatch_config",
    ): "43c759ab45d71630",
    (
        f"{_FUSED}.prepare_finalize.deepep_ht",
        "DeepEPHTPrepareAndFinalize._get_combine_config",
    ): "e1fe7d9786c9bfd8",
    (_A2A, "DeepEPAll2AllManagerBase.__init__"): "29c3837c8edb91c5",
    (_A2A, "DeepEPHTAll2AllManager._make_all2all_kwargs"): "66cffb5f91e5176e",
    (_A2A, "DeepEPHTAll2AllManager.get_handle"): "2f2a93bbda3e9ef8",
    (_A2A, "DeepEPHTAll2AllManager.set_num_sms"): "82dd9d6c45c6874b",
    (f"{_FUSED}.all2all_utils", "maybe_make_prepare_finalize"): "c5df741779e3669a",
    (f"{_FUSED}.modular_kernel", "FusedMoEKernelModularImpl._prepare"): "66e16a3079c233b9",
    (f"{_FUSED}.modular_kernel", "FusedMoEKernel.__init__"): "7275a7ee292966ff",
    (f"{_FUSED}.utils", "moe_kernel_quantize_input()"): "39eff9c05b8a2364",
    (f"{_FUSED}.runner.moe_runner", "register_layer_for_moe_forward_op"): "a9cdc80578761181",
    (f"{_FUSED}.experts.triton_moe", "TritonExperts.apply"): "b6ccd70b10a439b2",
    (
        f"{_FUSED}.experts.flashinfer_cutlass_moe",
        "FlashInferExperts.expects_unquantized_inputs",
    ): "667d52c96e7086a5",
    (f"{_FUSED}.oracle.fp8", "_get_priority_backends"): "36180d9c8ebb4d60",
    (f"{_FUSED}.oracle.fp8", "select_fp8_moe_backend"): "80d06185355ff828",
    ("vllm.forward_context", "DPMetadata"): "3af6051ba807b25d",
    ("vllm.v1.worker.ubatch_utils", "create_sm_control_context"): "49bb3dc38964cf4b",
    ("vllm.config.parallel", "ParallelConfig.use_ubatching"): "f01c2bb08442a1f1",
}

# vLLM 0.34.0: prepare_finalize/deepep_ht.py is byte-identical to 0.33.0's; these four changed.
_PINNED_0_34 = {
    **_PINNED_0_33,
    # new MORI EPv2 and FlashInfer NVLink branches; the DeepEP HT/v2 branches are 0.33's
    (f"{_FUSED}.all2all_utils", "maybe_make_prepare_finalize"): "a4e07b7ceedcb0b7",
    # an f-string instead of str.format in the duplicate-name error
    (f"{_FUSED}.runner.moe_runner", "register_layer_for_moe_forward_op"): "af432028107c1d30",
    # a sorted-A TMA path for block fp8 on SM90 and a masked per-tensor a2 scale: the input's
    # quantization (a1, what the plugin's orders feed) is 0.33's
    (f"{_FUSED}.experts.triton_moe", "TritonExperts.apply"): "a47705eeaca251c5",
    # the backend loop moved into Fp8MoEKernelOracle; the priority list and the order it is tried
    # in (_get_priority_backends, unchanged) are 0.33's
    (f"{_FUSED}.oracle.fp8", "select_fp8_moe_backend"): "1b37c88627d24135",
}

PINNED = {"0.33": _PINNED_0_33, "0.34": _PINNED_0_34}

# DeepEP v2 (deepep_v2 backend): checked separately, so that a v2 change leaves high-throughput working
_PINNED_V2_0_33 = {
    (
        f"{_FUSED}.prepare_finalize.deepep_v2",
        "DeepEPV2PrepareAndFinalize.__init__",
    ): "00d9eae285527b46",
    (
        f"{_FUSED}.prepare_finalize.deepep_v2",
        "DeepEPV2PrepareAndFinalize.prepare_async",
    ): "8dcb8f143d2c986f",
    (
        f"{_FUSED}.prepare_finalize.deepep_v2",
        "DeepEPV2PrepareAndFinalize._do_dispatch",
    ): "548fffe5be4de355",
    (
        f"{_FUSED}.prepare_finalize.deepep_v2",
        "DeepEPV2PrepareAndFinalize._receiver",
    ): "3efa0a03b733bba0",
    (_A2A, "DeepEPV2All2AllManager.__init__"): "398e6d481fe20e86",
    (_A2A, "DeepEPV2All2AllManager._make_all2all_kwargs"): "01325434d6871795",
    (_A2A, "DeepEPV2All2AllManager.get_handle"): "8a93a5bf0301c875",
}

_PINNED_V2_0_34 = {
    **_PINNED_V2_0_33,
    # the receiver quantizes with the layer's per-token precision (0.33: per-tensor) and masks a
    # per-tensor scale to the received rows; where the plugin sends bf16 it still quantizes itself
    (
        f"{_FUSED}.prepare_finalize.deepep_v2",
        "DeepEPV2PrepareAndFinalize._receiver",
    ): "61636eb03b99566b",
    # num_allocated_qps added to the buffer's kwargs; the keys the plugin sets are 0.33's
    (_A2A, "DeepEPV2All2AllManager._make_all2all_kwargs"): "453f700527f9236e",
}

PINNED_V2 = {"0.33": _PINNED_V2_0_33, "0.34": _PINNED_V2_0_34}

CHECKED_RELEASES = tuple(
    PINNED
)  # the same as moepolicy.names.CHECKED_VLLM_RELEASES (a test checks)


def release_of(version: str) -> str | None:
    """The checked release (``0.34``) a vLLM version (``0.34.1``, ``0.34.0rc1``) belongs to, or None."""
    return checked_vllm_release(version)


def _resolve(module: str, attribute: str):
    obj = importlib.import_module(module)
    for part in attribute.removesuffix("()").split("."):
        obj = inspect.getattr_static(obj, part) if inspect.isclass(obj) else getattr(obj, part)
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, property):
        obj = obj.fget
    return obj


def source_hash(module: str, attribute: str) -> str:
    obj = _resolve(module, attribute)
    text = str(inspect.signature(obj)) if attribute.endswith("()") else inspect.getsource(obj)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def drift(pins: dict) -> list[str]:
    """The pinned names whose source differs (or cannot be found) in the vLLM imported here."""
    changed = []
    for (module, attribute), expected in pins.items():
        try:
            found = source_hash(module, attribute)
        except Exception:  # noqa: BLE001 (a missing module or attribute is drift too)
            found = "missing"
        if found != expected:
            changed.append(f"{module.rsplit('.', 1)[-1]}.{attribute}")
    return changed
