"""Partial catalog entries (SOURCE.md: the copy lacks part of the real config) are marked in
`moepolicy models`; a complete entry's MoE layers have no unknown weight or activation facts."""

from conftest import run_cli
from moepolicy.checkpoint import catalog, read_model


def test_models_marks_the_partial_entries():
    result = run_cli("models")
    assert result.returncode == 0
    rows = {
        line.split()[0]: line.split()[-1]
        for line in result.stdout.splitlines()
        if "/" in line.split()[0]
    }
    assert rows["inference-optimization/GLM-4.6-FP8-dynamic"] == "partial"
    assert rows["deepseek-ai/DeepSeek-V3"] == rows["Qwen/Qwen3-30B-A3B-FP8"] == "complete"
    assert {name for name, mark in rows.items() if mark == "partial"} == {
        e.repo_id for e in catalog.entries() if e.partial
    }
    assert "plan from the checkpoint instead" in result.stdout
    assert "@main" not in result.stdout  # offline (run_cli): no revision can be downloaded
    assert (
        "(org/name@main) from the hub" in run_cli("models", env={"MOEPOLICY_OFFLINE": ""}).stdout
    )


def test_a_complete_entry_has_no_unknown_expert_facts():
    for entry in catalog.entries():
        if entry.partial:
            continue
        for layer in read_model(entry.repo_id).moe_layers:
            assert layer.weights.dtype != "unknown" and layer.activations.dtype != "unknown", (
                entry.repo_id
            )


def test_the_glm_entry_is_partial_where_its_weights_are_unknown():
    entry = catalog.lookup("GLM-4.6-FP8-dynamic")
    assert entry.partial and read_model(entry.repo_id).first_moe.weights.dtype == "unknown"


def test_models_gives_the_path_of_each_partial_entrys_source_notes():
    from pathlib import Path

    result = run_cli("models")
    shown = {
        line.split(": ", 1)[0].strip(): Path(line.split(": ", 1)[1])
        for line in result.stdout.splitlines()
        if line.startswith("  ") and line.rstrip().endswith("SOURCE.md")
    }
    assert set(shown) == {e.repo_id for e in catalog.entries() if e.partial}
    assert all(
        path.is_file() and "complete quantization_config" in path.read_text()
        for path in shown.values()
    )


def _real_glm_config() -> bytes:
    """The GLM entry's config as the checkpoint has it: the weights' strategy the copy lacks."""
    import json

    config = json.loads((catalog.lookup("GLM-4.6-FP8-dynamic").folder / "config.json").read_text())
    quant = config["quantization_config"]
    quant["config_groups"]["group_0"]["weights"].update(
        {"strategy": "channel", "type": "float", "symmetric": True, "observer": "minmax"}
    )
    quant.update({"quant_method": "compressed-tensors", "format": "float-quantized"})
    return json.dumps(config).encode()


def test_validate_checks_a_catalog_name_against_the_snapshot_serving_loads(tmp_path):
    """The plugin checks the snapshot vLLM serves; validate --model <catalog name> checked the
    catalog's copy, so for a partial entry it said 'serving applies' where the plugin falls back."""
    from conftest import fake_cache
    from moepolicy import load_policy
    from moepolicy.runtime.policy import ServedModel

    repo_id = "inference-optimization/GLM-4.6-FP8-dynamic"
    snapshot = fake_cache(tmp_path / "hf-cache", repo_id, {"config.json": _real_glm_config()})
    policy = tmp_path / "p.yaml"
    planned = run_cli(
        "plan",
        "--model",
        "GLM-4.6-FP8-dynamic",
        "--ep-size",
        "8",
        "--gpu",
        "h200",
        "-o",
        str(policy),
    )
    assert planned.returncode == 0, planned.stderr
    # what the plugin decides: the facts of the snapshot vLLM loaded
    assert load_policy(
        policy, ep_size=8, model=ServedModel(repo_id, folder=str(snapshot))
    ).is_fallback
    cached = {"HF_HUB_CACHE": str(tmp_path / "hf-cache")}
    for spec in ("GLM-4.6-FP8-dynamic", repo_id):
        for command in ("validate", "export"):
            extra = ["--to", "vllm"] if command == "export" else []
            said = run_cli(
                command, str(policy), *extra, "--model", spec, "--ep-size", "8", env=cached
            )
            assert said.returncode == 6, (command, said.stderr)
            assert (
                f"checked against the snapshot vLLM serves from the Hugging Face cache ({snapshot})"
                in (said.stderr)
            )
            assert "model_facts" in said.stderr.strip().splitlines()[-1]
    # no snapshot to check: the catalog's copy is checked, and a warning says what that is worth
    empty = {"HF_HUB_CACHE": str(tmp_path / "empty-cache")}
    copy = run_cli(
        "validate", str(policy), "--model", "GLM-4.6-FP8-dynamic", "--ep-size", "8", env=empty
    )
    assert copy.returncode == 0, copy.stderr
    assert (
        "warning: --model GLM-4.6-FP8-dynamic: checked against moepolicy's catalog copy"
        in copy.stderr
    )
    assert "(partial)" in copy.stderr and "hf download" not in copy.stderr  # offline: cannot work
    assert (
        "pass the checkpoint's folder or its config.json (MOEPOLICY_OFFLINE is set" in copy.stderr
    )
    online = run_cli(
        "validate",
        str(policy),
        "--model",
        "GLM-4.6-FP8-dynamic",
        "--ep-size",
        "8",
        env={**empty, "MOEPOLICY_OFFLINE": ""},
    )
    assert f"hf download {repo_id} config.json" in online.stderr, online.stderr


def test_plan_warns_that_a_partial_catalog_copy_can_fall_back():
    """GLM-4.6-FP8-dynamic's copy lacks the weights' strategy: every MoE layer falls back, which the
    plan's closing line (matching vLLM's choice) does not say; the warning does, with the fix."""
    partial = run_cli("plan", "--model", "GLM-4.6-FP8-dynamic", "--ep-size", "8", "-o", "-")
    assert partial.returncode == 0, partial.stderr
    assert "catalog copy is partial" in partial.stderr
    assert "@main" not in partial.stderr  # offline (run_cli): what works offline instead
    assert "plan from the real config before serving: the checkpoint's folder" in partial.stderr
    online = run_cli("plan", "--model", "GLM-4.6-FP8-dynamic", env={"MOEPOLICY_OFFLINE": ""})
    assert "inference-optimization/GLM-4.6-FP8-dynamic@main" in online.stderr
    whole = run_cli("plan", "--model", "Qwen3-30B-A3B-FP8", "--ep-size", "8", "-o", "-")
    assert whole.returncode == 0 and "partial" not in whole.stderr
