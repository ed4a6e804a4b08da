"""Skip reasons for GPU tests, stated once."""

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
