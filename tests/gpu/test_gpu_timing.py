"""The timer's two launch modes on a GPU: ``queued`` hides the host's launch cost, ``synced`` counts it."""

import pytest

from gpu_support import require

pytestmark = pytest.mark.gpu


def test_queued_mode_excludes_host_launch_cost():
    require(1)
    import torch

    from moepolicy.measure.timing import Timer

    device = torch.device("cuda", 0)
    x = torch.ones(16, device=device)

    def many_tiny_launches():  # 60 launches of a kernel that runs for about a microsecond
        for _ in range(60):
            x.add_(1)

    timer = Timer(device, collective=False)
    synced = sorted(timer.samples(many_tiny_launches, reps=9, mode="synced"))[4]
    queued = sorted(timer.samples(many_tiny_launches, reps=9, mode="queued"))[4]
    # the host needs several microseconds per launch; the GPU about one: queued must be well below
    assert queued < 0.8 * synced, (queued, synced)
    with pytest.raises(ValueError, match="launch mode"):
        timer.samples(many_tiny_launches, reps=1, mode="bogus")
