"""Crash safety: kill -9 a real `moepolicy tune` at random moments (>= 20 times), then run the same
command again. The study resumes, no completed trial is lost or measured twice, and the output file
is always the previous complete policy or the new complete one, never a partial file."""

import os
import random
import signal
import subprocess
import time

import pytest

from conftest import Watched, cli_command

optuna = pytest.importorskip("optuna", reason="tuning needs optuna")

KILLS = int(os.environ.get("MOEPOLICY_CRASH_KILLS", "20"))
TRIALS = 5


def complete_trials(db):
    storage = optuna.storages.RDBStorage(f"sqlite:///{db}")
    out = {}
    for summary in optuna.get_all_study_summaries(storage):
        if "/sms" not in summary.study_name:
            continue
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        out[summary.study_name] = [
            (t.number, t.user_attrs.get("effective"), bool(t.user_attrs.get("dedup")))
            for t in study.trials
            if t.state == optuna.trial.TrialState.COMPLETE
        ]
    return out


def output_is_whole(path, previous: str) -> bool:
    if not path.exists():
        return previous == ""
    text = path.read_text()
    if text == previous:
        return True
    from moepolicy.document.reader import read_policy

    read_policy(path)  # raises on a partial or damaged file
    return True


def test_kill_9_at_random_moments_then_resume(tmp_path):
    rng = random.Random(20261130)
    env = {**os.environ, "MOEPOLICY_OFFLINE": "1"}
    out = tmp_path / "policy.yaml"
    db = tmp_path / "studies.db"
    args = [
        *cli_command(model_bench_delay=0.05),
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
        "512,4096",
        "--trials",
        str(TRIALS),
        "--storage",
        f"sqlite:///{db}",
        "--study",
        "crash",
        "-o",
        str(out),
    ]
    previous = ""
    seen_complete: dict = {}
    for i in range(KILLS):
        proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
        )
        time.sleep(rng.uniform(0.2, 2.2))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert output_is_whole(out, previous), f"kill {i}: partial output"
        previous = out.read_text() if out.exists() else ""
        if db.exists():
            now = complete_trials(db)
            for name, trials in seen_complete.items():  # nothing completed is ever lost
                assert set(trials) <= set(now.get(name, [])), (
                    f"kill {i}: lost completed trials in {name}"
                )
            seen_complete = now
    final = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert final.returncode == 0, final.stderr
    from moepolicy.document.reader import read_policy

    doc = read_policy(out).doc
    assert doc.deepep.provenance.source == "modelled"
    studies = complete_trials(db)
    assert (
        len(studies) == 2
    )  # 1 SM count (the one the model is calibrated at for 512 tokens) x 2 buckets
    for name, trials in studies.items():
        assert len(trials) == TRIALS, (name, trials)  # the budget, not more: nothing repeated
        measured = [eff for _, eff, dedup in trials if not dedup]
        assert len(measured) == len(set(measured)), (
            f"{name}: an effective config was measured twice"
        )
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert not leftovers, leftovers


SIGNALS = max(KILLS // 2, 4)


def running_trials(db) -> list:
    storage = optuna.storages.RDBStorage(f"sqlite:///{db}")
    return [
        (s.study_name, t.number)
        for s in optuna.get_all_study_summaries(storage)
        for t in optuna.load_study(study_name=s.study_name, storage=storage).trials
        if t.state == optuna.trial.TrialState.RUNNING
    ]


def test_sigint_and_sigterm_at_random_moments_end_cleanly(tmp_path):
    """Ctrl-C and SIGTERM, drawn at random (seeded) and sent at random moments of a tune: each ends with
    the interrupt's exit code (or 0 if the tune finished first) and one line, never a traceback; a
    complete policy is never replaced by a partial one (the partial result goes beside it, marked);
    no trial is left RUNNING and no temporary file is left behind."""
    from moepolicy.document.reader import read_policy

    rng = random.Random(20261201)
    env = {**os.environ, "MOEPOLICY_OFFLINE": "1"}
    out, db = tmp_path / "policy.yaml", tmp_path / "studies.db"
    for i in range(SIGNALS):
        sig = rng.choice([signal.SIGINT, signal.SIGTERM])
        args = [
            *cli_command(model_bench_delay=0.05),
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
            "512,4096",
            "--trials",
            "6",
            "--storage",
            f"sqlite:///{db}",
            "--study",
            f"sig{i}",
            "-o",
            str(out),
        ]
        previous = out.read_text() if out.exists() else ""
        proc = Watched(args, env=env)
        # the random moment counts from the tune's first line: before it, Python may not have run
        # moepolicy's first line yet, and a signal there takes Python's default action (under load
        # interpreter start-up alone outlasted a fixed sleep; RELIABILITY.md, fourth pass)
        proc.wait_for(r"^bench: ")
        time.sleep(rng.uniform(0.0, 2.2))
        proc.proc.send_signal(sig)
        err = proc.finish(timeout=120)
        expected = 130 if sig == signal.SIGINT else 143
        finished = (
            "\nwrote " in "\n" + err
        )  # a signal during the interpreter's exit takes its default action
        assert proc.returncode in (0, expected) or (finished and proc.returncode == -sig), (
            i,
            sig,
            proc.returncode,
            err,
        )
        assert "Traceback" not in err, (i, err)
        if proc.returncode == expected and not finished:
            assert (
                err.strip()
                .splitlines()[-1]
                .startswith(("moepolicy: interrupted", "moepolicy: terminated"))
            ), err
        if out.exists() and out.read_text() != previous:
            doc = read_policy(out).doc if "partial:" not in out.read_text() else None
            if doc is None:  # a partial result may stand alone only where no complete policy stood
                assert previous == "" or "partial:" in previous, (
                    f"signal {i}: a complete policy was replaced"
                )
        if db.exists():
            assert not running_trials(db), f"signal {i}: trials left RUNNING"
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
