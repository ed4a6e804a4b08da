"""Ctrl-C and SIGTERM held back across a few storage steps that must not be split.

Between optuna's ``ask`` and the trial's owner attributes, an interrupt would leave a RUNNING trial
that no process can prove it owns (another worker may be about to claim a trial that young). Inside
:func:`deferred` the signal is recorded and delivered when the block ends, through the handler that
was in place before (the CLI turns SIGTERM into an exception as Ctrl-C is).
"""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Iterator

_SIGNALS = (signal.SIGINT, signal.SIGTERM) + (
    (signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ()
)


@contextmanager
def deferred() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread receives signals
        return
    pending: list[int] = []
    previous = {
        s: signal.signal(s, lambda signum, frame: pending.append(signum)) for s in _SIGNALS
    }
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if pending:
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
