"""Links for testing ``validate --live``'s own checks: the emulated all-to-all (CPUs) or DeepEP (GPUs)
with one received byte flipped, and one whose rank 1 never answers (a hung collective)."""

from __future__ import annotations

import time

from moepolicy.preflight.rank import DeepEPLink, EmulatedLink


class _FlipOneByte:
    def __init__(self, inner):
        self.inner = inner
        self.rank, self.world, self.num_experts = inner.rank, inner.world, inner.num_experts

    def dispatch(self, x, scales, topk_idx, topk_weights):
        got = self.inner.dispatch(x, scales, topk_idx, topk_weights)
        if self.rank == 1 and got.x.shape[0]:
            raw = got.x.contiguous().view(-1).view(__import__("torch").uint8)
            raw[0] ^= 1
        return got

    def combine(self, y, handle):
        return self.inner.combine(y, handle)


class CorruptingLink(EmulatedLink):
    """Rank 1 receives one byte flipped in every dispatch."""

    def transport(self, plan, case):
        return _FlipOneByte(super().transport(plan, case))


class HangingLink(EmulatedLink):
    """Rank 1 stops answering before its first dispatch."""

    def transport(self, plan, case):
        import torch.distributed as dist

        if dist.get_rank() == 1:
            time.sleep(3600)
        return super().transport(plan, case)


class CorruptingDeepEPLink(DeepEPLink):
    """DeepEP's own dispatch, then one byte flipped in what rank 1 received: the checks must see it."""

    def transport(self, plan, case):
        return _FlipOneByte(super().transport(plan, case))
