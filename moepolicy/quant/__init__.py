"""fp8 activation quantization: a torch reference (CPU and GPU) and fused Triton kernels (GPU).

Both compute, per group of ``g`` values of a row: ``amax = max(|x|)`` (floored at ``EPS``),
``scale = amax / 448`` (rounded up to a power of two for UE8M0), ``q = fp8(clamp(x / scale))``,
with IEEE float32 division, so the two are bit-identical. Scales are written row-major
``[T, ceil(H/g)]`` float32 (what DeepEP dispatch carries); the column-major, TMA-aligned layout
block GEMM kernels want is a separate step (:func:`reference.to_col_major_tma`).
"""
