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


def gpu_here() -> str:
    """The ``--gpu`` name of the GPU these tests run on (moepolicy's own reading of it), so that what
    they plan is for the card at hand: a policy for another card is refused by ``validate --live``,
    as it should be. H200 where moepolicy has no datasheet for the card (that run then says so)."""
    from moepolicy.target import visible_gpu

    return visible_gpu()[0] or "h200"


# EP sizes the multi-rank DeepEP tests run at (ranks share the GPUs where fewer are visible)
WORLDS = (2, 4, 8)


def shared(world: int) -> bool:
    """Do ``world`` ranks share GPUs here (then timing relations are not checked)."""
    import torch

    return torch.cuda.device_count() < world


def ranks_env(world: int) -> tuple[dict, bool]:
    """(environment, shared) for a CLI run of ``world`` ranks here: with a GPU per rank, the
    ordinary environment; with fewer GPUs, the test-only switch that lets the ranks share them (a
    functional run, labelled so, never a measurement)."""
    import os

    from moepolicy.tuning.bench_source import SHARED_RANKS_ENV

    shared_here = shared(world)
    env = {**os.environ, "MOEPOLICY_OFFLINE": "1"}
    if shared_here:
        env[SHARED_RANKS_ENV] = "1"
    else:
        env.pop(SHARED_RANKS_ENV, None)
    return env, shared_here


# wall-clock limits of one CLI run, by EP size: 8 ranks time-slicing one GPU are the slow case
# (a shared-ranks tune at EP 8 took ~8 minutes at 20 repetitions, 2026-12-03, 1 x H200)
CLI_TIMEOUT_S = {2: 600, 4: 900, 8: 1200}


def moepolicy_cli(args, env: dict, world: int):
    """``python -m moepolicy ARGS`` under the limit for ``world`` ranks."""
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "moepolicy", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=CLI_TIMEOUT_S[world],
    )
