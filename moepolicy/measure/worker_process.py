"""What keeps a rank process (``measure.ranks``: the live tune's DeepEP ranks, ``bench``'s) the
supervisor's: Ctrl-C (which a terminal sends to the whole process group) is blocked while the ranks
start, then ignored by a quiet rank (its supervisor stops or kills the group, and no rank prints a
traceback); and a rank never outlives its supervisor: when the supervisor dies without ending its
workers (SIGKILL, the OOM killer, a lost ssh session), its end of the pipe that multiprocessing
gives each spawned process closes, and the worker exits at once instead of waiting for commands (or
for peers) forever, holding its GPU and DeepEP buffers.
"""

from __future__ import annotations

import os

ORPHANED_EXIT = 3  # the exit code of a worker whose supervisor died


def exit_with_parent() -> None:
    """In a process started by multiprocessing (spawn): exit as soon as its parent is gone. A thread
    waits on the parent's sentinel (the read end of a pipe whose write end only the parent holds:
    it reads end-of-file when the parent dies, however it dies)."""
    import multiprocessing
    import threading

    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()  # returns once the sentinel reads end-of-file
        os._exit(ORPHANED_EXIT)

    threading.Thread(target=watch, name="moepolicy-parent-watch", daemon=True).start()


class sigint_blocked:
    """Block SIGINT in this thread while worker processes start: a process inherits the mask, so a
    Ctrl-C while one starts (its interpreter and imports, before the rank's entry runs) does not
    reach it; the supervisor still gets the Ctrl-C (another thread, or once the block ends)."""

    def __enter__(self):
        import signal
        from multiprocessing import resource_tracker

        # multiprocessing starts its resource tracker on first use and then *unblocks* SIGINT in the
        # calling thread: started before the block, it cannot undo it while the workers start
        resource_tracker.ensure_running()
        self._old = (
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            if hasattr(signal, "pthread_sigmask")
            else None
        )
        return self

    def __exit__(self, *exc) -> None:
        import signal

        if self._old is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, self._old)
