"""The storage calls the tuner makes outside optuna's Study API (moepolicy/tuning/trial_storage.py)
were checked on a range of optuna versions: the installed one must be in it, and the calls must
still do what the tuner relies on."""

import threading

import pytest

optuna = pytest.importorskip("optuna", reason="tuning needs optuna")

from moepolicy.tuning.trial_storage import CHECKED_OPTUNA, fail_trial, heartbeat, trial_id  # noqa: E402


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:2] if part.isdigit())


def test_the_installed_optuna_is_in_the_range_the_storage_calls_were_checked_on():
    low, high = CHECKED_OPTUNA
    installed = _version(optuna.__version__)
    assert _version(low) <= installed < _version(high), (
        f"optuna {optuna.__version__} is outside {low} <= v < {high}: check moepolicy/tuning/trial_storage.py's "
        "storage calls on it, then widen CHECKED_OPTUNA"
    )


def test_another_workers_running_trial_is_failed_with_its_reason(tmp_path):
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/s.db", heartbeat_interval=1)
    study = optuna.create_study(study_name="s", storage=storage)
    asked, other = study.ask(), study.ask()
    assert trial_id(storage, "s", other.number) == other._trial_id
    stop = threading.Event()
    stop.set()
    heartbeat(storage, trial_id(storage, "s", asked.number), stop)  # returns at once when stopped
    fail_trial(storage, "s", other.number, "worker process 1 is gone")
    failed = study.trials[other.number]
    assert failed.state == optuna.trial.TrialState.FAIL
    assert failed.user_attrs == {"reason": "worker process 1 is gone", "orphan": True}
    assert study.trials[asked.number].state == optuna.trial.TrialState.RUNNING


def test_the_heartbeat_blocks_signals_on_its_own_thread_only(tmp_path):
    """Its thread keeps Ctrl-C and SIGTERM for the main thread; run on the main thread it changes
    nothing (a blocked mask there is inherited by every process it starts, which then never sees a
    signal: CI's signal tests ran their tunes to the end after this test had run)."""
    import signal

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/s.db", heartbeat_interval=1)
    study = optuna.create_study(study_name="s", storage=storage)
    tid = trial_id(storage, "s", study.ask().number)
    stop = threading.Event()
    stop.set()
    before = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    heartbeat(storage, tid, stop)
    assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) == before
    seen = {}

    def beat_and_look():
        heartbeat(storage, tid, stop)
        seen["mask"] = signal.pthread_sigmask(signal.SIG_BLOCK, set())

    thread = threading.Thread(target=beat_and_look)
    thread.start()
    thread.join()
    assert {signal.SIGINT, signal.SIGTERM} <= seen["mask"]
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())
