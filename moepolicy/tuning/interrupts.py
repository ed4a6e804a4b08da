"""Ctrl-C and SIGTERM held back across a few storage steps that must not be split.

Between optuna's ``ask`` and the trial's owner attributes, an interrupt would leave a RUNNING trial
that no process can prove it owns (another worker may be about to claim a trial that young). Inside
:func:`deferred` the signal is recorded and delivered when the block ends, through the handler that
was in place before (the CLI turns SIGTERM into an exception as Ctrl-C is).

A storage step takes milliseconds; one that does not end (a database server that stopped answering)
must not hold an interrupt forever: a second signal is delivered at once, inside the block, and so is
the first once the block has lasted ``HOLD_MAX_S``.
"""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Any, Iterator

_SIGNALS = (signal.SIGINT, signal.SIGTERM) + (
    (signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ()
)
HOLD_MAX_S = 10.0  # an interrupt is held back at most this long


@contextmanager
def deferred() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread receives signals
        return
    import time

    pending: list[int] = []
    delivered: list[int] = []
    lock, active, started = threading.Lock(), [True], time.monotonic()
    timers: list[threading.Timer] = []

    def resend(signum: int) -> None:  # held too long: the signal again, which delivers it
        main = threading.main_thread().ident  # set: the main thread is running (it started this)
        with lock:
            if active[0] and main is not None:
                signal.pthread_kill(main, signum)

    def hold(signum: int, frame) -> None:
        pending.append(signum)
        left = HOLD_MAX_S - (time.monotonic() - started)
        if len(pending) == 1 and left > 0:
            timers.append(threading.Timer(left, resend, args=(signum,)))
            timers[0].daemon = True
            timers[0].start()
            return
        delivered.append(pending[0])
        _deliver(pending[0], previous[pending[0]])

    previous: dict[int, Any] = {s: signal.signal(s, hold) for s in _SIGNALS}  # the handlers held
    try:
        yield
    finally:
        with lock:
            active[0] = False
        for timer in timers:
            timer.cancel()
        for s, handler in previous.items():
            signal.signal(s, handler)
        if pending and not delivered:
            _deliver(pending[0], previous[pending[0]])


def _deliver(signum: int, handler) -> None:
    if callable(handler):
        handler(signum, None)
    elif handler == signal.SIG_IGN:
        return
    elif signum == signal.SIGINT:
        raise KeyboardInterrupt
    else:
        os.kill(os.getpid(), signum)  # the default action, now that the block is done
