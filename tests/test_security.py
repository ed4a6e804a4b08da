"""Hostile input, by class: secrets in storage URLs, shell syntax in model names, control characters in
file-sourced text, special files as inputs and outputs. Each class has its reproduction and a fuzzer
(fixed seeds; MOEPOLICY_FUZZ_EXAMPLES sets the count, CI runs more) that would catch its siblings."""

import json
import os
import stat
import string
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from conftest import run_cli
from moepolicy.cli._output import SafeStream
from moepolicy.export.vllm import render_shell
from moepolicy.redact import redact_command, redact_url
from moepolicy.text import printable
from moepolicy._resources import data_dir  # noqa: E402

EXAMPLES = int(os.environ.get("MOEPOLICY_FUZZ_EXAMPLES", "300"))
FUZZ = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None
)
SLOW_FUZZ = settings(
    max_examples=max(EXAMPLES // 50, 20),
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)

# ---------------------------------------------------------------------------------------------- secrets
MARK = "S3CR"  # every generated secret starts with it; user, host and paths never contain capitals
lower = st.text(alphabet=string.ascii_lowercase + string.digits, min_size=1, max_size=8)
secret = st.builds(
    lambda s: MARK + s,
    st.text(alphabet=string.ascii_letters + string.digits + "@:/?=%!$'()*+,;.~-", max_size=12),
)
query_secret = st.builds(
    lambda s: MARK + s,
    st.text(alphabet=string.ascii_letters + string.digits + "@:/%!$'()*+,;.~-", max_size=12),
)


@st.composite
def secret_urls(draw):
    scheme = draw(
        st.sampled_from(["postgresql", "postgresql+psycopg", "mysql", "mysql+pymysql", "sqlite"])
    )
    user = draw(st.one_of(st.just(""), lower))
    host = draw(lower) + draw(st.sampled_from(["", ":5432", ":1"]))
    path = "/" + draw(lower)
    where = draw(st.sampled_from(["password", "query", "both"]))
    auth = (
        f"{user}:{draw(secret)}@"
        if where in ("password", "both")
        else (f"{user}@" if user else "")
    )
    query = ""
    if where in ("query", "both"):
        key = draw(
            st.sampled_from(["password", "PASSWORD", "pwd", "token", "sslpassword", "api_key"])
        )
        extra = draw(st.sampled_from(["", "user=" + draw(lower) + "&", "sslmode=require&"]))
        query = f"?{extra}{key}={draw(query_secret)}"
    return f"{scheme}://{auth}{host}{path}{query}"


@FUZZ
@seed(20261201)
@given(secret_urls())
def test_no_secret_survives_redaction_in_any_url_shape(url):
    assert MARK not in redact_url(url), url
    assert MARK not in redact_command(["tune", "--storage", url]) and MARK not in redact_command(
        [f"--storage={url}"]
    )


@FUZZ
@seed(20261202)
@given(secret_urls())
def test_a_storage_url_is_refused_or_opened_without_its_secret_in_any_message(url):
    from moepolicy.errors import TuningError
    from moepolicy.tuning.storage import check_storage

    try:
        check_storage(url)
    except TuningError as exc:
        assert MARK not in str(exc), str(exc)


@pytest.mark.slow
@pytest.mark.parametrize(
    "url",
    [
        "postgresql://alice:p@ssw0rdX@localhost:1/db",
        "postgresql://alice:S3CRp%40ssw0rdX@localhost:1/db",
        "postgresql://:S3CROnlyPassPW@localhost:1/db",
        "postgresql://localhost:1/db?user=alice&password=S3CRQueryPW",
    ],
)
def test_the_driver_never_sees_or_echoes_a_password_it_would_misread(tmp_path, url):
    """An unencoded '@' in a password is refused before the driver reads the rest as a host (whose
    name the driver's error echoes); any other secret is hidden in the driver's own message."""
    pytest.importorskip("psycopg", reason="the PostgreSQL driver is a test extra")
    result = run_cli(
        "tune",
        "--model",
        "DeepSeek-V3",
        "--ep-size",
        "2",
        "--bench",
        "model",
        "--trials",
        "1",
        "--storage",
        url,
        "-o",
        str(tmp_path / "p.yaml"),
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr
    for secret in ("ssw0rdX", MARK):
        assert secret not in result.stderr, result.stderr
    if "p@ssw0rdX" in url:
        assert "write it as %40" in result.stderr
    assert not (tmp_path / "p.yaml").exists()


def test_a_path_with_an_at_sign_is_not_a_password():
    assert redact_url("sqlite:////data/a@b/studies.db") == "sqlite:////data/a@b/studies.db"
    assert redact_url("studies.log") == "studies.log"


# ----------------------------------------------------------------------------------------------- shell
SHELL = string.ascii_letters + string.digits + " ;|&$()`'\"\\<>*?!#~{}[]\n\t=-./"


def _served_args(script: str, tmp_path: Path) -> list[str]:
    """Run the export's shell script with ``vllm`` recording its arguments (nothing else may run)."""
    record = tmp_path / "args.txt"
    prelude = f'vllm() {{ printf "%s\\0" "$@" > {record}; }}\n'
    subprocess.run(
        ["bash", "-c", prelude + script], cwd=tmp_path, check=True, timeout=20, capture_output=True
    )
    return record.read_text().split("\0")[:-1]


@SLOW_FUZZ
@seed(20261201)
@given(st.text(alphabet=SHELL, min_size=1, max_size=30))
def test_a_model_name_reaches_vllm_as_one_word_whatever_it_holds(tmp_path_factory, name):
    tmp_path = tmp_path_factory.mktemp("shell")
    script = render_shell(
        {
            "env": {"VLLM_DEEPEP_BUFFER_SIZE_MB": "321"},
            "args": ["--enable-expert-parallel"],
            "cannot_express": [f"a note about {name}"],
        },
        name,
    )
    args = _served_args(script, tmp_path)
    assert args == ["serve", name, "--enable-expert-parallel"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["args.txt"]  # nothing else was created


def test_a_folder_name_with_shell_syntax_is_quoted_end_to_end(tmp_path):
    folder = tmp_path / "my qwen; touch INJECTED #"
    folder.mkdir()
    config = yaml.safe_load(
        (data_dir("catalog") / "Qwen__Qwen3-30B-A3B-FP8" / "config.json").read_text()
    )
    config["_name_or_path"] = (
        "x; touch INJECTED2 #"  # an uploader's path is never used as the name
    )
    (folder / "config.json").write_text(json.dumps(config))
    plan = run_cli(
        "plan", "--model", str(folder), "--ep-size", "8", "-o", str(tmp_path / "p.yaml")
    )
    assert plan.returncode == 0, plan.stderr
    exported = run_cli("export", str(tmp_path / "p.yaml"), "--to", "vllm")
    assert exported.returncode == 0, exported.stderr
    args = _served_args(exported.stdout, tmp_path)
    assert args[:2] == [
        "serve",
        str(folder),
    ]  # the folder the policy was planned from, as one word
    assert not list(tmp_path.glob("INJECTED*"))


# ------------------------------------------------------------------------------------ control characters
@FUZZ
@seed(20261201)
@given(st.text())
def test_printed_text_carries_no_control_character(text):
    out = printable(text)
    assert not [
        c
        for c in out
        if (ord(c) < 32 and c not in "\n\t")
        or 0x7F <= ord(c) <= 0x9F
        or c in "\u2028\u2029"
        or 0x202A <= ord(c) <= 0x202E
        or 0x2066 <= ord(c) <= 0x2069
    ]


def test_the_cli_streams_escape_what_they_are_given(capsys):
    stream = SafeStream(sys.stdout)
    stream.write("why: \x1b[31mred\x1b[0m\rover\n")
    assert capsys.readouterr().out == "why: \\x1b[31mred\\x1b[0m\\rover\n"


HOSTILE = "\x1b[2J\x1b[31mpwned\x07\r"


def test_rule_pack_text_reaches_audit_and_explain_escaped(tmp_path):
    pack = tmp_path / "mine.yaml"
    pack.write_text(
        yaml.safe_dump(
            {
                "pack": "mine",
                "version": "1",
                "rules": [
                    {
                        "id": "mine/all-bf16" + HOSTILE,
                        "priority": 10000,
                        "when": {"fact": "layer.kind", "op": "eq", "value": "moe"},
                        "then": {"order": "dispatch_then_quant", "numerics": "exact"},
                        "why": "because " + HOSTILE,
                        "source": HOSTILE,
                    }
                ],
            }
        )
    )
    out = tmp_path / "p.yaml"
    plan = run_cli(
        "plan", "--model", "DeepSeek-V3", "--ep-size", "8", "--rules", str(pack), "-o", str(out)
    )
    assert plan.returncode == 0, plan.stderr
    for args in (("audit", str(out), "--rules", str(pack)), ("explain", str(out), "--layer", "3")):
        result = run_cli(*args)
        assert result.returncode == 0, result.stderr
        for text in (result.stdout, result.stderr):
            assert "\x1b" not in text and "\r" not in text and "\x07" not in text
        assert "\\x1b[2J" in result.stdout  # shown, escaped


# ----------------------------------------------------------------------------------------- special files
def _special_inputs(tmp_path: Path) -> dict[str, str]:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    folder = tmp_path / "folder"
    folder.mkdir()
    return {
        "/dev/zero": "is a device",
        "/dev/null": "is a device",
        str(fifo): "is a FIFO",
        str(folder): "folder",
        str(tmp_path / "missing.yaml"): "cannot be read",
    }


@pytest.mark.slow
@pytest.mark.parametrize(
    "command",
    [("validate",), ("audit",), ("explain", "--layer", "3"), ("export", "--to", "sglang")],
)
def test_special_files_as_policy_inputs_are_refused_in_one_line(tmp_path, command):
    for path, what in _special_inputs(tmp_path).items():
        result = run_cli(command[0], path, *command[1:])
        assert result.returncode != 0 and "Traceback" not in result.stderr, (path, result.stderr)
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith("moepolicy: ") and what in last, (path, last)


@pytest.mark.slow
def test_special_files_as_model_and_rule_inputs_are_refused(tmp_path):
    for path, _ in _special_inputs(tmp_path).items():
        for args in (("--model", path), ("--model", "DeepSeek-V3", "--rules", path)):
            result = run_cli("plan", *args, "--ep-size", "8")
            assert result.returncode != 0 and "Traceback" not in result.stderr, (
                args,
                result.stderr,
            )
            assert len(result.stderr.strip().splitlines()) <= 2, result.stderr


def test_the_runtime_never_reads_a_special_file_without_bound(tmp_path):
    from moepolicy import load_policy

    for path in _special_inputs(tmp_path):
        policy = load_policy(path, ep_size=8, model="DeepSeek-V3")
        assert policy.is_fallback and policy.layer(3).wire.dtype == "bf16"
        assert (
            policy.deepep.num_nvl_bytes and policy.deepep.num_nvl_bytes > 0
        )  # sized from the model, never 0


def test_the_safe_policy_says_the_engine_decides_where_no_hidden_size_is_known(tmp_path):
    from moepolicy import load_policy

    policy = load_policy(tmp_path / "missing.yaml", ep_size=8)
    assert (
        policy.is_fallback
        and policy.deepep.num_nvl_bytes is None
        and policy.deepep.num_rdma_bytes is None
    )


@pytest.mark.slow
def test_special_files_and_bad_folders_as_outputs_are_refused_before_work(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
    cases = {
        "/dev/full": "is a device",
        str(fifo): "is a FIFO",
        str(tmp_path): "is a folder",
        str(tmp_path / "nodir" / "p.yaml"): "does not exist",
    }
    if os.geteuid() != 0:  # root writes anywhere
        cases[str(ro / "p.yaml")] = "not writable"
    for output, what in cases.items():
        for command in (
            ("plan", "--model", "DeepSeek-V3", "--ep-size", "8"),
            (
                "tune",
                "--model",
                "DeepSeek-V3",
                "--ep-size",
                "2",
                "--bench",
                "model",
                "--trials",
                "1",
                "--storage",
                f"sqlite:///{tmp_path}/s.db",
            ),
        ):
            result = run_cli(*command, "-o", output)
            assert result.returncode == 8 and "Traceback" not in result.stderr, (
                command,
                output,
                result.stderr,
            )
            assert what in result.stderr.strip().splitlines()[-1]
            if command[0] == "tune":
                assert (
                    "bench:" in result.stderr and "tuning hidden" not in result.stderr
                )  # refused before the search
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode) and stat.S_ISFIFO(
        os.stat(fifo).st_mode
    )  # untouched


def test_a_symbolic_link_output_is_written_through(tmp_path):
    real = tmp_path / "v3.yaml"
    real.write_text("old\n")
    link = tmp_path / "policy.yaml"
    link.symlink_to(real.name)
    result = run_cli("plan", "--model", "DeepSeek-V3", "--ep-size", "8", "-o", str(link))
    assert result.returncode == 0, result.stderr
    assert link.is_symlink() and real.read_text().startswith("schema_version")


def test_standard_output_on_a_full_disk_is_one_line(tmp_path):
    with open("/dev/full", "w") as full:
        for command in (("models",), ("plan", "--model", "DeepSeek-V3", "--ep-size", "8")):
            result = subprocess.run(
                [sys.executable, "-m", "moepolicy", *command],
                stdout=full,
                stderr=subprocess.PIPE,
                text=True,
                timeout=60,
                env={**os.environ, "MOEPOLICY_OFFLINE": "1"},
            )
            assert (
                result.returncode == 1
                and "Traceback" not in result.stderr
                and "Exception ignored" not in result.stderr
            )
            assert (
                result.stderr.strip().splitlines()[-1]
                == "moepolicy: cannot write to standard output (No space left on device)"
            )


def test_storage_in_a_missing_folder_is_refused_before_work(tmp_path):
    for storage in (str(tmp_path / "nonexist" / "j.log"), f"sqlite:///{tmp_path}/nonexist/s.db"):
        result = run_cli(
            "tune",
            "--model",
            "DeepSeek-V3",
            "--ep-size",
            "2",
            "--bench",
            "model",
            "--trials",
            "1",
            "--storage",
            storage,
            "-o",
            str(tmp_path / "p.yaml"),
        )
        assert result.returncode != 0 and "Traceback" not in result.stderr
        assert "does not exist" in result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "flag, value, what",
    [
        ("--seed", "-1", "--seed must be"),
        ("--seed", str(2**32), "--seed must be"),
        ("--tokens", "0", "--tokens needs positive"),
        ("--tokens", "-5", "--tokens needs positive"),
        ("--max-buffer-mb", "0", "--max-buffer-mb must"),
    ],
)
def test_out_of_range_tune_flags_are_one_line(tmp_path, flag, value, what):
    result = run_cli(
        "tune",
        "--model",
        "DeepSeek-V3",
        "--ep-size",
        "2",
        "--bench",
        "model",
        f"{flag}={value}",
        "--storage",
        f"sqlite:///{tmp_path}/s.db",
        "-o",
        str(tmp_path / "p.yaml"),
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr and what in result.stderr


# ---------------------------------------------------------------------------------- unsafe results
def test_a_user_pack_cannot_replace_a_built_in_one(tmp_path):
    pack = tmp_path / "deepep.yaml"
    pack.write_text(
        yaml.safe_dump(
            {
                "pack": "deepep",
                "version": "9",
                "rules": [
                    {
                        "id": "x",
                        "priority": 1,
                        "when": {"fact": "layer.kind", "op": "eq", "value": "moe"},
                        "then": {"order": "dispatch_then_quant", "numerics": "exact"},
                        "why": "w",
                        "source": "s",
                    }
                ],
            }
        )
    )
    result = run_cli("plan", "--model", "DeepSeek-V3", "--ep-size", "8", "--rules", str(pack))
    assert result.returncode != 0 and "cannot replace a built-in one" in result.stderr


def test_an_unresolvable_model_is_a_mismatch_and_never_contacts_the_hub(tmp_path, monkeypatch):
    from moepolicy import load_policy
    from moepolicy.checkpoint import hub

    out = tmp_path / "p.yaml"
    assert (
        run_cli("plan", "--model", "DeepSeek-V3", "--ep-size", "8", "-o", str(out)).returncode == 0
    )
    monkeypatch.delenv("MOEPOLICY_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hf-cache"))
    monkeypatch.setattr(hub, "_failure", lambda *args: pytest.fail("the runtime asked the hub"))
    policy = load_policy(out, ep_size=8, model="no/such-model")
    assert policy.is_fallback and policy.report["decision"] == "mismatched"
    with pytest.raises(Exception, match="model could not be read"):
        load_policy(out, ep_size=8, model="no/such-model", strict=True)


def _edited(tmp_path, edit) -> Path:
    from moepolicy.document.keys import compute_keys

    out = tmp_path / "p.yaml"
    assert (
        run_cli("plan", "--model", "DeepSeek-V3", "--ep-size", "8", "-o", str(out)).returncode == 0
    )
    doc = yaml.safe_load(out.read_text())
    edit(doc)
    doc["key"] = compute_keys(doc)
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


@pytest.mark.parametrize(
    "edit, what",
    [
        (lambda d: d["deepep"].update(num_nvl_bytes=128), "num_nvl_bytes 128 is smaller than"),
        (
            lambda d: d["deepep"]["buckets"][0].update(max_tokens=128),
            "the last bucket must have no max_tokens",
        ),
    ],
)
def test_validate_checks_buffers_against_the_configs_and_bucket_coverage(tmp_path, edit, what):
    from moepolicy import load_policy

    out = _edited(tmp_path, edit)
    result = run_cli("validate", str(out))
    assert result.returncode != 0 and what in result.stderr
    assert load_policy(out, ep_size=8).is_fallback


def test_rekey_never_writes_a_document_it_would_reject(tmp_path):
    out = tmp_path / "p.yaml"
    assert (
        run_cli("plan", "--model", "DeepSeek-V3", "--ep-size", "8", "-o", str(out)).returncode == 0
    )
    doc = yaml.safe_load(out.read_text())
    doc["layers"][3]["order"] = "sometimes"
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    before = out.read_text()
    result = run_cli("validate", "--rekey", str(out))
    assert result.returncode != 0 and "not written" in result.stderr and out.read_text() == before


def test_rekey_refuses_facts_edited_away_from_the_recorded_decisions(tmp_path):
    """A hand edit of layer_facts, rekeyed, told four stories: the file's decisions (what serving
    applies), explain's and the export's replay of the edited facts, and the served model's. --rekey
    now writes only a document whose decisions follow from its facts."""
    out = tmp_path / "p.yaml"
    assert (
        run_cli(
            "plan", "--model", "Qwen3-30B-A3B-FP8", "--ep-size", "8", "-o", str(out)
        ).returncode
        == 0
    )
    doc = yaml.safe_load(out.read_text())
    (key,) = {layer["facts"] for layer in doc["layers"] if layer["kind"] == "moe"}
    doc["layer_facts"][key].update(  # experts that read fp8 1x128 blocks, by hand
        {
            "kernel.act_dtype": "fp8_e4m3",
            "kernel.act_granularities": ["group"],
            "kernel.act_group": 128,
        }
    )
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    before = out.read_text()
    refused = run_cli("validate", "--rekey", str(out))
    assert refused.returncode == 6 and out.read_text() == before, refused.stderr
    line = refused.stderr.strip().splitlines()[-1]
    assert (
        "(rekeyed, not written): layers[0] records no_quant by rule moe/bf16-activations" in line
    )
    assert "but its stored facts decide" in line and "(and 47 more layers)" in line
    # the decisions edited to what the refusal says the facts decide: one story again, written
    import re

    order, rule = re.search(r"stored facts decide (\S+) by rule (\S+?)[ ,;(]", line).groups()
    for layer in doc["layers"]:
        if layer["kind"] == "moe":
            layer.update(order=order, rule=rule)
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    rekeyed = run_cli("validate", "--rekey", str(out))
    assert rekeyed.returncode == 0, rekeyed.stderr
    explained = run_cli("explain", str(out), "--layer", "0")
    assert explained.returncode == 0 and "the file records" not in explained.stderr


@pytest.mark.slow
def test_low_latency_has_nothing_to_tune_and_audit_shows_no_chunks(tmp_path):
    tune = run_cli(
        "tune",
        "--model",
        "DeepSeek-V3",
        "--ep-size",
        "8",
        "--backend",
        "deepep_ll",
        "--bench",
        "model",
        "-o",
        str(tmp_path / "t.yaml"),
    )
    assert tune.returncode == 2 and "no SM count or chunk sizes to tune" in tune.stderr
    out = tmp_path / "ll.yaml"
    assert (
        run_cli(
            "plan",
            "--model",
            "DeepSeek-V3",
            "--ep-size",
            "8",
            "--backend",
            "deepep_ll",
            "-o",
            str(out),
        ).returncode
        == 0
    )
    audit = run_cli("audit", str(out))
    assert "send chunks" not in audit.stdout and "no chunk settings" in audit.stdout


# ------------------------------------------------------------------- policies name files, never paths
PATHLIKE = [
    "../../../../etc/passwd",
    "/etc/passwd",
    "sub/pack.yaml",
    "..",
    ".hidden",
    "a\\b",
    "x" * 200,
]


def _planned(tmp_path: Path, *extra: str) -> Path:
    out = tmp_path / "p.yaml"
    result = run_cli("plan", "--model", "DeepSeek-V3", "--ep-size", "8", *extra, "-o", str(out))
    assert result.returncode == 0, result.stderr
    return out


def _rekeyed(path: Path, edit) -> str:
    """The policy at ``path`` edited and rekeyed (its integrity intact: only the reader's rules stand)."""
    from moepolicy.document.keys import compute_keys

    doc = yaml.safe_load(path.read_text())
    edit(doc)
    doc["key"] = compute_keys(doc)
    text = yaml.safe_dump(doc, sort_keys=False)
    path.write_text(text)
    return text


def _sheet(value):
    return lambda d: d["target"]["deep_ep"].update(sheet=value)


def _pack_field(field, value):
    return lambda d: d["rules"]["packs"][0].update({field: value})


@pytest.mark.parametrize(
    "edit, where",
    [(_sheet(v), "target.deep_ep.sheet") for v in PATHLIKE[:3]]
    + [(_pack_field("path", v), "rules.packs[0].path") for v in PATHLIKE]
    + [(_pack_field("name", v), "rules.packs[0].name") for v in PATHLIKE[:2]],
)
def test_a_policy_that_names_a_sheet_or_pack_by_path_is_refused_by_every_reader(
    tmp_path, edit, where
):
    """validate, validate --rekey and load_policy share the reader: names only, never paths."""
    from moepolicy import load_policy
    from moepolicy.errors import PolicyError

    out = _planned(tmp_path)
    text = _rekeyed(out, edit)
    for args in (("validate",), ("validate", "--rekey")):
        result = run_cli(*args, str(out))
        assert result.returncode == 6 and "Traceback" not in result.stderr, result.stderr
        line = result.stderr.strip().splitlines()[-1]
        assert where in line and "never a path" in line, line
    assert out.read_text() == text  # --rekey wrote nothing
    with pytest.raises(PolicyError, match="never a path"):
        load_policy(out, ep_size=8, strict=True)
    policy = load_policy(out, ep_size=8)
    assert policy.is_fallback and "never a path" in policy.fallback_reason


def test_the_runtime_reads_a_user_pack_with_a_bound(tmp_path):
    """A pack file beside the policy is hashed from at most 16 MiB, whatever its size."""
    import tracemalloc

    from moepolicy import load_policy

    pack = tmp_path / "mine.yaml"
    pack.write_text(yaml.safe_dump(_pack_doc("mine")))
    out = _planned(tmp_path, "--rules", str(pack))
    with open(pack, "ab") as handle:  # 256 MiB, sparse: no disk used
        handle.truncate(256 * 1024 * 1024)
    tracemalloc.start()
    try:
        policy = load_policy(out, ep_size=8)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024 * 1024, peak
    assert policy.report["decision"] != "matched" or "rule_packs: matched" not in " ".join(
        policy.report_details
    )


def _pack_doc(name: str, why: str = "mine") -> dict:
    return {
        "pack": name,
        "version": "1",
        "rules": [
            {
                "id": f"{name}/all-bf16",
                "priority": 10000,
                "when": {"fact": "layer.kind", "op": "eq", "value": "moe"},
                "then": {"order": "dispatch_then_quant", "numerics": "exact"},
                "why": why,
                "source": "test",
            }
        ],
    }


def _pack_status(policy) -> str:
    return next(d for d in policy.report_details if d.startswith("decision.rule_packs:"))


def test_a_policy_records_its_user_pack_by_name_and_hash_not_by_path(tmp_path):
    pack = tmp_path / "packs" / "team-fp8.yaml"
    pack.parent.mkdir()
    pack.write_text(yaml.safe_dump(_pack_doc("team")))
    out = _planned(tmp_path, "--rules", str(pack))
    ref = yaml.safe_load(out.read_text())["rules"]["packs"][0]
    assert ref["name"] == "team" and ref["path"] == "team-fp8.yaml" and len(ref["sha256"]) == 64
    assert (
        str(tmp_path) not in out.read_text().split("generated:")[0]
    )  # no path in what the runtime reads


def test_an_edited_user_pack_is_detected_whatever_the_working_folder(tmp_path, monkeypatch):
    """The pack beside the policy (found by name), or where load_policy is told (rules=): the same
    answer from any working folder."""
    from moepolicy import load_policy

    work = tmp_path / "work"
    work.mkdir()
    (work / "team.yaml").write_text(yaml.safe_dump(_pack_doc("team")))
    monkeypatch.chdir(work)
    assert (
        run_cli(
            "plan",
            "--model",
            "DeepSeek-V3",
            "--ep-size",
            "8",
            "--rules",
            "team.yaml",
            "-o",
            "p.yaml",
            cwd=work,
        ).returncode
        == 0
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for cwd in (work, elsewhere, tmp_path):
        monkeypatch.chdir(cwd)
        assert "rule_packs: matched" in _pack_status(load_policy(work / "p.yaml", ep_size=8)), cwd
    (work / "team.yaml").write_text(yaml.safe_dump(_pack_doc("team", why="edited")))
    for cwd in (work, elsewhere, tmp_path):
        monkeypatch.chdir(cwd)
        policy = load_policy(work / "p.yaml", ep_size=8)
        assert "rule_packs: mismatched" in _pack_status(policy) and policy.is_fallback, cwd
    # a policy moved away from its pack: found only where the caller says
    moved = elsewhere / "p.yaml"
    moved.write_text((work / "p.yaml").read_text())
    for cwd in (work, elsewhere):
        monkeypatch.chdir(cwd)
        assert "rule_packs: unchecked" in _pack_status(load_policy(moved, ep_size=8)), cwd
        assert "rule_packs: mismatched" in _pack_status(
            load_policy(moved, ep_size=8, rules=[work])
        ), cwd
        assert "rule_packs: mismatched" in _pack_status(
            load_policy(moved, ep_size=8, rules=[work / "team.yaml"])
        )


def test_explain_and_audit_find_a_user_pack_where_they_are_told(tmp_path):
    pack = tmp_path / "packs" / "team.yaml"
    pack.parent.mkdir()
    pack.write_text(yaml.safe_dump(_pack_doc("team")))
    out = _planned(tmp_path, "--rules", str(pack))
    explained = run_cli("explain", str(out), "--layer", "3")
    assert explained.returncode == 6 and "pass its file with --rules" in explained.stderr
    explained = run_cli("explain", str(out), "--layer", "3", "--rules", str(pack.parent))
    assert explained.returncode == 0 and "team/all-bf16" in explained.stdout, explained.stderr
    audit = run_cli("audit", str(out), "--rules", str(pack.parent))
    assert audit.returncode == 0 and "rule packs (team, deepep, experts)" in audit.stdout


def test_a_pack_named_like_a_path_is_refused_when_planning(tmp_path):
    pack = tmp_path / "p.yaml"
    pack.write_text(yaml.safe_dump(_pack_doc("../escape")))
    result = run_cli("plan", "--model", "DeepSeek-V3", "--ep-size", "8", "--rules", str(pack))
    assert result.returncode == 4 and "'pack' must be a name" in result.stderr


# ------------------------------------------------------------------ secrets: SQLAlchemy's own reading
@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://u:pw@h/db?pass%77ord={MARK}q",  # SQLAlchemy decodes the key to 'password'
        f"postgresql://h/db?%70assword={MARK}q&sslmode=require",
        f" postgresql://u:{MARK}pw@h/db",  # a leading space: not a URL SQLAlchemy parses
        f"postgresql://u:{MARK}pw@h/db ",
        f"postgresql:/u:{MARK}pw@h/db",  # one slash
        f"postgresql:u:{MARK}pw@h/db",
        f"mysql+pymysql://u:{MARK}p@w@h/db",  # an '@' left in the password
        f"u:{MARK}pw@h/db",  # no scheme at all
    ],
)
def test_secrets_in_urls_sqlalchemy_reads_differently_are_hidden(url):
    from moepolicy.errors import TuningError
    from moepolicy.tuning.storage import check_storage

    assert MARK not in redact_url(url), redact_url(url)
    assert MARK not in redact_command(["tune", "--storage", url]) and MARK not in redact_command(
        [f"--storage={url}"]
    )
    try:
        check_storage(url)
    except TuningError as exc:
        assert MARK not in str(exc), str(exc)


def test_urls_sqlalchemy_cannot_parse_whole_are_refused_before_work(tmp_path):
    for url in (
        f" postgresql://u:{MARK}pw@localhost:1/db",
        f"postgresql:/u:{MARK}pw@localhost:1/db",
    ):
        result = run_cli(
            "tune",
            "--model",
            "DeepSeek-V3",
            "--ep-size",
            "2",
            "--bench",
            "model",
            "--storage",
            url,
            "-o",
            str(tmp_path / "p.yaml"),
        )
        assert (
            result.returncode == 7
            and MARK not in result.stderr
            and "Traceback" not in result.stderr
        )
        assert "tuning hidden" not in result.stderr and result.stderr.strip().splitlines()[
            -1
        ].startswith("moepolicy: ")


def test_without_sqlalchemy_every_url_is_hidden_whole(monkeypatch):
    monkeypatch.setitem(sys.modules, "sqlalchemy", None)  # import sqlalchemy raises ImportError
    monkeypatch.setitem(sys.modules, "sqlalchemy.engine", None)
    assert redact_url(f"postgresql://u:{MARK}@h/db") == "postgresql:***"
    assert redact_url("sqlite:////data/studies.db") == "sqlite:***"
    assert (
        redact_url("studies.log") == "studies.log"
        and redact_url("journal:studies.log") == "journal:studies.log"
    )


def test_redaction_imports_sqlalchemy_only_when_a_url_is_redacted():
    code = (
        "import sys, moepolicy.redact, moepolicy.runtime; assert 'sqlalchemy' not in sys.modules; "
        "moepolicy.redact.redact_url('postgresql://u:p@h/d'); assert 'sqlalchemy' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@FUZZ
@seed(20261203)
@given(
    secret_urls(),
    st.sampled_from(["", " ", "  ", "\t"]),
    st.sampled_from(["://", ":/", ":", ":///"]),
    st.sampled_from(["", "pass%77ord", "%70assword", "PASS%57ORD", "api%5Fkey"]),
)
def test_no_secret_survives_redaction_in_mistyped_urls(url, space, slashes, encoded_key):
    if encoded_key:
        url += ("&" if "?" in url else "?") + f"{encoded_key}={MARK}enc"
    typed = space + url.replace("://", slashes, 1) + space[:1]
    assert MARK not in redact_url(typed), (typed, redact_url(typed))
    assert MARK not in redact_command(["--storage", typed])


# ---------------------------------------------------------------- the runtime's log lines are escaped
HOSTILE_NAME = "deepseek\x1b]8;;https://evil.example\x07click\x1b]8;;\x07\u202egnp.exe\x1b[2J"


def test_load_policy_logs_a_policy_s_text_escaped(tmp_path, caplog):
    import logging

    from moepolicy import load_policy

    out = _planned(tmp_path)
    _rekeyed(out, lambda d: d["model"].update(name=HOSTILE_NAME))
    hostile_file = tmp_path / "p\x1b[31m\u202e.yaml"
    hostile_file.write_text(out.read_text())
    with caplog.at_level(logging.WARNING, logger="moepolicy"):
        load_policy(
            out, ep_size=8, model="Qwen3-30B-A3B"
        )  # another model: the warning quotes the policy's name
        load_policy(hostile_file, ep_size=4)  # another EP size: the warning quotes the file
        load_policy(tmp_path / "missing\x07\x1b[2J.yaml")
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) >= 3 and any("deepseek" in m for m in messages)
    for message in messages:
        assert not [
            c
            for c in message
            if ord(c) < 32 or 0x7F <= ord(c) <= 0x9F or c in "\u202e\u2066\u200f"
        ], message
    assert any("\\x1b" in m for m in messages)


def test_printable_is_one_home_for_escaping_and_light():
    code = (
        "import sys, moepolicy.text; assert not [m for m in ('yaml', 'pydantic', 'torch') if m in sys.modules]; "
        "print(moepolicy.text.printable('\\u200f\\u061c\\n', one_line=True))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, timeout=60, capture_output=True, text=True
    ).stdout
    assert out.strip() == "\\u200f\\u061c\\n"


# ---------------------------------------------------------------- load_policy's own arguments
@pytest.mark.parametrize("ep_size", ["8", [8], (8,), -8, 0, 8.0, True, 2**40, float("nan"), None])
def test_load_policy_never_raises_for_an_odd_ep_size_and_never_sizes_a_buffer_negative(
    tmp_path, ep_size
):
    from moepolicy import load_policy
    from moepolicy.errors import PolicyError

    out = _planned(tmp_path)
    policy = load_policy(out, ep_size=ep_size, model="DeepSeek-V3")
    assert policy.layer(3).order and policy.deepep.num_sms > 0
    assert policy.deepep.num_nvl_bytes is None or policy.deepep.num_nvl_bytes > 0
    assert policy.deepep.num_rdma_bytes is None or policy.deepep.num_rdma_bytes >= 0
    if ep_size is None:
        assert not policy.is_fallback
        return
    assert policy.is_fallback and "ep_size must be a whole number" in policy.fallback_reason
    with pytest.raises(PolicyError, match="ep_size must be a whole number"):
        load_policy(out, ep_size=ep_size, strict=True)
