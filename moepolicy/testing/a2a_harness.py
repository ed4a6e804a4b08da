"""Run every prepare/finalize order on R ranks and save what the experts receive.

The same worker runs over the emulated transport (gloo, CPU, in CI) and over DeepEP (NCCL, GPUs);
:func:`check_results` then compares against quantizing the same tokens on one device.
"""

from __future__ import annotations

from dataclasses import dataclass

import os
from pathlib import Path
from typing import Any

import torch

from moepolicy.measure.ranks import run_ranks

SPECS: dict[str, dict[str, Any]] = {  # QuantSpec's fields but the static scale
    "block128": dict(kind="block", group=128),
    "block128_ue8m0": dict(kind="block", group=128, ue8m0=True),
    "token": dict(kind="token"),
    "tensor_static": dict(kind="tensor_static"),
    "tensor_dynamic": dict(kind="tensor_dynamic"),
}


def make_inputs(rank: int, tokens: int, hidden: int, num_experts: int, top_k: int, device):
    g = torch.Generator().manual_seed(1234 + rank)
    x = torch.randn(tokens, hidden, generator=g) * (1 + 3 * torch.rand(tokens, 1, generator=g))
    scores = torch.rand(tokens, num_experts, generator=g)
    topk_idx = scores.topk(top_k, dim=1).indices.to(torch.int64)
    topk_w = torch.rand(tokens, top_k, generator=g).to(torch.float32)
    return x.to(torch.bfloat16).to(device), topk_idx.to(device), topk_w.to(device)


def per_expert_static_scales(num_experts: int) -> torch.Tensor:
    """A checkpoint's per-expert input scales that differ (as real static checkpoints' do)."""
    g = torch.Generator().manual_seed(99)
    return 0.02 + 0.03 * torch.rand(num_experts, generator=g)


def join(
    rank: int, world: int, outdir: str, transport_kind: str, num_experts: int, hidden: int = 7168
):
    """This rank in the group and its transport and device: DeepEP's normal kernels on the GPUs
    visible (NCCL, or gloo where ranks share a GPU: ``measure.placement``), or gloo and the
    emulated all-to-all on CPUs."""
    import torch.distributed as dist

    if transport_kind == "deepep":
        import deep_ep

        from moepolicy.measure.ranks import join_group
        from moepolicy.reference.transport import DeepEPTransport

        device = join_group(rank, world, f"{outdir}/rendezvous")
        buffer = deep_ep.Buffer(dist.group.WORLD, deepep_nvl_bytes(hidden, world), 0)
        return DeepEPTransport(buffer, num_experts), device
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, init_method=f"file://{outdir}/rendezvous"
    )
    from moepolicy.reference.transport import GatherTransport

    return GatherTransport(None, num_experts), torch.device("cpu")


def deepep_nvl_bytes(hidden: int, world: int) -> int:
    """The NVLink buffer DeepEP's own hint asks for bf16 rows of ``hidden`` at its default configs
    for ``world`` ranks (a fixed size trips DeepEP's buffer-size assert at 8 ranks)."""
    import deep_ep

    configs = (deep_ep.Buffer.get_dispatch_config(world), deep_ep.Buffer.get_combine_config(world))
    return max(c.get_nvl_buffer_size_hint(hidden * 2, world) for c in configs)


@dataclass(frozen=True)
class A2AShape:
    """What each rank dispatches: tokens of ``hidden``, routed to ``top_k`` of ``num_experts``."""

    tokens: int = 96
    hidden: int = 512
    num_experts: int = 16
    top_k: int = 4


def worker(
    rank: int,
    world: int,
    transport_kind: str,
    outdir: str,
    shape: A2AShape = A2AShape(),
    backend: str = "auto",
) -> None:
    import torch.distributed as dist

    tokens, hidden, num_experts, top_k = shape.tokens, shape.hidden, shape.num_experts, shape.top_k

    from moepolicy.quant.reference import global_static_scale
    from moepolicy.reference.prepare_finalize import PrepareFinalize, QuantSpec

    transport, device = join(rank, world, outdir, transport_kind, num_experts, hidden)
    x, topk_idx, topk_w = make_inputs(rank, tokens, hidden, num_experts, top_k, device)
    static = float(global_static_scale(per_expert_static_scales(num_experts)))
    results: dict[Any, dict[str, Any]] = {}  # (spec, order) -> tensors; "combine" -> its own
    for name, fields in SPECS.items():
        spec = QuantSpec(
            **fields, static_scale=static if fields["kind"] == "tensor_static" else None
        )
        for order in ("quant_then_dispatch", "dispatch_then_quant"):
            pf = PrepareFinalize(order, spec, transport, backend=backend)
            got = pf.prepare(x, topk_idx, topk_w)
            src_rank, src_token = got.dispatched.src_rank, got.dispatched.src_token
            assert src_rank is not None and src_token is not None, "the harness's transport says"
            results[(name, order)] = {
                "q": got.x.view(torch.uint8).cpu(),
                "s": None if got.scales is None else got.scales.cpu(),
                "src_rank": src_rank.cpu(),
                "src_token": src_token.cpu(),
                "topk_idx": got.topk_idx.cpu(),
            }
    # no_quant round trip: combine sums each received row back to its token
    pf = PrepareFinalize("no_quant", QuantSpec("none"), transport, backend=backend)
    got = pf.prepare(x, topk_idx, topk_w)
    combined = pf.finalize(got.x, got.handle)
    results["combine"] = {"x": x.cpu(), "combined": combined.cpu(), "topk_idx": topk_idx.cpu()}
    torch.save(results, Path(outdir) / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def spawn(world: int, transport_kind: str, outdir: str, **kwargs) -> list[dict]:
    os.makedirs(outdir, exist_ok=True)
    run_ranks(_entry, (world, transport_kind, outdir, kwargs), world)
    return [torch.load(Path(outdir) / f"rank{r}.pt", weights_only=False) for r in range(world)]


def _entry(rank, world, transport_kind, outdir, kwargs):
    kwargs = dict(kwargs)
    backend = kwargs.pop("backend", "auto")
    worker(rank, world, transport_kind, outdir, A2AShape(**kwargs), backend)


def reference_rows(
    results: list[dict],
    name: str,
    order_key,
    world: int,
    tokens: int,
    hidden: int,
    num_experts: int,
    top_k: int,
):
    """Quantize every rank's tokens on one device (CPU, torch reference), then pick the rows a rank
    received, in the order it received them."""
    from moepolicy.quant import reference
    from moepolicy.quant.reference import global_static_scale
    from moepolicy.reference.prepare_finalize import QuantSpec, quantize

    fields = SPECS[name]
    static = float(global_static_scale(per_expert_static_scales(num_experts)))
    spec = QuantSpec(**fields, static_scale=static if fields["kind"] == "tensor_static" else None)
    per_rank = []
    for s in range(world):
        x, _, _ = make_inputs(s, tokens, hidden, num_experts, top_k, "cpu")
        q, sc = quantize(x, spec, backend="torch")
        if spec.kind == "tensor_static":
            sc = torch.full((x.shape[0], 1), static, dtype=torch.float32)
        per_rank.append((q.view(torch.uint8), sc))
    _ = reference
    out = []
    for r in range(world):
        got = results[r][order_key]
        q = torch.stack(
            [
                per_rank[s][0][t]
                for s, t in zip(got["src_rank"].tolist(), got["src_token"].tolist())
            ]
        )
        sc = torch.stack(
            [
                per_rank[s][1][t]
                for s, t in zip(got["src_rank"].tolist(), got["src_token"].tolist())
            ]
        )
        out.append((q, sc))
    return out


def low_latency_worker(
    rank: int,
    world: int,
    outdir: str,
    tokens: int = 64,
    hidden: int = 2048,
    num_experts: int = 16,
    top_k: int = 4,
) -> None:
    """``in_kernel_quant``: DeepEP low-latency fp8 dispatch; saves what each local expert received,
    with the source rank and token of each slot, for comparison with the reference quantizer."""
    import deep_ep
    import torch.distributed as dist

    from moepolicy.measure.ranks import join_group

    device = join_group(rank, world, f"{outdir}/rendezvous-ll")
    hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(tokens, hidden, world, num_experts)
    buffer = deep_ep.Buffer(
        dist.group.WORLD, 0, hint, low_latency_mode=True, num_qps_per_rank=num_experts // world
    )
    x, topk_idx, _ = make_inputs(rank, tokens, hidden, num_experts, top_k, device)
    (q, scales), counts, handle, _, _ = buffer.low_latency_dispatch(
        x, topk_idx, tokens, num_experts, use_fp8=True
    )
    torch.cuda.synchronize()
    src_info, layout = handle[0], handle[1]
    rows = []
    for e in range(num_experts // world):
        for s in range(world):
            packed = int(layout[e, s].item())
            count, begin = packed & 0xFFFFFFFF, packed >> 32
            for slot in range(begin, begin + count):
                rows.append(
                    (
                        s,
                        int(src_info[e, slot].item()),
                        q[e, slot].view(torch.uint8).cpu(),
                        scales[e, slot].float().cpu(),
                    )
                )
    torch.save(rows, Path(outdir) / f"ll-rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def _ll_entry(rank, world, outdir, kwargs):
    low_latency_worker(rank, world, outdir, **kwargs)


def spawn_low_latency(world: int, outdir: str, **kwargs) -> list:
    os.makedirs(outdir, exist_ok=True)
    run_ranks(_ll_entry, (world, outdir, kwargs), world)
    return [torch.load(Path(outdir) / f"ll-rank{r}.pt", weights_only=False) for r in range(world)]


def combine_is_exact(results: list[dict], world: int, num_experts: int) -> bool:
    """Combine sums each received row back to its token: x times the ranks it went to, on every rank."""
    from moepolicy.reference.transport import destination_mask

    for r in range(world):
        data = results[r]["combine"]
        copies = destination_mask(data["topk_idx"], num_experts, world).sum(dim=1, keepdim=True)
        if not torch.equal(
            data["combined"], (data["x"].to(torch.float32) * copies).to(torch.bfloat16)
        ):
            return False
    return True


def dynamic_tensor_outcome(
    results: list[dict], world: int, tokens: int, hidden: int, num_experts: int, top_k: int
) -> tuple[bool, int]:
    """(every sender-quantized row equals one device's, bytes the receiver-side scale changed)."""
    exact = reference_rows(
        results,
        "tensor_dynamic",
        ("tensor_dynamic", "quant_then_dispatch"),
        world,
        tokens,
        hidden,
        num_experts,
        top_k,
    )
    senders_exact, differ = True, 0
    for r in range(world):
        sender = results[r][("tensor_dynamic", "quant_then_dispatch")]
        senders_exact &= torch.equal(sender["q"], exact[r][0]) and torch.equal(
            sender["s"], exact[r][1]
        )
        differ += int(
            (results[r][("tensor_dynamic", "dispatch_then_quant")]["q"] != sender["q"]).sum()
        )
    return senders_exact, differ


# packed formats carried as bytes: (row bytes of x, scale columns and their dtype) for hidden H
PACKED_FORMATS = {
    # NVFP4: two e2m1 values per byte; one e4m3 scale per 16 values, the scale bytes viewed as float32
    # (as TensorRT-LLM sends them through DeepEP's normal dispatch)
    "nvfp4": lambda h: (h // 2, h // 16 // 4, torch.float32),
    # MXFP8: e4m3 values; one UE8M0 exponent per 32 values, packed four to an int32
    "mxfp8": lambda h: (h, h // 32 // 4, torch.int32),
}


def packed_payload(rank: int, tokens: int, hidden: int, fmt: str):
    """Random bytes in ``fmt``'s layout: ``x`` as 1-byte fp8 (DeepEP carries it as bytes) and the scales."""
    row_bytes, scale_cols, scale_dtype = PACKED_FORMATS[fmt](hidden)
    g = torch.Generator().manual_seed(4321 + rank)
    x = torch.randint(0, 256, (tokens, row_bytes), dtype=torch.uint8, generator=g)
    scale_bytes = torch.randint(0, 256, (tokens, scale_cols * 4), dtype=torch.uint8, generator=g)
    return x, scale_bytes.view(scale_dtype)


def check_packed_arrived(results: list[dict], fmt: str, tokens: int, hidden: int) -> None:
    """Every row each rank received in ``fmt``, and its scales, equal the bytes its sender sent
    (AssertionError naming the format, rank and row otherwise)."""
    sent = {r: packed_payload(r, tokens, hidden, fmt) for r in range(len(results))}
    for rank, per_rank in enumerate(results):
        got = per_rank[fmt]
        assert got["x"].shape[0] > 0
        for row, (src, token) in enumerate(
            zip(got["src_rank"].tolist(), got["src_token"].tolist())
        ):
            x, scales = sent[src]
            assert torch.equal(got["x"][row], x[token]), (fmt, rank, row)
            assert torch.equal(got["s"][row].view(torch.uint8), scales[token].view(torch.uint8)), (
                fmt,
                rank,
                row,
            )


def packed_worker(
    rank: int,
    world: int,
    outdir: str,
    tokens: int,
    hidden: int,
    num_experts: int,
    top_k: int,
    transport_kind: str = "deepep",
) -> None:
    """Dispatch NVFP4 and MXFP8 payloads (DeepEP's normal dispatch on GPUs, or the emulated
    all-to-all on CPUs, which checks the harness itself); save what arrived."""
    import torch.distributed as dist

    transport, device = join(rank, world, outdir, transport_kind, num_experts, hidden)
    _, topk_idx, topk_w = make_inputs(rank, tokens, hidden, num_experts, top_k, device)
    results = {}
    for fmt in PACKED_FORMATS:
        x, scales = packed_payload(rank, tokens, hidden, fmt)
        got = transport.dispatch(
            x.to(device).view(torch.float8_e4m3fn), scales.to(device), topk_idx, topk_w
        )
        results[fmt] = {
            "x": got.x.view(torch.uint8).cpu(),
            "s": got.scales.cpu(),
            "src_rank": got.src_rank.cpu(),
            "src_token": got.src_token.cpu(),
        }
    torch.save(results, Path(outdir) / f"packed{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def _packed_entry(rank, world, outdir, kwargs):
    packed_worker(rank, world, outdir, **kwargs)


def spawn_packed(world: int, outdir: str, **kwargs) -> list[dict]:
    os.makedirs(outdir, exist_ok=True)
    run_ranks(_packed_entry, (world, outdir, kwargs), world)
    return [torch.load(Path(outdir) / f"packed{r}.pt", weights_only=False) for r in range(world)]
