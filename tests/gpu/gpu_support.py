"""Skip reasons for GPU tests, stated once.

Multi-rank tests need one GPU: where fewer GPUs than ranks are visible, the ranks share them
(``moepolicy.measure.placement``: gloo, DeepEP's intranode buffer over IPC on one device). Such runs
check function; nothing they time is a performance number."""

import pytest


def gpu_skip_reason(min_gpus: int = 1, need_deep_ep: bool = False) -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU visible"
    if torch.cuda.device_count() < min_gpus:
        return f"needs {min_gpus} GPUs, {torch.cuda.device_count()} visible"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    if need_deep_ep:
        try:
            import deep_ep  # noqa: F401
        except ImportError as exc:
            return f"deep_ep is not importable ({exc}); install DeepEP to run these"
    return None


def require(min_gpus: int = 1, need_deep_ep: bool = False):
    reason = gpu_skip_reason(min_gpus, need_deep_ep)
    if reason:
        pytest.skip(reason)


# EP sizes the multi-rank DeepEP tests run at (ranks share the GPUs where fewer are visible)
WORLDS = (2, 4, 8)


def shared(world: int) -> bool:
    """Do ``world`` ranks share GPUs here (then timing relations are not checked)."""
    import torch

    return torch.cuda.device_count() < world
