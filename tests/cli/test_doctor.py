"""``moepolicy doctor``: what a node offers a policy, read from what is installed there (DeepEP's
features, vLLM's distribution, NVML's GPUs), given here at those boundaries."""

import json
import sys
import types

import pytest

from moepolicy.cli.main import main


def _deep_ep_2x(monkeypatch) -> None:
    """A DeepEP 2.x build's features: the legacy Buffer (enable_shrink, no use_fabric) beside
    ElasticBuffer."""
    fake = types.ModuleType("deep_ep")

    def init(self, group, num_nvl_bytes=0, allow_mnnvl=False, enable_shrink=False):
        pass

    fake.Buffer = type("Buffer", (), {"__init__": init})
    fake.Config, fake.topk_idx_t, fake.ElasticBuffer = object, object, object
    monkeypatch.setitem(sys.modules, "deep_ep", fake)


def _node(monkeypatch, vllm_version, gpus):
    import importlib.metadata

    real = importlib.metadata.version

    def version(name):
        if name == "vllm":
            if vllm_version is None:
                raise importlib.metadata.PackageNotFoundError(name)
            return vllm_version
        if name in ("deep_ep", "deep-ep"):
            return "2.1.0"
        return real(name)

    monkeypatch.setattr("moepolicy.node.importlib.metadata.version", version)
    monkeypatch.setattr("moepolicy.hardware.nvml_gpus", lambda: tuple(gpus))


def test_a_node_with_deepep_2x_names_both_apis_and_the_flags_to_plan_with(monkeypatch, capsys):
    _deep_ep_2x(monkeypatch)
    _node(monkeypatch, "0.34.0", ["NVIDIA H200"] * 8)
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert (
        "deep_ep 2.1.0: offers deepep-legacy-2.1.0-dd758ca (deepep_high_throughput, "
        "deepep_low_latency); deepep-v2-dd758ca (deepep_v2)" in out
    )
    assert "vllm 0.34.0: the plugin supports it" in out
    assert "gpus: 8 x NVIDIA H200: --gpu h200; EP up to 8 on one node is intranode" in out
    assert out.rstrip().endswith(
        "moepolicy plan --model MODEL --ep-size N --gpu h200 "
        "--deep-ep-version deepep-legacy-2.1.0-dd758ca"
    )


@pytest.mark.parametrize(
    "vllm, said",
    [
        (
            "0.35.0",
            "vllm 0.35.0: the plugin is not checked against it (serve with 0.33.x or 0.34.x)",
        ),
        (None, "vllm: not installed in this environment (the plugin supports 0.33.x or 0.34.x)"),
    ],
)
def test_a_vllm_the_plugin_does_not_support_is_said(monkeypatch, capsys, vllm, said):
    monkeypatch.setitem(sys.modules, "deep_ep", None)  # import deep_ep fails: not installed
    _node(monkeypatch, vllm, [])
    assert main(["doctor", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["deep_ep"]["installed"] is False and report["plan_flags"] == []
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert said in out and "deep_ep: not importable here" in out and "gpus: none visible" in out
