"""The rule-pack lint's cache (``lint_packs_cached``): the same findings as the lint, read back from a
file keyed by the packs' sha256 and the linter's source; a changed pack, a damaged or unwritable cache
lints afresh."""

import json
import textwrap

from conftest import run_cli
from moepolicy.rules.grammar import load_pack
from moepolicy.rules.lint import lint_key, lint_packs, lint_packs_cached
from moepolicy.rules.packs import known_capabilities
from test_rules_lint import PACK


def _pack(tmp_path, text=PACK):
    path = tmp_path / "mine.yaml"
    path.write_text(textwrap.dedent(text))
    return load_pack(path, known_capabilities())


def test_the_cache_holds_the_lints_findings_and_is_read_back(tmp_path):
    packs = [_pack(tmp_path)]
    first = lint_packs_cached(packs, tmp_path / "cache")
    assert first == lint_packs(packs) and first  # the pack has a shadowed rule and an overlap
    path = tmp_path / "cache" / "lint" / f"{lint_key(packs)}.json"
    data = json.loads(path.read_text())
    data["findings"][0][3] = "read from the cache"
    path.write_text(json.dumps(data))
    assert lint_packs_cached(packs, tmp_path / "cache")[0].message == "read from the cache"


def test_a_changed_pack_is_linted_afresh(tmp_path):
    packs = [_pack(tmp_path)]
    lint_packs_cached(packs, tmp_path / "cache")
    changed = [
        _pack(tmp_path, PACK.replace("priority: 5", "priority: 11"))
    ]  # mine/group-128 now first
    assert lint_key(changed) != lint_key(packs)
    assert (
        lint_packs_cached(changed, tmp_path / "cache") == lint_packs(changed) != lint_packs(packs)
    )


def test_a_damaged_cache_file_is_linted_afresh_and_rewritten(tmp_path):
    packs = [_pack(tmp_path)]
    path = tmp_path / "cache" / "lint" / f"{lint_key(packs)}.json"
    path.parent.mkdir(parents=True)
    for damage in (
        "{not json",
        json.dumps({"key": lint_key(packs), "findings": [[1, 2]]}),
        json.dumps({"key": "another", "findings": []}),
        json.dumps([]),
    ):
        path.write_text(damage)
        assert lint_packs_cached(packs, tmp_path / "cache") == lint_packs(packs)
    assert json.loads(path.read_text())["key"] == lint_key(packs)


def test_an_unwritable_cache_still_lints(tmp_path):
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache folder would be")
    packs = [_pack(tmp_path)]
    assert lint_packs_cached(packs, blocker) == lint_packs(packs)


def test_audit_prints_the_same_lint_from_the_cache(tmp_path):
    policy = tmp_path / "p.yaml"
    assert (
        run_cli(
            "plan", "--model", "Qwen3-30B-A3B-FP8", "--ep-size", "8", "-o", str(policy)
        ).returncode
        == 0
    )
    env = {"MOEPOLICY_CACHE_DIR": str(tmp_path / "cache")}
    first, second = (run_cli("audit", str(policy), env=env) for _ in range(2))
    assert first.returncode == second.returncode == 0 and first.stdout == second.stdout
    assert "rule packs (deepep, experts): no shadowed rules" in second.stdout
    assert len(list((tmp_path / "cache" / "lint").glob("*.json"))) == 1
