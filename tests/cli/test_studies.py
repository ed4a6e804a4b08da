"""``moepolicy studies``: the tunes' studies in a storage listed and deleted; the default study name
carries the study's fingerprint, so another --tokens in the same folder starts its own study."""

import json
import re
import sys

import pytest

from conftest import run_cli

pytest.importorskip("optuna", reason="tuning needs optuna")


def _tune(tmp_path, *extra):
    storage = f"sqlite:///{tmp_path}/s.db"
    args = ("--model", "Qwen3-30B-A3B-FP8", "--ep-size", "2", "--bench", "model")
    return run_cli("tune", *args, "--storage", storage, *extra, "-o", str(tmp_path / "p.yaml"))


def _names(tmp_path):
    done = run_cli("studies", "--storage", f"sqlite:///{tmp_path}/s.db", "--format", "json")
    assert done.returncode == 0, done.stderr
    return [row["name"] for row in json.loads(done.stdout)]


def test_another_tokens_in_the_same_storage_starts_its_own_study(tmp_path):
    first = _tune(tmp_path, "--tokens", "128,1024")
    assert first.returncode == 0, first.stderr
    other = _tune(tmp_path, "--tokens", "256,2048")
    assert other.returncode == 0, other.stderr  # was refused (exit 7): the tool's own name clashed
    names = _names(tmp_path)
    assert len(names) == 2 and all(
        re.fullmatch(r"Qwen--Qwen3-30B-A3B-FP8-h200-ep2-deepep_ht-model-[0-9a-f]{8}", n)
        for n in names
    ), names
    again = _tune(tmp_path, "--tokens", "128,1024")  # the same command resumes its own study
    assert again.returncode == 0 and "resuming study" in again.stderr, again.stderr


def test_a_study_is_listed_and_deleted_with_its_sub_studies(tmp_path):
    assert _tune(tmp_path, "--tokens", "128,1024").returncode == 0
    storage = f"sqlite:///{tmp_path}/s.db"
    listed = run_cli("studies", "--storage", storage)
    (name,) = _names(tmp_path)
    row = next(line for line in listed.stdout.splitlines() if line.startswith(name))
    assert row.split()[1:3] == ["2", "2"]  # two buckets: two sub-studies, one trial each
    gone = run_cli("studies", "--storage", storage, "--delete", name)
    assert gone.returncode == 0 and "2 sub-studies with it" in gone.stderr, gone.stderr
    assert _names(tmp_path) == []
    again = run_cli("studies", "--storage", storage, "--delete", name)
    assert again.returncode == 2 and again.stderr.startswith(
        f"moepolicy: --delete {name}: no such"
    )


def test_a_storage_that_does_not_exist_is_said_and_never_made(tmp_path):
    done = run_cli("studies", "--storage", f"sqlite:///{tmp_path}/none.db")
    assert done.returncode == 0 and "no study database at" in done.stderr, done.stderr
    assert not (tmp_path / "none.db").exists()


def test_the_default_storage_is_the_tunes(tmp_path):
    from moepolicy.cli.main import build_parser
    from moepolicy.tuning.options import TuneOptions

    args = build_parser().parse_args(["studies"])
    assert args.storage == TuneOptions(buckets=((128, 1.0),)).storage


def test_the_version_imports_neither_optuna_nor_the_studies_module():
    import subprocess

    code = (
        "import sys\n"
        "from moepolicy.cli.main import main\n"
        "try:\n    main(['--version'])\nexcept SystemExit:\n    pass\n"
        "print('optuna' in sys.modules, 'moepolicy.tuning.studies' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split()[-2:] == ["False", "False"], done.stdout + done.stderr
