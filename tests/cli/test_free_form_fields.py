"""The crash sites the every-command fuzzer (tests/test_fuzz.py) found, fixed: a policy's evidence
(provenance, measured, overlap; typed since issue 45) hand-edited out of its form is refused by the
reader in one line naming the field and the value seen, never rendered half-way; evidence in its form
is shown; and stored facts the rules cannot replay are refused by validate and by every command that
replays them."""

import pytest
import yaml

from conftest import run_cli

pytest.importorskip("optuna", reason="the tuned policy comes from a model-bench tune")
pytestmark = (
    pytest.mark.slow
)  # a tune and about forty commands: beside the fuzzer, in the full profile


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tuned")
    out = folder / "t.yaml"
    result = run_cli(
        "tune",
        "--model",
        "Qwen3-30B-A3B-FP8",
        "--ep-size",
        "2",
        "--bench",
        "model",
        "--trials",
        "1",
        "--tokens",
        "128,1024",
        "--storage",
        f"sqlite:///{folder}/s.db",
        "-o",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    from moepolicy.document.yaml_io import parse_text

    return parse_text(
        out.read_text()
    )  # the document tree: each layer with its facts (not their table's names)


def _write(tmp_path, doc, edit):
    from moepolicy.document.keys import compute_keys

    doc = yaml.safe_load(yaml.safe_dump(doc))
    edit(doc)
    doc["key"] = compute_keys(doc)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


# hand edits of the evidence, and what the reader says of each (None: it is in its form)
FREE_FORM_EDITS = {
    "modelled without its times": (
        lambda d: d["deepep"]["buckets"][0]["modelled"].pop("us"),
        "deepep.buckets[0].modelled.us: missing",
    ),
    "a 2.1 confirm without rounds": (
        lambda d: d["deepep"]["buckets"][0].update(
            measured={"confirm": {"vs_engine": {"speedup": 1.1}, "median_us": {"engine": 1}}}
        ),
        "deepep.buckets[0].measured.confirm.kept: missing",
    ),
    "an overlap row of strings": (
        lambda d: d["deepep"]["buckets"][0].update(measured={"overlapped_us": "fast"}),
        "deepep.buckets[0].measured.overlapped_us: Input should be a number above 0, got 'fast'",
    ),
    "an overlap row dividing by zero": (
        lambda d: d["deepep"]["buckets"][0].update(
            measured={"overlapped_us": 1.0, "comm_us": 0, "gemm_us": 0}
        ),
        "deepep.buckets[0].measured.comm_us: Input should be a number above 0, got 0",
    ),
    "a scan of strings": (
        lambda d: d["deepep"]["provenance"].update(
            scan=[{"tokens": "x", "num_sms": [], "best_us": {}}]
        ),
        "deepep.provenance.scan[0].num_sms: Input should be a valid integer, got []",
    ),
    "a scan of huge numbers": (
        lambda d: d["deepep"]["provenance"].update(
            scan=[
                {"tokens": 128, "num_sms": 1e308, "best_us": float("inf")},
                {"tokens": 10**30, "num_sms": 8, "best_us": 1},
            ]
        ),
        "deepep.provenance.scan[0].num_sms: ",
    ),
    "ten thousand token buckets in the scan": (
        lambda d: d["deepep"]["provenance"].update(
            scan=[{"tokens": t, "num_sms": 8, "best_us": 1.0} for t in range(1, 10_001)]
        ),
        None,
    ),
    "overlap splits of garbage": (
        lambda d: d["deepep"].update(
            overlap={"splits_us": {"x": "y", "-3": None, "24": 1e400}, "comm_sms": "many"}
        ),
        "deepep.overlap.comm_sms: Input should be a valid integer, got 'many'",
    ),
}


@pytest.mark.parametrize("edit", list(FREE_FORM_EDITS))
def test_audit_and_report_show_what_they_can_of_a_hand_edited_free_form_field(
    tuned, tmp_path, edit
):
    change, said = FREE_FORM_EDITS[edit]
    path = _write(tmp_path, tuned, change)
    commands = (("audit", str(path)), ("report", str(path), "--plots", str(tmp_path / "plots")))
    if said is None:  # in its form: validate accepts it, audit and report show it
        assert run_cli("validate", str(path)).returncode == 0
        for args in commands:
            result = run_cli(*args)
            assert result.returncode == 0 and "Traceback" not in result.stderr, (
                args,
                result.stderr,
            )
        return
    for args in (("validate", str(path)), *commands):  # out of its form: one line, the field named
        result = run_cli(*args)
        assert result.returncode == 6 and "Traceback" not in result.stderr, (args, result.stderr)
        assert result.stderr.count("\n") == 1 and said in result.stderr, (args, result.stderr)
    assert not (tmp_path / "plots").exists()  # nothing drawn half-way


@pytest.mark.parametrize(
    "fact, value",
    [
        ("target.layout", {}),
        ("target.layout", "sideways"),
        ("layer.top_k", "8"),
        ("layer.hidden_size", None),
        ("target.options", "fp8"),
        ("layer.is_mtp", 1),
    ],
)
def test_stored_facts_the_rules_cannot_replay_are_refused_in_one_line(
    tuned, tmp_path, fact, value
):
    def edit(doc):
        for layer in doc["layers"]:
            layer["facts"] = {**layer["facts"], fact: value}

    path = _write(tmp_path, tuned, edit)
    for args in (
        ("validate",),
        ("validate", "--rekey"),
        ("explain", "--layer", "3"),
        ("export", "--to", "vllm"),
        ("bench", "--dry-run"),
    ):
        result = run_cli(args[0], str(path), *args[1:])
        assert result.returncode == 6 and "Traceback" not in result.stderr, (args, result.stderr)
        assert f"facts.{fact}: must be" in result.stderr.strip().splitlines()[-1]
