"""``moepolicy bench``: the MoE step (dispatch → expert GEMM stand-in → combine) with a policy against
vLLM's choices and DeepEP's defaults. ``arms`` says what each side runs (torch-free); ``measure``
times it on DeepEP or the emulated all-to-all (torch)."""
