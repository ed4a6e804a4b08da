"""Reference implementations (torch): a DeepEP transport and a prepare/finalize that applies a
policy's per-layer order. Kept out of ``moepolicy.runtime``, which serving processes import and
which stays free of torch."""
