"""How far FlashInfer's SM90 CUTLASS fused-MoE module (``fused_moe_90``) gets in a bounded build on a
GPU machine: its JIT spec's sources, then ninja for ``BUDGET_S`` seconds, reporting steps finished.

vLLM's default experts for block fp8 on Hopper with DeepEP are FlashInfer CUTLASS; no prebuilt SM90 MoE module exists on the package
index, so timing them first needs this build (issue 41). On the device, with flashinfer-python 0.7.4's
installed tree unpacked at FI_ROOT, its small pure-Python requirements (ninja, filelock, einops,
tabulate, nvidia-ml-py, click, tqdm, requests, packaging) and apache-tvm-ffi for the device's Python
on ``PYTHONPATH``, and ``FLASHINFER_WORKSPACE_BASE`` in a git-ignored folder (kept while the machine
stays warm, so a later call resumes)::

    MAX_JOBS=16 python3 benchmarks/flashinfer_build_probe.py FI_ROOT BUDGET_S

The package's ``__init__`` imports every op (and their optional dependencies); only its JIT spec is
needed here, so the package is entered without it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path


def main(root: Path, budget_s: float) -> None:
    package = types.ModuleType("flashinfer")
    package.__path__ = [str(root / "flashinfer")]
    sys.modules["flashinfer"] = package
    from flashinfer.jit.fused_moe import gen_cutlass_fused_moe_sm90_module

    started = time.time()
    spec = gen_cutlass_fused_moe_sm90_module()
    print(f"{spec.name}: {len(spec.sources)} sources, spec in {time.time() - started:.1f} s")
    spec.write_ninja()
    jobs = os.environ.get("MAX_JOBS", "16")
    command = ["ninja", "-C", str(spec.build_dir), "-f", str(spec.ninja_path), "-j", jobs]
    started, done, total = time.time(), 0, 0
    build = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert build.stdout is not None
    try:
        for line in build.stdout:
            if line.startswith("[") and "/" in line.split("]", 1)[0]:
                done, total = (int(n) for n in line[1:].split("]", 1)[0].split("/"))
                if done % 10 == 0 or done == total:
                    print(f"{time.time() - started:6.0f} s  {done}/{total}", flush=True)
            elif "error" in line.lower():
                print(line.rstrip()[:300], flush=True)
            if time.time() - started > budget_s:
                break
    finally:
        if build.poll() is None:  # SIGINT: ninja removes the outputs it had not finished
            build.send_signal(signal.SIGINT)
            try:
                build.wait(timeout=20)
            except subprocess.TimeoutExpired:
                build.kill()
    print(
        f"RESULT: {done} of {total} ninja steps in {time.time() - started:.0f} s with -j {jobs}; "
        f"ninja exit {build.wait()}"
    )
    library = Path(spec.jit_library_path)
    print(f"module {library}: {'built' if library.exists() else 'not built'}")
    out = os.environ.get("OUT")
    if library.exists() and out:
        subprocess.run(
            ["tar", "czf", f"{out}/fused_moe_90.tgz", "-C", str(library.parent), library.name]
        )


if __name__ == "__main__":
    main(Path(sys.argv[1]), float(sys.argv[2]))
