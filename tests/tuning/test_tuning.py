"""The tuner on CPUs: search space, feasibility, dedup, FAIL trials, fingerprint refusal, resume
after kill -9, Ctrl-C, atomic output, the model bench, and the bench contract."""

import os
import signal
import subprocess

import pytest

from conftest import Watched, cli_command

optuna = pytest.importorskip(
    "optuna", reason="tuning tests need optuna (pip install 'moepolicy[tune]')"
)

from moepolicy.testing.bench_contract import BenchContract  # noqa: E402
from moepolicy.tuning.bench import Bench, Measurement, TrialFailed, TunePoint, Workload  # noqa: E402
from moepolicy.tuning.model_bench import ModelBench  # noqa: E402
from moepolicy.tuning.space import load_space  # noqa: E402
from moepolicy.tuning.study import BucketResult, SubStudy, tune_bucket  # noqa: E402

from conftest import run_cli  # noqa: E402

DEFAULT = ((24, 256, 6, 132), (10, 256, 6, 132))
WORK = Workload(7168, 256, 8, 2, "fp8")


class TestModelBenchContract(BenchContract):
    @pytest.fixture
    def bench(self):
        return ModelBench("h200")

    @pytest.fixture
    def workload(self):
        return WORK


class CountingBench(Bench):
    """Wraps a bench; counts measurements; can be told to misbehave on given calls."""

    source = "modelled"

    def __init__(self, inner: Bench, faults: dict | None = None):
        self.inner, self.faults, self.calls, self.points = inner, faults or {}, 0, []

    def measure(self, workload, point):
        self.calls += 1
        self.points.append(point)
        fault = self.faults.get(self.calls)
        if fault == "raise":
            raise TrialFailed("injected: DeepEP host assert")
        m = self.inner.measure(workload, point)
        if fault == "nan":
            from moepolicy.tuning.bench import check_measurement

            return check_measurement(
                Measurement(float("nan"), m.dispatch_cached_us, m.combine_us, "modelled")
            )
        return m


def run_bucket(bench, trials, space=None, storage=None, name="s", seed=0):
    storage = storage or optuna.storages.InMemoryStorage()
    bucket = BucketResult(4096, 1.0)
    tune_bucket(
        storage,
        SubStudy(name, 24, trials, DEFAULT, seed=seed),
        bench,
        WORK,
        space or load_space(),
        bucket,
    )
    return bucket, optuna.load_study(study_name=name, storage=storage)


def test_space_proposes_only_feasible_points():
    space = load_space()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    budget = 128 * 1024 * 1024
    max_recv = space.max_nvl_recv(24, 7168, 2, budget)
    from moepolicy.deepep.buffers import nvl_bytes_hint

    for _ in range(300):
        trial = study.ask()
        for kind in ("dispatch", "combine"):
            send, recv, rsend, rrecv = space.suggest(
                trial, kind, internode=True, max_nvl_recv=max_recv
            )
            assert 0 < send < recv <= max_recv
            assert nvl_bytes_hint(24, recv, 7168 * 2, 2) <= budget
            assert rrecv % rsend == 0 and rsend <= rrecv // 2  # DeepEP's rounding already applied
        study.tell(trial, 1.0)


def test_sms_candidates_respect_budget_and_gpu():
    space = load_space()
    assert space.sms_candidates(132, 24) == [8, 12, 16, 20, 24]
    assert space.sms_candidates(132, 25)[-1] == 24
    assert max(space.sms_candidates(78, None)) <= 78


def test_default_is_measured_first_and_never_beaten_by_worse(tmp_path):
    bench = CountingBench(ModelBench("h200"))
    bucket, study = run_bucket(bench, 8)
    assert bench.points[0].dispatch == DEFAULT[0] and bench.points[0].combine == DEFAULT[1]
    assert bucket.best_measurement.objective("full") <= bucket.default_measurement.objective(
        "full"
    )


def test_effective_config_measured_once(tmp_path):
    import yaml

    raw = yaml.safe_load(open(load_space().path))
    raw["dispatch"]["nvl_send"] = {"low": 2, "high": 3}
    raw["dispatch"]["nvl_recv"] = {"choices": [256]}
    raw["combine"]["nvl_send"] = {"low": 9, "high": 10}
    raw["combine"]["nvl_recv"] = {"choices": [256]}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(raw))
    from moepolicy.tuning.space import load_space as load

    bench = CountingBench(ModelBench("h200"))
    bucket, study = run_bucket(bench, 12, space=load(str(path)))
    keys = [(p.dispatch, p.combine) for p in bench.points]
    assert len(keys) == len(set(keys))  # never measured twice
    assert len(set(keys)) <= 5 and bucket.deduplicated >= 12 - len(set(keys))
    assert len([t for t in study.trials if t.user_attrs.get("dedup")]) == bucket.deduplicated


def test_failed_and_nonsense_trials_are_fail_states_and_the_study_goes_on():
    bench = CountingBench(ModelBench("h200"), faults={2: "raise", 3: "nan"})
    bucket, study = run_bucket(bench, 6)
    states = [t.state for t in study.trials]
    assert states.count(optuna.trial.TrialState.FAIL) == 2
    assert states.count(optuna.trial.TrialState.COMPLETE) == 4
    reasons = [
        t.user_attrs.get("reason", "")
        for t in study.trials
        if t.state == optuna.trial.TrialState.FAIL
    ]
    assert any("injected" in r for r in reasons) and any(
        "not a finite number" in r for r in reasons
    )
    assert bucket.best is not None


def tune_args(tmp_path, *extra, study="s", out="p.yaml", trials=6):
    return (
        "tune",
        "--model",
        "DeepSeek-V3",
        "--ep-size",
        "2",
        "--gpu",
        "h200",
        "--bench",
        "model",
        "--sms",
        "20",
        "--tokens",
        "1024,4096",
        "--trials",
        str(trials),
        "--storage",
        f"sqlite:///{tmp_path}/studies.db",
        "--study",
        study,
        "-o",
        str(tmp_path / out),
        *extra,
    )


def test_tune_cli_model_bench_writes_a_loadable_modelled_policy(tmp_path):
    result = run_cli(*tune_args(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines()[0].startswith("bench: model (asked for the model bench)")
    from moepolicy import load_policy

    policy = load_policy(tmp_path / "p.yaml", ep_size=2, model="DeepSeek-V3")
    assert (
        not policy.is_fallback and policy.deepep.num_sms == 20
    )  # the SM count calibrated at 1024 tokens
    assert policy.deepep.source == "modelled"
    assert [b.max_tokens for b in policy.deepep.buckets] == [1024, None]
    import yaml

    doc = yaml.safe_load((tmp_path / "p.yaml").read_text())
    assert doc["deepep"]["provenance"]["source"] == "modelled"
    assert all(
        "measured" not in b and "modelled" in b and "search" in b for b in doc["deepep"]["buckets"]
    )


def test_outside_envelope_is_extrapolated_defaults(tmp_path):
    result = run_cli(
        "tune",
        "--model",
        "DeepSeek-V3",
        "--ep-size",
        "8",
        "--bench",
        "model",
        "--gpu",
        "h200",
        "-o",
        str(tmp_path / "p.yaml"),
        "--storage",
        f"sqlite:///{tmp_path}/s.db",
    )
    assert result.returncode == 0, result.stderr
    assert "no calibration for h200 EP8" in result.stderr
    import yaml

    doc = yaml.safe_load((tmp_path / "p.yaml").read_text())
    assert doc["deepep"]["provenance"]["source"] == "extrapolated"
    assert doc["deepep"]["num_sms"] == 20


def test_resume_with_another_target_is_refused(tmp_path):
    assert run_cli(*tune_args(tmp_path)).returncode == 0
    other = run_cli(
        "tune",
        "--model",
        "Qwen3-30B-A3B-FP8",
        "--ep-size",
        "2",
        "--gpu",
        "h200",
        "--bench",
        "model",
        "--sms",
        "20",
        "--tokens",
        "1024,4096",
        "--storage",
        f"sqlite:///{tmp_path}/studies.db",
        "--study",
        "s",
        "-o",
        str(tmp_path / "q.yaml"),
    )
    assert other.returncode == 7
    assert (
        "was made for another model" in other.stderr
        and len(other.stderr.strip().splitlines()) <= 3
    )


SECRET_URLS = [  # (url, what must be hidden, what must stay)
    ("postgresql://tuner:s3cret@db:5432/x", "s3cret", "postgresql://tuner:***@db:5432/x"),
    ("mysql+pymysql://u:s3cret@h/db", "s3cret", "h/db"),
    ("sqlite:///q.db?password=QuerySecretPW", "QuerySecretPW", "sqlite:///q.db"),
    ("postgresql://:OnlyPassPW@localhost:1/db", "OnlyPassPW", "localhost:1/db"),
    ("postgresql://localhost:1/db?user=alice&password=QueryPW", "QueryPW", "user=alice"),
    ("postgresql://alice:p@ssw0rdX@host/db", "ssw0rdX", "alice:***@host/db"),
    ("postgresql://alice:a:b/c@host/db?sslpassword=K3y&token=T0k", "K3y", "host/db"),
    ("postgresql://alice:a:b/c@host/db?sslpassword=K3y&token=T0k", "T0k", "host/db"),
    ("postgresql://alice:a:b/c@host/db?sslpassword=K3y&token=T0k", "a:b/c", "alice:***@host"),
]


@pytest.mark.parametrize("url, secret, kept", SECRET_URLS)
def test_storage_secrets_are_hidden_in_every_url_shape(url, secret, kept):
    from moepolicy.redact import redact_command, redact_url

    assert secret not in redact_url(url) and kept in redact_url(url)
    for argv in (["tune", "--storage", url], ["tune", f"--storage={url}"]):
        assert secret not in redact_command(argv)
    assert (
        redact_url("sqlite:////tmp/a@b/studies.db") == "sqlite:////tmp/a@b/studies.db"
    )  # a path, no user info


def test_a_storage_password_reaches_neither_the_policy_nor_stderr(tmp_path):
    out = tmp_path / "p.yaml"
    url = f"sqlite:///{tmp_path}/q.db?password=QuerySecretPW"
    result = run_cli(*tune_args(tmp_path, study="secret")[:-2], "--storage", url, "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert "QuerySecretPW" not in result.stderr and "QuerySecretPW" not in out.read_text()
    refused = run_cli(
        *tune_args(tmp_path, study="s2")[:-2],
        "--storage",
        "postgresql://u:Pw0rd@127.0.0.1:1/db",
        "-o",
        str(tmp_path / "q.yaml"),
    )
    assert (
        refused.returncode != 0
        and "Pw0rd" not in refused.stderr
        and "Traceback" not in refused.stderr
    )


# Events on a tune's stderr that the signal tests wait for (never a fixed sleep: under load a sleep
# lands in another phase). With -v a stored trial prints its time and the best so far.
FIRST_TRIAL = r" us \(best "
SEARCH_STARTS = r"^tuning hidden="


def completed_trials(db):
    storage = optuna.storages.RDBStorage(f"sqlite:///{db}")
    out = []
    for summary in optuna.get_all_study_summaries(storage):
        if "/sms" in summary.study_name:
            study = optuna.load_study(study_name=summary.study_name, storage=storage)
            out += [
                (summary.study_name, t.user_attrs.get("effective"), t.state.name)
                for t in study.trials
            ]
    return out


def test_kill_9_then_resume_loses_and_repeats_nothing(tmp_path):
    env = {**os.environ, "MOEPOLICY_OFFLINE": "1"}
    args = [
        *cli_command(model_bench_delay=0.4),
        *tune_args(tmp_path, study="k"),
    ]  # 12 trials: ~5 s
    out = tmp_path / "p.yaml"
    out.write_text("previous complete policy\n")
    proc = Watched([*args, "-v"], env=env)
    proc.wait_for(FIRST_TRIAL)  # a trial is stored: the kill lands inside the search
    proc.proc.send_signal(signal.SIGKILL)
    proc.finish()
    assert out.read_text() == "previous complete policy\n"  # never a partial file
    before = [t for t in completed_trials(tmp_path / "studies.db") if t[2] == "COMPLETE"]
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    after = completed_trials(tmp_path / "studies.db")
    complete = [t for t in after if t[2] == "COMPLETE"]
    assert set(before) <= set(complete)  # nothing completed was lost
    per_study = {}
    for name, eff, _state in complete:
        per_study.setdefault(name, []).append(eff)
    assert all(len(v) == 6 for v in per_study.values()), per_study  # the budget, not more
    assert out.read_text().startswith("schema_version")


@pytest.mark.parametrize(
    "sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)]
)
def test_an_interrupted_tune_writes_a_partial_result_marked_so(tmp_path, sig, code):
    env = {**os.environ, "MOEPOLICY_OFFLINE": "1"}
    args = [*cli_command(model_bench_delay=0.15), *tune_args(tmp_path, "-v", study="c", trials=40)]
    proc = Watched(args, env=env)
    proc.wait_for(FIRST_TRIAL)  # something measured: there is a partial result to write
    proc.proc.send_signal(sig)
    err = proc.finish(timeout=60)
    assert proc.returncode == code, err
    assert "Traceback" not in err
    # no table of kept configs was printed (nothing re-measured): the closing line cites none
    assert "not re-measured (interrupted)" in err and "the configs above" not in err, err
    assert "the search's best configs so far (modelled, interrupted" in err, err
    import yaml

    from moepolicy import load_policy

    out = tmp_path / "p.yaml"
    doc = yaml.safe_load(out.read_text())
    assert doc["deepep"]["partial"]["reason"].startswith("interrupted")
    validated = run_cli("validate", str(out))
    assert validated.returncode != 0 and "a partial result" in validated.stderr
    policy = load_policy(out, ep_size=2)
    assert (
        policy.is_fallback
        and "partial result" in policy.fallback_reason
        and policy.deepep.is_default
    )
    with pytest.raises(Exception, match="partial result"):
        load_policy(out, ep_size=2, strict=True)
    # the storage's trials are all finished: nothing is left RUNNING after the signal
    assert not [t for t in completed_trials(tmp_path / "studies.db") if t[2] == "RUNNING"]


def test_an_interrupted_tune_never_replaces_a_complete_policy(tmp_path):
    env = {**os.environ, "MOEPOLICY_OFFLINE": "1"}
    complete = run_cli(*tune_args(tmp_path, study="first", trials=2))
    assert complete.returncode == 0, complete.stderr
    out = tmp_path / "p.yaml"
    before = out.read_text()
    args = [
        *cli_command(model_bench_delay=0.15),
        *tune_args(tmp_path, "-v", study="second", trials=40),
    ]
    proc = Watched(args, env=env)
    proc.wait_for(FIRST_TRIAL)
    proc.proc.send_signal(signal.SIGINT)
    err = proc.finish(timeout=60)
    assert proc.returncode == 130, err
    assert out.read_text() == before  # the complete policy is kept
    assert "partial" in yaml_load(tmp_path / "p.partial.yaml")["deepep"]


def yaml_load(path):
    import yaml

    return yaml.safe_load(path.read_text())


def test_atomic_write_keeps_the_previous_file_on_failure(tmp_path, monkeypatch):
    from moepolicy.document import yaml_io as document
    from moepolicy.errors import OutputError

    target = tmp_path / "p.yaml"
    target.write_text("old\n")

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(document.os, "replace", boom)
    with pytest.raises(OutputError, match="previous file is kept"):
        document.atomic_write(target, "new\n")
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["p.yaml"]


def test_model_bench_close_to_calibration_points():
    """The fitted model stays within 25 % of every measured anchor it was fitted to."""
    from moepolicy.tuning.model_bench import load_calibrations

    bench = ModelBench("h200")
    for hidden, experts, dtype, sms, us in [
        (7168, 256, "fp8", 24, 245),
        (7168, 256, "bf16", 8, 976),
        (2048, 128, "fp8", 48, 109),
        (2048, 128, "bf16", 20, 240),
    ]:
        m = bench.measure(Workload(hidden, experts, 8, 2, dtype), TunePoint(sms, 4096, *DEFAULT))
        assert abs(m.dispatch_cached_us - us) / us < 0.25, (
            hidden,
            dtype,
            sms,
            m.dispatch_cached_us,
            us,
        )
    assert load_calibrations()[0].files


def test_a_trial_killed_before_its_owner_was_recorded_is_failed_not_counted(tmp_path):
    """kill -9 between a trial's ask and its first attribute leaves a RUNNING trial with no owner. A
    resume right after it waits out the grace period, then fails it: it must not hold a budget slot.
    One claimed during the wait (another worker's) is left alone."""
    import threading

    import optuna

    from moepolicy.tuning.study import ORPHAN_GRACE_S, _budget_used, _fail_orphans

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/s.db")
    study = optuna.create_study(storage=storage, study_name="orphans")
    killed, claimed = study.ask(), study.ask()
    timer = threading.Timer(ORPHAN_GRACE_S / 4, lambda: claimed.set_user_attr("pid", 1))
    timer.start()
    _fail_orphans(storage, study)
    timer.join()
    states = {t.number: t for t in study.get_trials(deepcopy=False)}
    assert states[killed.number].state == optuna.trial.TrialState.FAIL
    assert states[killed.number].user_attrs["orphan"] is True
    assert "no worker claimed it" in states[killed.number].user_attrs["reason"]
    assert states[claimed.number].state == optuna.trial.TrialState.RUNNING
    assert _budget_used(study) == 1  # the claimed one only


def test_an_interrupt_before_the_first_measurement_writes_nothing_and_says_interrupted(tmp_path):
    env = {**os.environ, "MOEPOLICY_OFFLINE": "1"}
    args = [*cli_command(model_bench_delay=30.0), *tune_args(tmp_path, study="early", trials=2)]
    proc = Watched(args, env=env)
    proc.wait_for(SEARCH_STARTS)  # the search has begun; its first measurement takes 30 s
    proc.proc.send_signal(signal.SIGINT)
    err = proc.finish(timeout=60)
    assert proc.returncode == 130, err
    last = err.strip().splitlines()[-1]
    assert last == (
        "moepolicy: interrupted: nothing was written (run the same command again to resume the study)"
    ), err
    assert "Traceback" not in err
    assert not (tmp_path / "p.yaml").exists()
