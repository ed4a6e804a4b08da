"""validate and export say what serving would do with a policy, by load_policy's own key checks against
the rule packs and sheets installed here: a policy planned with other rule packs (an older moepolicy)
falls back, and they say so (exit 6) instead of "keys intact" and a launch the plugin would ignore."""

import textwrap

import yaml

from conftest import run_cli
from moepolicy.document.keys import compute_keys
from moepolicy.runtime.outcome import APPLIED, DECISIONS_ONLY, SAFE, predict

OLDER_PACK_SHA = "0" * 64  # the deepep pack as an older moepolicy shipped it


def _plan(tmp_path, *extra: str) -> str:
    out = tmp_path / "p.yaml"
    result = run_cli(
        "plan", "--model", "Qwen3-30B-A3B-FP8", "--ep-size", "8", *extra, "-o", str(out)
    )
    assert result.returncode == 0, result.stderr
    return str(out)


def _planned_with_an_older_pack(tmp_path) -> str:
    """A policy whose recorded deepep pack differs from the installed one, keys intact (as written then)."""
    path = _plan(tmp_path)
    doc = yaml.safe_load(open(path))
    doc["rules"]["packs"][0]["sha256"] = OLDER_PACK_SHA
    doc["key"] = compute_keys(doc)
    with open(path, "w") as out:
        yaml.safe_dump(doc, out, sort_keys=False)
    return path


def test_validate_refuses_a_policy_serving_would_not_apply_naming_the_pack(tmp_path):
    path = _planned_with_an_older_pack(tmp_path)
    result = run_cli("validate", path, "--strict")
    assert result.returncode == 6, result.stdout + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "keys intact" not in result.stdout
    assert "serving would fall back: load_policy gives the safe policy" in result.stderr
    assert "the vLLM plugin applies nothing (vLLM runs as it is)" in result.stderr
    assert "rule_packs: mismatched (changed since the plan: deepep)" in result.stderr
    assert "re-plan with this one" in result.stderr


def test_export_to_vllm_says_the_plugin_would_apply_nothing(tmp_path):
    path = _planned_with_an_older_pack(tmp_path)
    result = run_cli("export", path, "--to", "vllm")
    assert result.returncode == 6 and result.stdout == ""
    assert "the vLLM plugin applies nothing" in result.stderr and "deepep" in result.stderr
    assert "load_policy" not in result.stderr  # what the plugin does, not the Python runtime


def test_export_to_sglang_warns_and_exports(tmp_path):
    path = _planned_with_an_older_pack(tmp_path)
    result = run_cli("export", path, "--to", "sglang")
    assert result.returncode == 0 and result.stdout.startswith("{")
    assert "warning: serving would fall back: load_policy gives the safe policy" in result.stderr


def test_a_user_pack_edited_after_the_plan_is_named(tmp_path):
    pack = tmp_path / "mine.yaml"
    pack.write_text(
        textwrap.dedent("""
        pack: mine
        version: "1"
        rules:
          - id: mine/dense
            priority: 1
            when: {fact: layer.kind, op: eq, value: dense}
            then: {order: none, numerics: exact}
            why: dense layers dispatch nothing.
            source: test
    """)
    )
    path = _plan(tmp_path, "--rules", str(pack))
    assert run_cli("validate", path).returncode == 0
    pack.write_text(pack.read_text().replace("dispatch nothing", "dispatch nothing at all"))
    result = run_cli("validate", path)
    assert result.returncode == 6 and "changed since the plan: mine" in result.stderr


def test_a_current_policy_validates_and_says_what_was_checked(tmp_path):
    path = _plan(tmp_path)
    result = run_cli("validate", path)
    assert result.returncode == 0 and "keys intact" in result.stdout
    assert "serving applies this policy (matched here: rule_packs, data_sheets;" in result.stdout
    assert "pass --model and --ep-size" in result.stdout
    checked = run_cli("validate", path, "--model", "Qwen/Qwen3-30B-A3B-FP8", "--ep-size", "8")
    assert (
        checked.returncode == 0
        and "model_facts" in checked.stdout
        and "pass --model" not in checked.stdout
    )


def test_the_served_model_and_ep_size_are_predicted(tmp_path):
    path = _plan(tmp_path)
    assert predict(path).state == APPLIED
    assert predict(path, model="DeepSeek-V3").state == SAFE
    assert predict(path, ep_size=4).state == DECISIONS_ONLY
    other_model = run_cli("validate", path, "--model", "DeepSeek-V3")
    assert other_model.returncode == 6 and "model_facts: mismatched" in other_model.stderr
    other_ep = run_cli("export", path, "--to", "vllm", "--ep-size", "4")
    assert (
        other_ep.returncode == 0 and "warning: serving would keep the decisions" in other_ep.stderr
    )
    # what the plugin does (it applies the decisions and leaves DeepEP's settings to vLLM)
    assert (
        "the vLLM plugin leaves DeepEP's SM count, buffers and configs to vLLM" in other_ep.stderr
    )
    assert "load_policy" not in other_ep.stderr
