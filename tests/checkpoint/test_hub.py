"""Models by Hugging Face id, through huggingface_hub, against a fake HF cache (HF_HUB_CACHE in tmp_path)
and a hub stand-in on 127.0.0.1 (HF_ENDPOINT): each way of failing has its own one-line message, and
nothing reaches the network when it must not."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from moepolicy.checkpoint import read_model
from moepolicy.checkpoint.catalog import lookup
from moepolicy.errors import CheckpointError
from fake_hub import COMMIT, FakeHub
from conftest import fake_cache, run_cli

QWEN_FP8 = lookup("Qwen3-30B-A3B-FP8").folder
QWEN_NVFP4 = lookup("Qwen3-30B-A3B-NVFP4").folder


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """The hub stand-in, an empty HF cache, no token, online (the conftest sets MOEPOLICY_OFFLINE)."""
    server = FakeHub().start()
    server.add("ok/model", "config.json", _json(QWEN_FP8 / "config.json"))
    for name in ("config.json", "hf_quant_config.json"):
        server.add("ok/nvfp4", name, _json(QWEN_NVFP4 / name))
    for name in ("MOEPOLICY_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    yield server
    server.stop()


@pytest.fixture
def no_backoff(monkeypatch):
    """huggingface_hub waits 1+2+4+8+8 s between its retries when nothing is cached; not here."""
    monkeypatch.setattr(time, "sleep", lambda seconds: None)


def _message(spec: str) -> str:
    with pytest.raises(CheckpointError) as err:
        read_model(spec)
    return str(err.value)


# ------------------------------------------------------------------------------- the cache
def test_an_id_in_the_cache_is_read_offline_without_asking_the_network(hub, monkeypatch, tmp_path):
    fake_cache(
        tmp_path / "hf-cache",
        "org/cached",
        {"config.json": (QWEN_FP8 / "config.json").read_bytes()},
    )
    monkeypatch.setenv("MOEPOLICY_OFFLINE", "1")
    facts = read_model("org/cached")
    assert (
        facts.name == "org/cached" and facts.sha256() == read_model("Qwen3-30B-A3B-FP8").sha256()
    )
    assert hub.requests == []


def test_suggestions_name_the_right_organisation_and_the_cache(hub, monkeypatch, tmp_path):
    """A catalog model under a wrong organisation, and a typo of a model in the Hugging Face cache:
    the message suggests the ids that exist, the same name under its real organisation first."""
    config = {"config.json": (QWEN_FP8 / "config.json").read_bytes()}
    fake_cache(tmp_path / "hf-cache", "my-org/Qwen3-Coder-30B-A3B-Instruct", config)
    monkeypatch.setenv("MOEPOLICY_OFFLINE", "1")
    assert "did you mean: deepseek-ai/DeepSeek-V3" in _message("deepseek/DeepSeek-V3")
    typo = _message("my-org/Qwen3-Coder-30B-A3B-Instrcut")
    assert "did you mean: my-org/Qwen3-Coder-30B-A3B-Instruct" in typo, typo
    bare = _message("Qwen3-Coder-30B-A3B-Instrcut")  # no organisation: the cache's id is offered
    assert "my-org/Qwen3-Coder-30B-A3B-Instruct" in bare, bare
    assert hub.requests == []


def test_a_wrong_organisation_is_suggested_when_the_hub_answers_404(hub):
    message = _message("deepseek/DeepSeek-V3")
    assert "HTTP 404" in message and "did you mean: deepseek-ai/DeepSeek-V3" in message


def test_hf_hub_offline_means_the_cache_only(hub, monkeypatch, tmp_path):
    fake_cache(
        tmp_path / "hf-cache",
        "org/cached",
        {"config.json": (QWEN_FP8 / "config.json").read_bytes()},
    )
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert read_model("org/cached").name == "org/cached"
    message = _message("org/elsewhere")
    assert "not in the Hugging Face cache" in message and "HF_HUB_OFFLINE is set" in message
    assert "could not be reached" not in message
    assert hub.requests == []


def test_offline_and_not_cached_names_the_cache_and_what_works_offline(hub, monkeypatch, tmp_path):
    monkeypatch.setenv("MOEPOLICY_OFFLINE", "1")
    message = _message("Qwen/Qwen3-30B-A3B-FP9")
    assert str(tmp_path / "hf-cache") in message
    assert "hf download" not in message  # a download cannot work offline
    assert "pass the model folder or its config.json" in message
    assert (
        "MOEPOLICY_OFFLINE is set: the hub was not asked" in message
        and "Qwen3-30B-A3B-FP8" in message
    )
    assert "could not be reached" not in message and hub.requests == []


def test_offline_a_catalog_id_at_a_revision_names_the_catalog_copy(hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    message = _message("Qwen/Qwen3-30B-A3B-FP8@main")
    assert "'Qwen/Qwen3-30B-A3B-FP8' without a revision reads moepolicy's catalog copy" in message
    assert "hf download" not in message and hub.requests == []


def _catalog_note(tmp_path, model: str, out: str) -> str:
    """plan's line on where the checkpoint's own config is read, offline (MOEPOLICY_OFFLINE=1)."""
    env = {"HF_HUB_CACHE": str(tmp_path / "hf-cache"), "HF_HOME": str(tmp_path / "home")}
    planned = run_cli("plan", "--model", model, "-o", str(tmp_path / out), env=env)
    assert planned.returncode == 0, planned.stderr
    return next(
        line
        for line in planned.stderr.splitlines()
        if "plan from the real config" in line or "the checkpoint's own config" in line
    )


@pytest.mark.parametrize(
    "model", ["Qwen/Qwen3-30B-A3B-FP8", "inference-optimization/GLM-4.6-FP8-dynamic"]
)
def test_offline_the_way_to_the_real_config_is_one_that_works_offline(tmp_path, model):
    """The catalog-copy line (and a partial copy's warning) offered 'org/name@main', which offline
    fails unless the cache holds it: offline it names the cached snapshot, else a local folder."""
    said = _catalog_note(tmp_path, model, "a.yaml")
    assert f"{model}@main" not in said and "the checkpoint's folder or its config.json" in said
    snapshot = fake_cache(
        tmp_path / "hf-cache",
        model,
        {"config.json": (lookup(model).folder / "config.json").read_bytes()},
    )
    said = _catalog_note(tmp_path, model, "b.yaml")
    assert f"{model}@main" not in said and str(snapshot) in said
    followed = run_cli("plan", "--model", str(snapshot), "-o", str(tmp_path / "c.yaml"))
    assert followed.returncode == 0, followed.stderr


def test_hf_hub_offline_zero_is_not_offline(hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert read_model("ok/model").name == "ok/model"


def test_a_snapshot_folder_is_named_by_its_repository_not_its_hash(tmp_path):
    content = (QWEN_FP8 / "config.json").read_bytes()
    snapshot = fake_cache(tmp_path / "hub", "Qwen/Qwen3-30B-A3B-FP8", {"config.json": content})
    assert read_model(str(snapshot)).name == "Qwen/Qwen3-30B-A3B-FP8"
    assert read_model(str(snapshot / "config.json")).name == "Qwen/Qwen3-30B-A3B-FP8"
    repo_folder = (
        snapshot.parent.parent
    )  # models--Qwen--Qwen3-30B-A3B-FP8: refs/main picks the snapshot
    assert read_model(str(repo_folder)).name == "Qwen/Qwen3-30B-A3B-FP8"


def test_a_cached_snapshot_keeps_its_quant_config(tmp_path):
    files = {
        name: (QWEN_NVFP4 / name).read_bytes() for name in ("config.json", "hf_quant_config.json")
    }
    snapshot = fake_cache(tmp_path / "hub", "nvidia/Qwen3-30B-A3B-NVFP4", files)
    assert read_model(str(snapshot)).sha256() == read_model("Qwen3-30B-A3B-NVFP4").sha256()


@pytest.mark.parametrize(
    "revision",
    ["../secret", "../../../../../../etc/hostname", "..", "a/../b", ".hidden", "main/", "a//b"],
)
def test_a_revision_that_is_a_path_is_refused_before_the_cache_is_read(
    hub, monkeypatch, tmp_path, revision
):
    """huggingface_hub reads a revision as the file ``refs/<revision>`` of its cache: ``..`` would
    make any file a ref (read whole). A file beside ``refs/`` naming a snapshot resolved the model
    through it before."""
    repo = fake_cache(
        tmp_path / "hf-cache",
        "org/cached",
        {"config.json": (QWEN_FP8 / "config.json").read_bytes()},
    ).parent.parent
    (repo / "secret").write_text(COMMIT)  # not a ref: reached only through refs/../secret
    monkeypatch.setenv("MOEPOLICY_OFFLINE", "1")
    message = _message(f"org/cached@{revision}")
    assert message.startswith(f"model 'org/cached@{revision}': the revision") and (
        "give a branch, a tag or a commit hash" in message
    ), message
    assert hub.requests == []
    monkeypatch.delenv("MOEPOLICY_OFFLINE")  # online: the hub is never asked either
    assert "the revision" in _message(f"org/cached@{revision}") and hub.requests == []


def test_a_branch_or_tag_with_slashes_is_still_a_revision(hub, monkeypatch, tmp_path):
    from moepolicy.checkpoint.hub import parse_id

    assert parse_id("org/name@refs/pr/1").revision == "refs/pr/1"
    assert parse_id(f"org/name@{COMMIT}").revision == COMMIT


# ------------------------------------------------------------------------------- the hub
def test_an_id_is_downloaded_into_the_hf_cache_then_read_from_it(hub, monkeypatch, tmp_path):
    facts = read_model("ok/nvfp4")
    assert (
        facts.name == "ok/nvfp4" and facts.sha256() == read_model("Qwen3-30B-A3B-NVFP4").sha256()
    )
    snapshot = tmp_path / "hf-cache" / "models--ok--nvfp4" / "snapshots" / COMMIT
    assert (snapshot / "config.json").is_file() and (snapshot / "hf_quant_config.json").is_file()
    asked = len(hub.requests)
    monkeypatch.setenv("MOEPOLICY_OFFLINE", "1")
    assert read_model("ok/nvfp4").sha256() == facts.sha256() and len(hub.requests) == asked


def test_a_repository_without_a_quant_config_is_read_without_one(hub):
    assert read_model("ok/model").sha256() == read_model("Qwen3-30B-A3B-FP8").sha256()


def test_a_revision_is_asked_for(hub):
    assert read_model(f"ok/model@{COMMIT}").name == "ok/model"
    assert any(f"/resolve/{COMMIT}/config.json" in path for _method, path, _token in hub.requests)
    assert "has no revision 'nope' of ok/model" in _message("ok/model@nope")


def test_not_found_is_a_404_with_did_you_mean(hub):
    message = _message("Qwen/Qwen3-30B-A3B-FP9")
    assert (
        "has no such repository (HTTP 404)" in message
        and "did you mean: Qwen/Qwen3-30B-A3B-FP8" in message
    )
    assert "could not be reached" not in message


def test_a_catalog_name_is_never_asked_of_the_hub(hub):
    assert read_model("Qwen/Qwen3-30B-A3B-FP8").source == "catalog:Qwen/Qwen3-30B-A3B-FP8"
    assert hub.requests == []


def test_gated_without_a_token_says_set_hf_token(hub):
    message = _message("gated/model")
    assert "is gated on the Hugging Face hub (HTTP 401, no token was sent)" in message
    assert "set HF_TOKEN" in message and f"{hub.endpoint}/gated/model" in message


def test_gated_with_a_token_sends_it_and_says_it_has_no_access(hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    assert "is gated on the Hugging Face hub (HTTP 403, a token was sent)" in _message(
        "gated/model"
    )
    assert all(token for _method, path, token in hub.requests if path.startswith("/gated/"))


def test_a_401_without_a_token_says_private_gated_or_missing(hub):
    message = _message("private/model")
    assert (
        "refused it (HTTP 401, no token was sent)" in message and "does not say which" in message
    )
    assert "could not be reached" not in message


def test_a_dropped_connection_is_could_not_be_reached(hub, no_backoff):
    message = _message("drop/model")
    assert f"the Hugging Face hub at {hub.endpoint} could not be reached" in message
    assert (
        "Remote" in message or "Connection" in message
    )  # the client's own words: httpx or requests


def test_nothing_listening_is_could_not_be_reached(hub, monkeypatch, no_backoff):
    import socket

    with socket.socket() as sock:  # a port that was free a moment ago
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    assert f"the Hugging Face hub at http://127.0.0.1:{port} could not be reached" in _message(
        "ok/model"
    )


def test_credentials_in_hf_endpoint_are_never_printed(hub, monkeypatch, no_backoff):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://someone:s3cr3tT0k@127.0.0.1:{port}")
    message = _message("ok/model")
    assert f"http://someone:***@127.0.0.1:{port} could not be reached" in message
    assert "s3cr3tT0k" not in message


def test_a_cached_model_is_read_when_the_hub_cannot_be_reached(hub, monkeypatch, no_backoff):
    read_model("ok/nvfp4")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    assert read_model("ok/nvfp4").sha256() == read_model("Qwen3-30B-A3B-NVFP4").sha256()


def test_a_cached_model_whose_hub_is_silent_is_read_at_once_and_said(hub, monkeypatch, capfd):
    """Nothing answers at the endpoint and the cache has config.json but was never told about
    hf_quant_config.json (as a hand-made or partial cache): read from the cache without
    huggingface_hub's backoff (1+2+4+8+8 s before, per missing file), no retry lines, one note."""
    from moepolicy.checkpoint.hub import fetch, parse_id

    fake_cache(
        Path(os.environ["HF_HUB_CACHE"]),
        "acme/model",
        {"config.json": (QWEN_FP8 / "config.json").read_bytes()},
    )
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    files = fetch(parse_id("acme/model"), network=True)
    assert files.config.read_bytes() == (QWEN_FP8 / "config.json").read_bytes()
    assert not slept, f"backed off {slept} s"
    assert "did not answer: read from its cache" in files.notes[0]
    err = capfd.readouterr().err
    assert "Retrying" not in err and "thrown while requesting" not in err, err


def test_a_config_larger_than_any_config_is_refused_before_it_is_downloaded(hub, tmp_path):
    """The 16 MiB bound applied only after the download: the file stayed whole in the cache."""
    from moepolicy.checkpoint.source import MAX_CONFIG_BYTES

    config = _json(QWEN_FP8 / "config.json")
    hub.add("big/model", "config.json", {**config, "padding": "x" * (MAX_CONFIG_BYTES + 1)})
    message = _message("big/model")
    assert "its config.json on the Hugging Face hub" in message and "not downloaded" in message
    assert not any(
        method == "GET" and "config.json" in path for method, path, _token in hub.requests
    ), hub.requests
    cached = [p for p in (tmp_path / "hf-cache").rglob("*") if p.is_file()]
    assert all(p.stat().st_size < MAX_CONFIG_BYTES for p in cached), cached


def test_a_trickling_download_is_said_and_given_up_and_never_hangs(hub, monkeypatch, caplog):
    """A hub or proxy that sends a byte at a time never trips the client's per-read timeout: the
    plan stalled silently. Now a line says the download goes on, and it is given up at a deadline."""
    import logging
    import threading

    from moepolicy.checkpoint import hub as hub_module

    monkeypatch.setattr(hub_module, "DOWNLOAD_SAY_S", 0.5, raising=False)
    monkeypatch.setattr(hub_module, "DOWNLOAD_DEADLINE_S", 3.0, raising=False)
    hub.add("slow/model", "config.json", _json(QWEN_FP8 / "config.json"))  # 0.5 s a byte: minutes
    outcome: list = []

    def read() -> None:
        try:
            read_model("slow/model")
            outcome.append("read")
        except CheckpointError as exc:
            outcome.append(str(exc))

    with caplog.at_level(logging.WARNING, logger="moepolicy.checkpoint"):
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(timeout=60)
    assert outcome, "the download of a trickled config.json did not end"
    assert "sent too little of config.json in 3 s" in outcome[0], outcome
    assert "config.json is still downloading from the Hugging Face hub" in caplog.text


def test_a_server_error_says_the_status(hub, no_backoff):
    message = _message("down/model")
    assert "answered HTTP 503" in message and "could not be reached" not in message


def test_a_name_that_is_no_id_never_asks_the_hub(hub):
    message = _message("Qwen3-30B-A3B-FP9")
    assert "not a file, a folder, a catalog name or a Hugging Face id" in message
    assert "could not be reached" not in message and hub.requests == []


# ------------------------------------------------------------------------------- the runtime
def _policy(tmp_path: Path) -> Path:
    out = tmp_path / "p.yaml"
    result = run_cli("plan", "--model", "Qwen3-30B-A3B-FP8", "--ep-size", "8", "-o", str(out))
    assert result.returncode == 0, result.stderr
    return out


def test_the_runtime_reads_an_id_from_the_cache_and_never_the_network(hub, tmp_path):
    from moepolicy import load_policy

    policy_path = _policy(tmp_path)
    fake_cache(
        tmp_path / "hf-cache",
        "org/served",
        {"config.json": (QWEN_FP8 / "config.json").read_bytes()},
    )
    policy = load_policy(policy_path, ep_size=8, model="org/served")
    assert not policy.is_fallback and policy.report["decision"] == "matched"
    absent = load_policy(policy_path, ep_size=8, model="ok/model")  # on the hub, not in the cache
    assert absent.is_fallback and "not in the Hugging Face cache" in absent.fallback_reason
    assert "a serving process never asks the network" in absent.fallback_reason
    assert hub.requests == []


def test_the_cli_resolves_an_id_and_offline_asks_nothing(hub, tmp_path):
    env = {
        "HF_ENDPOINT": hub.endpoint,
        "HF_HUB_CACHE": str(tmp_path / "hf-cache"),
        "HF_HOME": str(tmp_path / "home"),
        "MOEPOLICY_OFFLINE": "",
    }
    online = run_cli(
        "plan", "--model", "ok/model", "--ep-size", "8", "-o", str(tmp_path / "a.yaml"), env=env
    )
    assert online.returncode == 0, online.stderr
    assert "name: ok/model" in (tmp_path / "a.yaml").read_text()
    hub.requests.clear()
    offline = run_cli(
        "plan",
        "--model",
        "ok/model",
        "--ep-size",
        "8",
        "-o",
        str(tmp_path / "b.yaml"),
        env={**env, "MOEPOLICY_OFFLINE": "1", "HF_HOME": str(tmp_path / "fresh-home")},
    )
    assert offline.returncode == 0, offline.stderr
    assert hub.requests == []
    missing = run_cli("plan", "--model", "missing/model", "--ep-size", "8", env=env)
    assert missing.returncode == 3 and len(missing.stderr.strip().splitlines()) == 1
    assert "has no such repository (HTTP 404)" in missing.stderr


def test_huggingface_hub_is_imported_only_for_an_id_outside_the_catalog(hub, tmp_path):
    import subprocess
    import sys

    policy_path = _policy(tmp_path)
    fake_cache(
        tmp_path / "hf-cache",
        "org/served",
        {"config.json": (QWEN_FP8 / "config.json").read_bytes()},
    )
    code = (
        "import sys\n"
        "from moepolicy import load_policy\n"
        f"assert not load_policy({str(policy_path)!r}, ep_size=8, model='Qwen3-30B-A3B-FP8').is_fallback\n"
        "before = 'huggingface_hub' in sys.modules\n"
        f"assert not load_policy({str(policy_path)!r}, ep_size=8, model='org/served').is_fallback\n"
        "print(before, 'huggingface_hub' in sys.modules, [m for m in ('torch', 'optuna') if m in sys.modules])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_HUB_CACHE": str(tmp_path / "hf-cache")},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "[]"]
    assert hub.requests == []
