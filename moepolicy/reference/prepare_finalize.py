"""A reference prepare/finalize that carries out one layer's decision around a transport.

``prepare`` quantizes on the sender and dispatches the fp8 payload (``quant_then_dispatch``), or
dispatches bf16 and quantizes what arrives (``dispatch_then_quant``), or dispatches bf16 untouched
(``no_quant``); ``in_kernel_quant`` is DeepEP low-latency's own fp8 dispatch (see
:func:`low_latency_prepare`). ``finalize`` combines bf16 expert outputs back to their tokens. The
expert computation in between is the caller's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from moepolicy.reference.transport import Dispatched, Transport
from moepolicy.quant import reference


@dataclass(frozen=True)
class QuantSpec:
    """What the expert kernel consumes: ``block`` (1×group), ``token``, ``tensor_static`` (a known
    global scale), ``tensor_dynamic`` (one scale per sender), or ``none`` (bf16)."""

    kind: str
    group: int = 128
    ue8m0: bool = False
    static_scale: Optional[float] = None

    @classmethod
    def from_wire(cls, wire, static_scale: Optional[float] = None) -> "QuantSpec":
        if wire.dtype == "bf16":
            return cls("none")
        scale = wire.scale
        if scale is None:
            return cls("tensor_static", static_scale=static_scale)
        if scale.granularity == "block":
            return cls("block", group=scale.group or 128, ue8m0=scale.dtype == "ue8m0")
        if scale.granularity == "token":
            return cls("token")
        return cls("tensor_dynamic")


@dataclass
class Prepared:
    x: torch.Tensor  # what the experts receive: fp8 (or bf16 for no_quant)
    scales: Optional[torch.Tensor]  # row-major [R, S] float32 (int32 when UE8M0-packed)
    topk_idx: torch.Tensor
    topk_weights: torch.Tensor
    tokens_per_expert: list[int]
    handle: Any
    dispatched: Dispatched


def quantize(
    x: torch.Tensor, spec: QuantSpec, backend: str = "auto"
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Quantize rows as ``spec`` says; scales are row-major (UE8M0 scales packed into int32)."""
    impl = _impl(x, backend)
    if spec.kind == "block":
        q, s = impl.per_token_group(x, spec.group, ue8m0=spec.ue8m0)
        if spec.ue8m0:
            s = reference.pack_ue8m0(s)
        return q, s
    if spec.kind == "token":
        return impl.per_token(x)
    if spec.kind == "tensor_static":
        if spec.static_scale is None:
            raise ValueError("tensor_static needs the global static scale (the max over experts)")
        # a fill on the device: torch.tensor([...], device=cuda) copies from the host and syncs
        scale = torch.full((1,), float(spec.static_scale), dtype=torch.float32, device=x.device)
        return impl.per_tensor_static(x, scale), None
    if spec.kind == "tensor_dynamic":
        q, s = reference.per_tensor_dynamic(x)
        return q, s.view(1, 1).expand(x.shape[0], 1)
    if spec.kind == "none":
        return x, None
    raise ValueError(f"unknown quantization kind {spec.kind!r}")


def _impl(x: torch.Tensor, backend: str):
    if backend == "torch" or (backend == "auto" and not x.is_cuda):
        return reference
    from moepolicy.quant import triton_kernels

    return triton_kernels


class PrepareFinalize:
    """Executes ``order`` for one layer over ``transport``; ``spec`` is what the experts consume."""

    def __init__(self, order: str, spec: QuantSpec, transport: Transport, backend: str = "auto"):
        if order not in ("quant_then_dispatch", "dispatch_then_quant", "no_quant"):
            raise ValueError(f"order {order!r} is not a normal-dispatch order")
        self.order, self.spec, self.transport, self.backend = order, spec, transport, backend

    def prepare(
        self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor
    ) -> Prepared:
        if self.order == "quant_then_dispatch":
            q, s = quantize(x, self.spec, self.backend)
            got = self.transport.dispatch(q, s, topk_idx, topk_weights)
            return self._prepared(got, got.x, got.scales)
        got = self.transport.dispatch(x, None, topk_idx, topk_weights)
        if self.order == "no_quant" or self.spec.kind == "none":
            return self._prepared(got, got.x, None)
        q, s = quantize(got.x, self.spec, self.backend)
        return self._prepared(got, q, s)

    def _prepared(
        self, got: Dispatched, x: torch.Tensor, scales: Optional[torch.Tensor]
    ) -> Prepared:
        if self.spec.kind == "tensor_static":  # bare fp8: every rank knows the global scale
            if self.spec.static_scale is None:  # as quantize() says it
                raise ValueError(
                    "tensor_static needs the global static scale (the max over experts)"
                )
            scales = torch.full(
                (x.shape[0], 1),
                float(self.spec.static_scale),
                dtype=torch.float32,
                device=x.device,
            )
        return Prepared(
            x, scales, got.topk_idx, got.topk_weights, got.tokens_per_expert, got.handle, got
        )

    def finalize(self, expert_out: torch.Tensor, handle: Any) -> torch.Tensor:
        """Combine bf16 rows (one per received token, already reduced over local experts)."""
        return self.transport.combine(expert_out.to(torch.bfloat16), handle)
