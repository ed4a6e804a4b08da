"""The environment moepolicy reads (``moepolicy.settings``): the Hugging Face cache is found the same
way by the CLI (``plan --model org/name``, the runtime's ``model=``) and by the vLLM plugin, from the
environment as set when they look (huggingface_hub reads it once, when it is imported)."""

import types

import pytest

from conftest import fake_cache

pytest.importorskip("huggingface_hub")

from moepolicy.checkpoint.catalog import lookup  # noqa: E402

CACHE_VARIABLES = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")


@pytest.mark.parametrize(
    "env, where",
    [
        ({"HF_HUB_CACHE": "hub"}, "hub"),
        ({"HF_HOME": "home"}, "home/hub"),
        ({"HF_HUB_CACHE": "hub", "HF_HOME": "home"}, "hub"),  # HF_HUB_CACHE first
        ({"HUGGINGFACE_HUB_CACHE": "old", "HF_HOME": "home"}, "old"),  # the legacy name first
        ({"XDG_CACHE_HOME": "xdg"}, "xdg/huggingface/hub"),
        ({}, "user/.cache/huggingface/hub"),  # huggingface_hub's default under the home folder
    ],
)
def test_the_cli_and_the_plugin_find_a_model_in_the_same_hugging_face_cache(
    tmp_path, monkeypatch, env, where
):
    from huggingface_hub import constants  # noqa: F401 (read before the environment is set)

    from moepolicy.checkpoint import read_model
    from moepolicy.integrations.vllm.served import served_model

    for name in CACHE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, str(tmp_path / value))
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    monkeypatch.setenv("MOEPOLICY_OFFLINE", "1")
    config = (lookup("Qwen3-30B-A3B-FP8").folder / "config.json").read_bytes()
    snapshot = fake_cache(tmp_path / where, "acme/cached", {"config.json": config})

    assert read_model("acme/cached").name == "acme/cached"  # the CLI's and the runtime's reader
    vllm_config = types.SimpleNamespace(model="acme/cached", revision=None, hf_config=None)
    assert served_model(vllm_config).folder == str(snapshot)  # the plugin's
