"""The MoE shapes the GPU scripts measure (``benchmarks/``), by short name, read from the model catalog:
one source for every script, and the same numbers ``tune`` reads."""

from __future__ import annotations

from dataclasses import dataclass

# short name → catalog model
BENCH_MODELS = {"deepseek-v3": "DeepSeek-V3", "qwen3-30b-a3b": "Qwen3-30B-A3B-FP8"}


@dataclass(frozen=True)
class MoeShape:
    hidden: int
    experts: int
    top_k: int
    intermediate: int  # one expert's intermediate size (its first GEMM has N = 2 x this)


def bench_shape(name: str) -> MoeShape:
    """The first MoE layer's shape of the catalog model behind ``name`` (a key of :data:`BENCH_MODELS`)."""
    # the checkpoint reader (Pydantic): only for a bench model's shape
    from moepolicy.checkpoint.reader import read_model

    if name not in BENCH_MODELS:
        raise ValueError(f"unknown shape {name!r}; one of {sorted(BENCH_MODELS)}")
    layer = read_model(BENCH_MODELS[name]).moe_layers[0]
    if layer.moe_intermediate_size is None:
        raise ValueError(f"{BENCH_MODELS[name]} names no MoE intermediate size")
    return MoeShape(layer.hidden_size, layer.num_experts, layer.top_k, layer.moe_intermediate_size)


def least_bytes(groups: list[int], hidden: int, out: int) -> int:
    """The bytes the GEMM must move at least: each operand once. fp8 weights of every expert that got
    rows and fp8 activations (K = hidden), their float32 block-128 scales, bf16 output."""
    rows, used = sum(groups), sum(1 for n in groups if n)
    kb, nb = -(-hidden // 128), -(-out // 128)
    return used * out * hidden + rows * hidden + 4 * (used * nb * kb + rows * kb) + 2 * rows * out
