"""The trial lifecycle calls that optuna's ``Study`` cannot make, on the storage directly: the one
home for them, so an optuna upgrade that changes them breaks here and in one test
(tests/tuning/test_trial_storage.py), not silently across the tuner.

Why the storage: the tuner asks and tells through ``study.ask()`` / ``study.tell()`` (several
workers, one study). Three things that leaves out:

- heartbeats: optuna records them only inside ``study.optimize``; with ask/tell a worker records its
  own (``record_heartbeat``) so ``optuna.storages.fail_stale_trials`` can fail a dead worker's trial;
- failing another worker's trial that was left RUNNING (kill -9), with a reason: ``study.tell`` can
  fail it, but no public call sets a user attribute on a trial this process did not ask;
- a trial's storage id, which ``optuna.trial.Trial`` hides (the two calls above take it).

Checked on optuna 5.1 (``CHECKED_OPTUNA``): ``BaseStorage.get_study_id_from_name``,
``get_trial_id_from_study_id_trial_number``, ``set_trial_user_attr``, ``set_trial_state_values``,
``BaseHeartbeat.record_heartbeat`` and ``optuna.storages.fail_stale_trials``.
"""

from __future__ import annotations

import signal
import threading
import warnings

# [lowest checked, first not checked): the versions these calls were run on
CHECKED_OPTUNA = ("5.1", "6")


def trial_id(storage, study_name: str, number: int) -> int:
    """The storage's id of trial ``number`` in ``study_name``."""
    return storage.get_trial_id_from_study_id_trial_number(
        storage.get_study_id_from_name(study_name), number
    )


def fail_trial(storage, study_name: str, number: int, reason: str) -> None:
    """Fail another worker's RUNNING trial ``number``, saying why (user attributes ``reason`` and
    ``orphan``: the budget does not count it)."""
    import optuna

    tid = trial_id(storage, study_name, number)
    storage.set_trial_user_attr(tid, "reason", reason)
    storage.set_trial_user_attr(tid, "orphan", True)
    storage.set_trial_state_values(tid, state=optuna.trial.TrialState.FAIL)


def heartbeat(storage, tid: int, stop: threading.Event, every_s: float = 5.0) -> None:
    """Record the heartbeat of the trial whose storage id is ``tid`` every ``every_s`` until ``stop``
    (a storage without heartbeats: nothing; a missed beat only delays stale-trial detection)."""
    # Ctrl-C and SIGTERM go to the main thread: one that lands on this thread would leave the main
    # thread in its measurement's wait (a sleep, a pipe) until that ended on its own
    # (only on its own thread: a mask set on the main thread would be inherited by every process it
    # starts, which then never sees a signal)
    if (
        hasattr(signal, "pthread_sigmask")
        and threading.current_thread() is not threading.main_thread()
    ):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
    record = getattr(storage, "record_heartbeat", None)
    if record is None:
        return
    while not stop.wait(every_s):
        try:
            record(tid)
        except Exception:  # noqa: BLE001
            pass


def fail_stale_trials(study) -> None:
    """optuna's own: fail RUNNING trials whose heartbeat stopped (storages without heartbeats: nothing)."""
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # experimental-API warning
        try:
            optuna.storages.fail_stale_trials(study)
        except Exception:  # noqa: BLE001 (storages without heartbeats)
            pass
