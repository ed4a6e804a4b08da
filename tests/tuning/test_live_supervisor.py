"""The live bench's supervised worker group on CPUs, with a fake DeepEP that hangs, dies, raises
and answers NaN on given trials: each becomes a FAIL trial with its reason and the study goes on."""

import time

import pytest

optuna = pytest.importorskip("optuna", reason="tuning needs optuna")

from moepolicy.testing.fake_deepep import FakeWorker  # noqa: E402
from moepolicy.tuning.bench import Workload  # noqa: E402
from moepolicy.tuning.live_bench import LiveBench  # noqa: E402
from moepolicy.tuning.space import load_space  # noqa: E402
from moepolicy.tuning.study import BucketResult, SubStudy, tune_bucket  # noqa: E402

DEFAULT = ((24, 256, 6, 132), (10, 256, 6, 132))


def test_faults_become_fail_trials_and_the_group_restarts(monkeypatch):
    # faults are keyed by the bench's running measurement number (LiveBench._token)
    faults = {2: "hang", 4: "die", 6: "raise", 7: "nan", 9: "negative", 10: "tiny"}
    bench = LiveBench(
        2, 1 << 20, trial_timeout_s=3.0, start_timeout_s=60, worker=FakeWorker(faults)
    )
    storage = optuna.storages.InMemoryStorage()
    bucket = BucketResult(4096, 1.0)
    started = time.monotonic()
    try:
        tune_bucket(
            storage,
            SubStudy("sup", 24, 12, DEFAULT),
            bench,
            Workload(7168, 256, 8, 2, "fp8"),
            load_space(),
            bucket,
        )
    finally:
        bench.close()
    study = optuna.load_study(study_name="sup", storage=storage)
    failed = {
        t.number: t.user_attrs.get("reason", "")
        for t in study.trials
        if t.state == optuna.trial.TrialState.FAIL
    }
    reasons = " | ".join(failed.values())
    assert "no answer within the watchdog" in reasons
    assert "worker died" in reasons
    assert "injected host assert" in reasons
    assert "not a finite number" in reasons
    assert "is not a plausible DeepEP time" in reasons  # negative and absurdly small
    assert len(failed) == 6, failed
    assert len([t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]) >= 5
    assert bench.restarts >= 3  # hang, die and the host assert each cost the group
    assert time.monotonic() - started < 120
