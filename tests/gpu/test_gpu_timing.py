"""The timer's launch modes on a GPU: ``queued`` hides the host's launch cost, ``synced`` counts it,
``runahead`` hides it behind the previous call's GPU work but keeps the host's waits."""

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


def test_runahead_hides_launches_behind_the_previous_call_but_not_the_hosts_waits():
    """A call = 40 tiny launches (the host's cost: a few microseconds each, the GPU's about one) then
    300 us of GPU work. ``synced`` pays the launches every time; ``runahead`` enqueues the next call's
    launches while the GPU runs this call's 300 us, so it lands near ``queued``. With a host wait in
    the call (as DeepEP's dispatch waits for its counts), running ahead hides nothing."""
    require(1)
    import torch

    from moepolicy.measure.timing import RUN_AHEAD_CALLS, Timer

    device = torch.device("cuda", 0)
    x = torch.ones(16, device=device)
    timer = Timer(device, collective=False)
    work = timer._spin_cycles(300.0)

    def launches_then_work():
        for _ in range(40):
            x.add_(1)
        torch.cuda._sleep(work)

    def work_then_wait_then_launches():
        torch.cuda._sleep(work)
        torch.cuda.current_stream(device).synchronize()  # the host waits, as for DeepEP's counts
        for _ in range(40):
            x.add_(1)

    def median(fn, mode):
        return sorted(timer.samples(fn, reps=9, mode=mode))[4]

    synced, runahead, queued = (
        median(launches_then_work, m) for m in ("synced", "runahead", "queued")
    )
    print(
        f"launches then work: synced {synced:.1f} us, runahead {runahead:.1f} us, queued {queued:.1f} us"
    )
    hidden = synced - queued  # the launch cost queued hides
    assert hidden > 30.0, (synced, queued)
    # runahead hides all but the first call's launches: at most 1/RUN_AHEAD_CALLS of them + slack
    assert runahead < queued + hidden / RUN_AHEAD_CALLS + 0.25 * hidden, (synced, runahead, queued)
    waits = [median(work_then_wait_then_launches, m) for m in ("synced", "runahead")]
    print(f"work, host wait, launches: synced {waits[0]:.1f} us, runahead {waits[1]:.1f} us")
    assert waits[1] > 0.85 * waits[0], waits  # the wait serialises: nothing to run ahead of
