"""GPU facts for the runtime without importing torch: from modules already imported, or NVML.

NVML is reached through ctypes (libnvidia-ml ships with the driver); where it is missing the answer
is 'unknown' and the key part stays unchecked.
"""

from __future__ import annotations

import ctypes
import sys
from functools import lru_cache
from typing import Optional


@lru_cache(maxsize=1)
def _nvml() -> Optional[ctypes.CDLL]:
    for name in ("libnvidia-ml.so.1", "libnvidia-ml.so"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        if lib.nvmlInit_v2() == 0:
            return lib
    return None


@lru_cache(maxsize=1)
def nvml_gpus() -> tuple[str, ...]:
    """Names of the visible GPUs ('NVIDIA H200', ...), empty when NVML is unavailable."""
    lib = _nvml()
    if lib is None:
        return ()
    count = ctypes.c_uint(0)
    if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
        return ()
    names = []
    for i in range(count.value):
        handle = ctypes.c_void_p()
        if lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) != 0:
            continue
        buf = ctypes.create_string_buffer(96)
        if lib.nvmlDeviceGetName(handle, buf, 96) == 0:
            names.append(buf.value.decode(errors="replace"))
    return tuple(names)


NVML_P2P_CAPS_INDEX_NVLINK = 2  # nvmlGpuP2PCapsIndex_t
NVML_P2P_STATUS_OK = 0


def nvml_nvlink(a: int, b: int) -> Optional[bool]:
    """Are NVML devices ``a`` and ``b`` (NVML's indices) peers over NVLink; None when NVML cannot say."""
    lib = _nvml()
    if lib is None:
        return None
    handles = [ctypes.c_void_p(), ctypes.c_void_p()]
    for index, handle in zip((a, b), handles):
        if lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0:
            return None
    status = ctypes.c_int(-1)
    if (
        lib.nvmlDeviceGetP2PStatus(
            handles[0], handles[1], NVML_P2P_CAPS_INDEX_NVLINK, ctypes.byref(status)
        )
        != 0
    ):
        return None
    return status.value == NVML_P2P_STATUS_OK


@lru_cache(maxsize=1)
def nvml_arch() -> Optional[str]:
    lib = _nvml()
    if lib is None:
        return None
    handle = ctypes.c_void_p()
    if lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle)) != 0:
        return None
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    if (
        lib.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major), ctypes.byref(minor))
        != 0
    ):
        return None
    return f"sm{major.value}{minor.value}" if major.value < 10 else f"sm{major.value}0"


def current_arch() -> tuple[Optional[str], str]:
    """(arch, how it was found): torch if this process already imported and initialised CUDA,
    else NVML, else unknown. Never imports torch."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                major, minor = torch.cuda.get_device_capability()
                return (
                    f"sm{major}{minor}" if major < 10 else f"sm{major}0"
                ), "torch (already imported)"
        except Exception:  # noqa: BLE001
            pass
    arch = nvml_arch()
    return (arch, "NVML") if arch else (None, "no GPU information in this process")
