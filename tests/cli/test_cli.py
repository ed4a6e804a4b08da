"""The CLI as a user runs it: output, first stderr line, one-line errors, exit codes."""

import json
import re

import pytest
import yaml

from moepolicy.document.constraints import SCHEMA_VERSION
from conftest import run_cli


def assert_one_line_error(result, fragment, code=None):
    assert result.returncode != 0
    if code is not None:
        assert result.returncode == code
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert fragment in lines[0]


def test_models_lists_catalog():
    result = run_cli("models")
    assert result.returncode == 0
    assert "deepseek-ai/DeepSeek-V3" in result.stdout and "fp8_e4m3/1x128 dynamic" in result.stdout
    row = next(
        line for line in result.stdout.splitlines() if line.startswith("deepseek-ai/DeepSeek-V3 ")
    )
    assert row.split()[-6:] == ["59", "3", "256", "8", "7168", "complete"]


def test_plan_to_stdout_names_target_first():
    result = run_cli(
        "plan", "--model", "Qwen/Qwen3-30B-A3B-FP8", "--ep-size", "8", "--gpu", "h200"
    )
    assert result.returncode == 0, result.stderr
    first = result.stderr.splitlines()[0]
    # vLLM 0.33.0 runs block fp8 with EP on SM90 on FlashInfer CUTLASS (oracle/fp8.py:122-130), whose
    # experts quantize their own input: bf16 on the wire (flashinfer_cutlass_moe.py:123-125)
    for part in (
        "gpu=h200",
        "ep_size=8",
        "backend=deepep_ht",
        "expert_kernel=flashinfer_cutlass",
        "deep_ep=deepep-legacy-29d31c0",
    ):
        assert part in first
    # the id is the catalog's: said, with how to read the hub's copy instead
    assert (
        "model: Qwen/Qwen3-30B-A3B-FP8 from moepolicy's catalog" in result.stderr.splitlines()[1]
    )
    doc = yaml.safe_load(result.stdout)
    assert doc["schema_version"] == SCHEMA_VERSION and len(doc["layers"]) == 48
    assert doc["layers"][0]["order"] == "no_quant"
    assert doc["deepep"]["provenance"]["source"] == "default"


def test_plan_json_to_file(tmp_path):
    out = tmp_path / "p.json"
    result = run_cli("plan", "--model", "DeepSeek-V3", "--ep-size", "8", "-o", str(out))
    assert result.returncode == 0, result.stderr
    doc = json.loads(out.read_text())
    assert [layer["index"] for layer in doc["layers"]] == list(range(62))


def test_plan_reports_difference_from_vllm(write_config):
    config = {
        "hidden_size": 4096,
        "num_hidden_layers": 4,
        "num_experts": 64,
        "num_experts_per_tok": 8,
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "config_groups": {
                "g": {
                    "targets": ["Linear"],
                    "weights": {
                        "num_bits": 8,
                        "type": "float",
                        "strategy": "channel",
                        "dynamic": False,
                    },
                    "input_activations": {
                        "num_bits": 8,
                        "type": "float",
                        "strategy": "token",
                        "dynamic": True,
                    },
                }
            },
        },
    }
    result = run_cli("plan", "--model", str(write_config(config)), "--ep-size", "8")
    assert result.returncode == 0, result.stderr
    assert "this policy differs from vLLM's own choice on 4 of 4 MoE layers" in result.stderr
    vllm = run_cli(
        "plan", "--model", str(write_config(config)), "--ep-size", "8", "--rules", "vllm"
    )
    doc = yaml.safe_load(vllm.stdout)
    assert {layer["rule"] for layer in doc["layers"]} == {"vllm/ht-per-token"}


def test_tune_ends_with_how_the_policy_differs_from_vllm(write_config, tmp_path):
    config = {
        "hidden_size": 4096,
        "num_hidden_layers": 4,
        "num_experts": 64,
        "num_experts_per_tok": 8,
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "config_groups": {
                "g": {
                    "targets": ["Linear"],
                    "weights": {
                        "num_bits": 8,
                        "type": "float",
                        "strategy": "channel",
                        "dynamic": False,
                    },
                    "input_activations": {
                        "num_bits": 8,
                        "type": "float",
                        "strategy": "token",
                        "dynamic": True,
                    },
                }
            },
        },
    }
    result = run_cli(
        "tune",
        "--model",
        str(write_config(config)),
        "--ep-size",
        "8",
        "--bench",
        "model",
        "--storage",
        f"sqlite:///{tmp_path}/s.db",
        "-o",
        str(tmp_path / "p.yaml"),
    )
    assert result.returncode == 0, result.stderr
    last = result.stderr.strip().splitlines()[-2]  # then "wrote ..."
    assert last.startswith("this policy differs from vLLM's own choice on 4 of 4 MoE layers"), (
        result.stderr
    )
    assert "DeepEP: its default configs (extrapolated)" in last
    same = run_cli(
        "tune",
        "--model",
        "Qwen3-30B-A3B-FP8",
        "--ep-size",
        "2",
        "--bench",
        "model",
        "--tokens",
        "128",
        "--storage",
        f"sqlite:///{tmp_path}/s.db",
        "-o",
        str(tmp_path / "q.yaml"),
    )
    assert same.returncode == 0, same.stderr
    assert "this policy matches vLLM's own choice on all 48 MoE layers; DeepEP: " in same.stderr


def test_tune_says_when_it_resumes_a_study(tmp_path):
    argv = [
        "tune",
        "--model",
        "Qwen3-30B-A3B-FP8",
        "--ep-size",
        "2",
        "--bench",
        "model",
        "--tokens",
        "128,1024",
        "--storage",
        f"sqlite:///{tmp_path}/s.db",
        "-o",
        str(tmp_path / "p.yaml"),
    ]
    first = run_cli(*argv)
    assert first.returncode == 0, first.stderr
    assert "resuming" not in first.stderr
    # the organisation kept (fine-tunes do not collide), and the fingerprint's first 8 digits
    found = re.search(
        r"study '(Qwen--Qwen3-30B-A3B-FP8-h200-ep2-deepep_ht-model-[0-9a-f]{8})' in ", first.stderr
    )
    assert found, first.stderr
    name = found.group(1)
    assert f"study '{name}' in sqlite:///{tmp_path}/s.db: new" in first.stderr
    again = run_cli(*argv)
    assert again.returncode == 0, again.stderr
    assert f"resuming study '{name}': 2 finished trials from before" in again.stderr


def test_infeasible_exits_nonzero_with_reason():
    result = run_cli("plan", "--model", "Qwen1.5-MoE-A2.7B-Chat-GPTQ-Int4", "--ep-size", "8")
    assert_one_line_error(result, "infeasible", code=5)
    assert "60 experts do not divide over EP size 8" in result.stderr
    assert result.stdout == ""


def test_a_model_without_moe_layers_gets_no_policy(write_config, tmp_path):
    """A dense model has nothing to dispatch: no policy and no expert-parallel launch for it."""
    config = write_config(
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": 4096,
            "num_hidden_layers": 32,
            "intermediate_size": 14336,
        }
    )
    out = tmp_path / "dense.yaml"
    planned = run_cli("plan", "--model", str(config), "--ep-size", "8", "-o", str(out))
    assert_one_line_error(planned, "has no MoE layers", code=5)
    tuned = run_cli(
        "tune", "--model", str(config), "--ep-size", "8", "-o", str(out)
    )  # says its bench first
    assert tuned.returncode == 5 and "Traceback" not in tuned.stderr
    assert "has no MoE layers" in tuned.stderr.strip().splitlines()[-1]
    assert not out.exists()


@pytest.mark.parametrize("node", [[], ["--gpus-per-node", "4"]])
def test_plan_and_a_tune_without_gpus_take_the_same_ep_size_without_ep_size(tmp_path, node):
    """One default, said in one line: without --ep-size both plan for one full node (--gpus-per-node,
    default 8), as the README's quick start tunes; plan once refused, tune assumed EP 8."""
    planned = run_cli(
        "plan", "--model", "Qwen3-30B-A3B-FP8", *node, "-o", str(tmp_path / "p.yaml")
    )
    tuned = run_cli(
        "tune",
        "--model",
        "Qwen3-30B-A3B-FP8",
        *node,
        "--bench",
        "model",
        "--tokens",
        "128",
        "--storage",
        f"sqlite:///{tmp_path}/s.db",
        "-o",
        str(tmp_path / "t.yaml"),
    )
    assert planned.returncode == 0 and tuned.returncode == 0, planned.stderr + tuned.stderr
    planned_ep = yaml.safe_load((tmp_path / "p.yaml").read_text())["target"]["ep_size"]
    tuned_ep = yaml.safe_load((tmp_path / "t.yaml").read_text())["target"]["ep_size"]
    assert planned_ep == tuned_ep == (int(node[1]) if node else 8)
    said = f"no --ep-size: planning for one full node, EP {planned_ep} (pass --ep-size to choose)"
    assert said in planned.stderr.splitlines() and said in tuned.stderr.splitlines()


@pytest.mark.parametrize(
    "args, fragment",
    [
        (
            ("plan", "--model", "Qwen3-30B-A3B-FP9", "--ep-size", "8"),
            "unknown model 'Qwen3-30B-A3B-FP9'",
        ),
        (
            ("plan", "--model", "DeepSeek-V3", "--ep-size", "8", "--gpu", "h300"),
            "--gpu 'h300' is not a known profile",
        ),
        (
            ("plan", "--model", "DeepSeek-V3", "--ep-size", "8", "--expert-kernel", "deepgem"),
            "did you mean 'deepgemm'",
        ),
        (
            ("plan", "--model", "DeepSeek-V3", "--ep-size", "8", "--rules", "nope.yaml"),
            "--rules 'nope.yaml'",
        ),
        (("plan", "--model", "/no/such/config.json", "--ep-size", "8"), "no such file"),
        (("plan", "--ep-size", "8"), "--model"),
        (("explain", "--vocab", "--layer"), "expected one argument"),
    ],
)
def test_usage_and_input_errors_are_one_line(args, fragment):
    assert_one_line_error(run_cli(*args), fragment)


def test_bad_config_error_names_file_and_field(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps({"num_hidden_layers": 4, "num_experts": 8, "num_experts_per_tok": 2})
    )
    result = run_cli("plan", "--model", str(path), "--ep-size", "8")
    assert_one_line_error(result, f"{path}: missing field 'hidden_size'", code=3)


def test_explain_from_file_and_from_model(tmp_path):
    out = tmp_path / "ds.yaml"
    assert (
        run_cli(
            "plan",
            "--model",
            "DeepSeek-V3",
            "--ep-size",
            "8",
            "--expert-kernel",
            "deepgemm",
            "-o",
            str(out),
        ).returncode
        == 0
    )
    from_file = run_cli("explain", str(out), "--layer", "3")
    assert from_file.returncode == 0, from_file.stderr
    assert "layer 3: quant_then_dispatch" in from_file.stdout
    assert (
        "no        deepep/dense/none (priority 1000): layer.kind eq dense failed: saw moe"
        in from_file.stdout
    )
    assert "=> fired     deepep/deepep-ht/block-fp8" in from_file.stdout
    from_model = run_cli(
        "explain",
        "--model",
        "DeepSeek-V3",
        "--ep-size",
        "8",
        "--expert-kernel",
        "deepgemm",
        "--layer",
        "3",
    )
    assert from_model.stdout == from_file.stdout
    missing = run_cli("explain", str(out), "--layer", "99")
    assert_one_line_error(missing, "--layer 99 is not in")


def test_audit_groups_fallbacks(tmp_path):
    out = tmp_path / "glm.yaml"
    assert (
        run_cli(
            "plan", "--model", "GLM-4.6-FP8-dynamic", "--ep-size", "8", "-o", str(out)
        ).returncode
        == 0
    )
    result = run_cli("audit", str(out))
    assert result.returncode == 0
    assert "90 fell back" in result.stdout
    assert "- 90 layer(s) [3-92] by moe/unknown-scheme" in result.stdout
    doc = yaml.safe_load(out.read_text())
    assert f"DeepEP: {doc['deepep']['num_sms']} SMs" in result.stdout
    assert doc["deepep"]["provenance"]["source"] == "default"  # plan writes DeepEP's defaults
    assert "; DeepEP's built-in defaults for this EP size (from a plan" in result.stdout
    assert f"  {doc['deepep']['provenance']['note']}" in result.stdout  # and says whose defaults


def test_explain_vocab_lists_every_fact():
    from moepolicy.rules.vocabulary import VOCABULARY

    result = run_cli("explain", "--vocab")
    listed = {line.split()[0] for line in result.stdout.splitlines()}
    assert listed == set(VOCABULARY)


def test_installed_console_script_carries_its_data(tmp_path):
    """A plain (non-editable) install carries moepolicy/data (packs, sheets, tuning data, catalog)."""
    import os
    import shutil
    import subprocess

    exe = shutil.which("moepolicy")
    if exe is None:
        pytest.skip("the moepolicy console script is not installed (pip install .)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([exe, "models"], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert "openai/gpt-oss-120b" in result.stdout
    plan = subprocess.run(
        [exe, "plan", "--model", "DeepSeek-V3", "--ep-size", "8", "--gpu", "h200"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
    )
    assert plan.returncode == 0, plan.stderr


def test_tune_without_the_tune_extra_says_how_to_install_it(tmp_path):
    """After a plain 'pip install .' (no optuna, hence no numpy), tune ends in the one-line fix
    before any bench is built, not in a traceback from the model bench's fit."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "sys.modules['optuna'] = None\n"  # 'import optuna' raises ImportError, as where it is missing
        "sys.modules['numpy'] = None\n"
        "from moepolicy.cli.main import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    args = ["tune", "--model", "Qwen3-30B-A3B-FP8", "--ep-size", "2", "--bench", "model"]
    done = subprocess.run(
        [sys.executable, "-c", code, *args, "-o", str(tmp_path / "p.yaml")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "moepolicy: tuning needs optuna: pip install optuna (or, in a moepolicy checkout, "
        "pip install '.[tune]')"
    )
    assert not (tmp_path / "p.yaml").exists()


def test_audit_says_in_the_table_why_a_quantized_checkpoint_sends_bf16(tmp_path):
    """An fp8 checkpoint whose layers all send bf16 with no_quant (vLLM's FlashInfer CUTLASS
    experts quantize their own input): the reason is in audit's table, not only in explain."""
    out = tmp_path / "q.yaml"
    args = ("--model", "Qwen3-30B-A3B-FP8", "--ep-size", "8", "--gpu", "h200")
    assert run_cli("plan", *args, "-o", str(out)).returncode == 0
    result = run_cli("audit", str(out))
    row = next(line for line in result.stdout.splitlines() if line.startswith("no_quant"))
    assert row.endswith(
        "bf16: the flashinfer_cutlass experts quantize their own input (fp8_e4m3 checkpoint)"
    )
    groups = json.loads(run_cli("audit", str(out), "--format", "json").stdout)["groups"]
    assert [g["wire"] for g in groups] == [
        "bf16: the flashinfer_cutlass experts quantize their own input (fp8_e4m3 checkpoint)"
    ]
    weight_only = tmp_path / "oss.yaml"
    assert (
        run_cli(
            "plan", "--model", "gpt-oss-120b", "--ep-size", "8", "-o", str(weight_only)
        ).returncode
        == 0
    )
    assert "bf16: weight-only quantization" in run_cli("audit", str(weight_only)).stdout


def test_trials_on_the_model_bench_are_warned_to_change_nothing(tmp_path):
    args = ["tune", "--model", "Qwen3-30B-A3B-FP8", "--ep-size", "2", "--bench", "model"]
    args += ["--tokens", "1024", "--storage", f"sqlite:///{tmp_path}/s.db"]
    many = run_cli(*args, "--trials", "3", "-o", str(tmp_path / "many.yaml"))
    assert many.returncode == 0, many.stderr
    assert "warning: --trials 3: the model bench fits no chunk effects" in many.stderr
    one = run_cli(*args, "--trials", "1", "-o", str(tmp_path / "one.yaml"), "-q")
    assert one.returncode == 0 and "warning: --trials" not in one.stderr, one.stderr
    kept = [
        yaml.safe_load((tmp_path / f).read_text())["deepep"] for f in ("many.yaml", "one.yaml")
    ]
    assert [(d["num_sms"], d["buckets"]) for d in kept[:1]] == [
        (d["num_sms"], d["buckets"]) for d in kept[1:]
    ]  # the warning's claim: the same SM count and configs


def test_a_tune_outside_the_calibration_says_why_once(tmp_path):
    """The model bench's calibration sentence is said once (by the tuner), not again in the DeepEP
    summary and the experts' line."""
    args = ["tune", "--model", "Qwen3-30B-A3B-FP8", "--ep-size", "8", "--bench", "model"]
    done = run_cli(
        *args, "--storage", f"sqlite:///{tmp_path}/s.db", "-o", str(tmp_path / "p.yaml")
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("calibrated: h200 EP2") == 1, done.stderr
    assert "DeepEP: its default configs (extrapolated)" in done.stderr


def _on_a_terminal(*args: str, cwd=None) -> tuple[str, str, int]:
    """The CLI with its standard output on a pseudo-terminal, as a person runs it."""
    import os
    import pty
    import subprocess

    from conftest import cli_command

    master, slave = pty.openpty()
    proc = subprocess.Popen(
        cli_command(*args),
        stdout=slave,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env={**os.environ, "MOEPOLICY_OFFLINE": "1"},
    )
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the terminal's other end closed: the process exited
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    err = proc.stderr.read().decode()
    return out.decode(), err, proc.wait(timeout=120)


def test_plan_on_a_terminal_without_o_shows_the_decisions_not_the_document(tmp_path):
    out, err, code = _on_a_terminal(
        "plan", "--model", "DeepSeek-V3", "--ep-size", "8", cwd=tmp_path
    )
    assert code == 0, err
    assert "schema_version" not in out and len(out.splitlines()) < 20, out
    assert "no_quant" in out and "3-61" in out  # audit's table of the decisions
    assert "not written: -o FILE writes the policy (62 layers)" in err
    assert list(tmp_path.iterdir()) == []
    piped = run_cli("plan", "--model", "DeepSeek-V3", "--ep-size", "8")  # a pipe gets the document
    assert piped.stdout.startswith("schema_version")


def test_tune_without_o_says_where_the_policy_goes_before_any_work(tmp_path):
    args = ["tune", "--model", "Qwen3-30B-A3B-FP8", "--ep-size", "2", "--bench", "model"]
    done = run_cli(
        *args, "--tokens", "1024", "--storage", f"sqlite:///{tmp_path}/s.db", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    said = done.stderr.splitlines()
    where = said.index(
        "no -o: the policy goes to policy.yaml in the working folder (-o FILE to choose)"
    )
    assert where < next(i for i, line in enumerate(said) if line.startswith("target:"))
    assert (tmp_path / "policy.yaml").read_text().startswith("schema_version")


def test_what_needs_gpus_is_not_a_usage_error_where_there_are_none(tmp_path):
    """No GPU (and no deep_ep) here: the command line is right, the machine cannot measure. A missing
    policy file is exit 6, as --help words it (a missing checkpoint is 3)."""
    policy = tmp_path / "q.yaml"
    assert (
        run_cli(
            "plan", "--model", "Qwen3-30B-A3B-FP8", "--ep-size", "2", "-o", str(policy)
        ).returncode
        == 0
    )
    tune = ["tune", "--model", "Qwen3-30B-A3B-FP8", "--ep-size", "2", "--bench", "live"]
    for args, code in (
        ([*tune, "--storage", f"sqlite:///{tmp_path}/s.db", "-o", str(tmp_path / "t.yaml")], 7),
        (["validate", str(policy), "--live"], 9),
        (["bench", str(policy), "--transport", "deepep"], 9),
    ):
        done = run_cli(*args)
        assert done.returncode == code, (args, done.returncode, done.stderr)
        assert done.stderr.strip().splitlines()[-1].startswith("moepolicy: "), done.stderr
    missing = run_cli("report", str(tmp_path / "none.yaml"))
    assert missing.returncode == 6 and "cannot be read" in missing.stderr
    assert "  6 A policy file is missing or unreadable" in run_cli("--help").stdout
