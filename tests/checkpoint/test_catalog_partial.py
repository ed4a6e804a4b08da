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
