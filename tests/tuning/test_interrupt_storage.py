"""An interrupt never lands inside a storage call while a trial of the tune is RUNNING.

A Ctrl-C or SIGTERM that lands inside SQLAlchemy can leave the query's SQLite lock held by this
process; failing the interrupted trial afterwards then waits for that lock and fails, and the trial
stays RUNNING (a CI run on a loaded 2-core machine left one so). Here a real SQLite storage sends this
process SIGINT from inside its N-th call, for every N of a short sub-study, with the CLI's own
handlers installed: the handler must never run inside a storage call while a trial is RUNNING, and no
trial may be left RUNNING once the sub-study has ended.
"""

import signal
import sqlite3

import pytest

optuna = pytest.importorskip("optuna", reason="tuning needs optuna")

from moepolicy.cli.main import install_signal_handlers  # noqa: E402
from moepolicy.tuning.bench import Workload  # noqa: E402
from moepolicy.tuning.model_bench import ModelBench  # noqa: E402
from moepolicy.tuning.space import load_space  # noqa: E402
from moepolicy.tuning.study import BucketResult, SubStudy, tune_bucket  # noqa: E402

pytestmark = pytest.mark.slow  # one short sub-study per storage call (about 200): ~45 s on 2 cores

DEFAULT = ((24, 256, 6, 132), (10, 256, 6, 132))
TRIALS = 4


def _running(db) -> int:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT count(*) FROM trials WHERE state = 'RUNNING'").fetchone()[0]


class SignalInsideCall(optuna.storages.RDBStorage):
    """A real SQLite storage that raises SIGINT in this process from inside its ``at``-th call
    (``at`` 0: never), and records where the handler ran if it ran inside a call."""

    def __init__(self, url: str, db, at: int):
        super().__init__(url)
        self.db, self.at, self.calls, self.landed = db, at, 0, []

    def _after(self, name: str) -> None:
        self.calls += 1
        if self.calls != self.at:
            return
        try:
            signal.raise_signal(signal.SIGINT)
            self.calls += 0  # a bytecode boundary: a handler that is not held back runs by here
        except KeyboardInterrupt:
            self.landed.append((name, _running(self.db)))
            raise


def _wrapped(name: str):
    method = getattr(optuna.storages.RDBStorage, name)

    def call(self, *args, **kwargs):
        result = method(self, *args, **kwargs)
        self._after(name)
        return result

    return call


for _name, _value in list(vars(optuna.storages.RDBStorage).items()):
    if (
        callable(_value)
        and not _name.startswith("__")
        and _name not in ("_set_default_engine_kwargs_for_mysql", "_fill_storage_url_template")
    ):
        setattr(SignalInsideCall, _name, _wrapped(_name))


def _tune(db, at: int) -> SignalInsideCall:
    storage = SignalInsideCall(f"sqlite:///{db}", db, 0)
    storage.calls, storage.at = (
        0,
        at,
    )  # counted from the sub-study's first call, not the storage's set-up
    bucket = BucketResult(4096, 1.0)
    try:
        tune_bucket(
            storage,
            SubStudy(f"s{at}", 24, TRIALS, DEFAULT),
            ModelBench("h200"),
            Workload(7168, 256, 8, 2, "fp8"),
            load_space(),
            bucket,
        )
    except KeyboardInterrupt:
        pass
    assert _running(db) == 0, f"interrupt at storage call {at}: a trial was left RUNNING"
    return storage


def test_no_interrupt_lands_inside_a_storage_call_of_a_running_trial(tmp_path):
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    install_signal_handlers()
    try:
        db = tmp_path / "studies.db"
        total = _tune(db, at=0).calls  # how many storage calls a whole sub-study makes
        assert total > 3 * TRIALS
        for at in range(1, total + 1):
            storage = _tune(db, at)
            inside = [(name, running) for name, running in storage.landed if running]
            assert not inside, (
                f"interrupt at storage call {at} ran inside {inside[0][0]} with a trial RUNNING"
            )
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
