"""What the overlap objective's expert GEMM is: its size, kernel kind and confinement. Plain data
(no torch): the coordinator builds it and hands it to the GPU workers."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GemmShape:
    rows: int
    hidden: int
    out: int
    # persistent: block-fp8 grouped kernel on exactly the GEMM's SMs (moepolicy.measure.persistent_gemm);
    # persistent-clustered: the same launched as 2-CTA thread-block clusters (as DeepGEMM's multicast
    # launches are), so it holds its SMs in pairs; grouped: torch's fp8 grouped GEMM with row-wise
    # scales; dense: one fp8 GEMM over all rows
    kind: str = "persistent"
    # grid: no green context — only a persistent kernel's grid limits it, as in serving, where the
    # expert GEMM is told how many SMs to use (DeepGEMM's num_sms) and nothing else is confined;
    # green: the GEMM runs in a green context of its SMs (an idealised partition, for analysis)
    confine: str = "grid"
