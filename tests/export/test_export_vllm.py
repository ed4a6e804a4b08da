"""``export --to vllm``: the plugin launch (package, environment, ``vllm serve`` with the policy's EP
layout, every value quoted), and one copy of "what vLLM does": the export and ``plan --rules vllm``
agree on every catalog model and target."""

import pytest

from conftest import run_cli
from moepolicy.checkpoint import catalog
from moepolicy.checkpoint.reader import read_model
from moepolicy.errors import InfeasibleError
from moepolicy.document.compose import build_document
from moepolicy.planner import make_plan
from moepolicy.rules.packs import pack_stack
from moepolicy.document.model import PolicyDoc
from moepolicy.target import TargetSpec, resolve_target


@pytest.mark.parametrize("version", ["29d31c0", "v2-dd758ca"])
@pytest.mark.parametrize(
    "gpu, ep, backend",
    [
        ("h200", 8, "deepep_ht"),
        ("b200", 8, "deepep_ht"),
        ("h200", 16, "deepep_ht"),
        ("b200", 16, "deepep_ht"),
        ("h200", 8, "deepep_ll"),
        ("b200", 16, "deepep_ll"),
    ],
)
def test_the_export_and_the_vllm_pack_agree_on_what_vllm_does(gpu, ep, backend, version):
    from moepolicy.export.vllm import vllm_orders

    checked = 0
    for entry in catalog.entries():
        facts = read_model(entry.repo_id, hub=False)
        target = resolve_target(
            TargetSpec(gpu=gpu, ep_size=ep, backend=backend, deep_ep_version=version), probe=False
        )
        try:
            ours = make_plan(facts, target, pack_stack())
            theirs = make_plan(facts, target, pack_stack(["vllm"]))
        except InfeasibleError:
            continue
        export_says = vllm_orders(PolicyDoc.model_validate(build_document(ours)))
        pack_says = {
            lp.layer.index: lp.decision.order for lp in theirs.layers if lp.layer.kind == "moe"
        }
        assert export_says == pack_says, entry.repo_id
        checked += 1
    assert checked >= 4


def test_the_launch_is_the_plugin_with_the_policys_ep_layout(tmp_path):
    import shlex

    out = tmp_path / "my policy.yaml"
    assert (
        run_cli("plan", "--model", "DeepSeek-V3", "--ep-size", "8", "-o", str(out)).returncode == 0
    )
    result = run_cli("export", str(out), "--to", "vllm")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # into vLLM's own environment: no extra that would install or replace vLLM
    assert (
        lines[0].startswith("# install moepolicy into the Python environment vLLM runs in")
        and "[vllm]" not in lines[0]
    )
    assert (
        "-m pip install /path/to/moepolicy " in lines[0] and "not on a package index" in lines[0]
    )
    # where the policy lies on the serving nodes: never this machine's path, unless given
    assert "export MOEPOLICY_POLICY='/same/path/on/every/node/my policy.yaml'" in lines
    assert str(tmp_path) not in result.stdout
    assert any("copy my policy.yaml to one path on every node" in line for line in lines)
    given = run_cli("export", str(out), "--to", "vllm", "--policy-path", "/srv/p.yaml").stdout
    assert "export MOEPOLICY_POLICY=/srv/p.yaml" in given.splitlines()
    serve = next(line for line in lines if line.startswith("vllm serve"))
    words = shlex.split(serve)
    assert (
        words[2] == "deepseek-ai/DeepSeek-V3"
    )  # the catalog name's Hugging Face id: what vLLM serves
    assert (
        words[words.index("--data-parallel-size") + 1] == "8"
        and "--enable-expert-parallel" in words
    )
    # the experts the policy was made for (vLLM's own pick on SM90 with EP), and what happens without them
    assert words[words.index("--moe-backend") + 1] == "flashinfer_cutlass"
    assert any("without it:" in line and "TritonOrDeepGemmExperts" in line for line in lines)
    assert (
        "#  - layers 3-60: bf16 on the wire; FlashInferExperts quantize it themselves, as in vLLM"
        in lines
    )


def test_a_policy_for_deepgemm_experts_launches_them_and_says_what_changes_without(tmp_path):
    import shlex

    out = tmp_path / "dg.yaml"
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
    lines = run_cli("export", str(out), "--to", "vllm").stdout.splitlines()
    assert (
        "export VLLM_USE_DEEP_GEMM=1" in lines
    )  # the fp8 oracle's switch (oracle/fp8.py:484-496)
    assert "--moe-backend" not in shlex.split(
        next(line for line in lines if line.startswith("vllm serve"))
    )
    note = next(line for line in lines if line.startswith("# VLLM_USE_DEEP_GEMM=1:"))
    assert (
        "without it: vLLM runs FlashInferExperts" in note and "leaves these layers to vLLM" in note
    )
    assert "#  - layers 3-60: block fp8 quantized before dispatch, as in vLLM" in lines
    assert (
        "#  - MTP layers 61 (built by vLLM only with --speculative-config): block fp8 quantized "
        "before dispatch, as in vLLM" in lines
    )


def test_a_policy_planned_from_a_local_folder_serves_that_folder(tmp_path):
    import json
    import shlex

    from moepolicy._resources import data_dir

    folder = tmp_path / "checkpoints" / "my-qwen"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(
        (data_dir("catalog") / "Qwen__Qwen3-30B-A3B-FP8" / "config.json").read_text()
    )
    out = tmp_path / "p.yaml"
    assert (
        run_cli("plan", "--model", str(folder), "--ep-size", "8", "-o", str(out)).returncode == 0
    )
    result = json.loads(run_cli("export", str(out), "--to", "vllm", "--format", "json").stdout)
    assert result["model"] == str(
        folder.resolve()
    )  # not the folder's basename, which vLLM cannot serve
    shell = run_cli("export", str(out), "--to", "vllm").stdout
    assert shlex.split(next(line for line in shell.splitlines() if line.startswith("vllm serve")))[
        2
    ] == str(folder)
    assert "matches the served model by its config's facts" in shell
    # planned with a relative path from elsewhere: nothing servable is guessed
    relative = run_cli(
        "plan",
        "--model",
        "my-qwen",
        "--ep-size",
        "8",
        "-o",
        str(tmp_path / "r.yaml"),
        cwd=folder.parent,
    )
    assert relative.returncode == 0, relative.stderr
    text = run_cli("export", str(tmp_path / "r.yaml"), "--to", "vllm").stdout
    assert "<the folder of checkpoint my-qwen>" in text and "serve its folder" in text


def _launch_words(text: str, start: str) -> list[str]:
    import shlex

    return shlex.split(next(line for line in text.splitlines() if line.startswith(start)))


def _qwen_cache(tmp_path):
    """A Hugging Face cache holding org/qwen at HUB_COMMIT (the catalog's Qwen3-30B-A3B-FP8 config)."""
    from conftest import fake_cache
    from moepolicy._resources import data_dir

    config = (data_dir("catalog") / "Qwen__Qwen3-30B-A3B-FP8" / "config.json").read_bytes()
    return fake_cache(tmp_path / "hf-cache", "org/qwen", {"config.json": config})


def test_a_policy_planned_at_a_revision_is_served_at_that_revision(tmp_path):
    """vLLM and SGLang serve the default branch unless told: the revision the plan read is carried
    as --revision, or the plugin checks another snapshot and falls back."""
    import json

    from conftest import HUB_COMMIT

    _qwen_cache(tmp_path)
    env = {"HF_HUB_CACHE": str(tmp_path / "hf-cache")}
    out = tmp_path / "p.yaml"
    planned = run_cli(
        "plan", "--model", f"org/qwen@{HUB_COMMIT}", "--ep-size", "8", "-o", str(out), env=env
    )
    assert planned.returncode == 0, planned.stderr
    shell = run_cli("export", str(out), "--to", "vllm", env=env)
    assert shell.returncode == 0, shell.stderr
    words = _launch_words(shell.stdout, "vllm serve")
    assert words[2] == "org/qwen" and words[words.index("--revision") + 1] == HUB_COMMIT
    assert f"at revision {HUB_COMMIT}, as planned" in shell.stdout
    as_json = json.loads(run_cli("export", str(out), "--to", "vllm", "--format", "json").stdout)
    assert as_json["args"][as_json["args"].index("--revision") + 1] == HUB_COMMIT
    sglang = run_cli("export", str(out), "--to", "sglang", "--format", "launch", env=env)
    words = _launch_words(sglang.stdout, "python -m sglang")
    assert words[words.index("--model-path") + 1] == "org/qwen"
    assert words[words.index("--revision") + 1] == HUB_COMMIT
    # planned without a revision: none is added
    plain = tmp_path / "plain.yaml"
    assert (
        run_cli(
            "plan", "--model", "org/qwen", "--ep-size", "8", "-o", str(plain), env=env
        ).returncode
        == 0
    )
    assert "--revision" not in run_cli("export", str(plain), "--to", "vllm").stdout


def test_a_policy_planned_from_a_cache_repository_folder_serves_its_snapshot(tmp_path):
    """``models--org--name`` holds no config.json (vLLM cannot load it); the snapshot its refs/main
    names does."""
    snapshot = _qwen_cache(tmp_path)
    repo = snapshot.parent.parent
    out = tmp_path / "p.yaml"
    assert run_cli("plan", "--model", str(repo), "--ep-size", "8", "-o", str(out)).returncode == 0
    shell = run_cli("export", str(out), "--to", "vllm")
    assert shell.returncode == 0, shell.stderr
    assert _launch_words(shell.stdout, "vllm serve")[2] == str(snapshot.resolve())
    sglang = run_cli("export", str(out), "--to", "sglang", "--format", "launch")
    words = _launch_words(sglang.stdout, "python -m sglang")
    assert words[words.index("--model-path") + 1] == str(snapshot.resolve())


def test_the_export_says_what_the_configs_are_never_tuned_when_nothing_was(tmp_path):
    out = tmp_path / "p.yaml"
    assert (
        run_cli(
            "plan", "--model", "Qwen3-30B-A3B-FP8", "--ep-size", "2", "-o", str(out)
        ).returncode
        == 0
    )
    text = run_cli("export", str(out), "--to", "vllm").stdout
    assert "DeepEP's built-in defaults for this EP size" in text and "tuned" not in text
    tuned = tmp_path / "t.yaml"
    assert (
        run_cli(
            "tune",
            "--model",
            "Qwen3-30B-A3B-FP8",
            "--ep-size",
            "2",
            "--storage",
            f"sqlite:///{tmp_path}/s.db",
            "-o",
            str(tuned),
        ).returncode
        == 0
    )
    text = run_cli(
        "export", str(tuned), "--to", "vllm"
    ).stdout  # the model bench keeps vLLM's own configs here
    assert (
        "DeepEP's defaults, as vLLM runs them (the modelled tune kept them at all 3 token bucket(s)"
        in text
    )
    assert "tuned" not in text


def test_deepeps_defaults_are_named_so_in_every_export_and_in_audit(tmp_path):
    """A plan's and an extrapolated tune's DeepEP configs are the same (DeepEP's defaults): the vLLM
    export, the SGLang export and audit name them so for both, and say which it is."""
    plan, tune = tmp_path / "plan.yaml", tmp_path / "tune.yaml"
    args = ("--model", "Qwen3-30B-A3B-FP8", "--ep-size", "8")
    assert run_cli("plan", *args, "-o", str(plan)).returncode == 0
    storage = f"sqlite:///{tmp_path}/s.db"
    assert (
        run_cli(
            "tune", *args, "--bench", "model", "--storage", storage, "-o", str(tune)
        ).returncode
        == 0
    )
    for path, which in ((plan, "from a plan"), (tune, "extrapolated")):
        said = {
            "vllm": run_cli("export", str(path), "--to", "vllm").stdout,
            "sglang": run_cli("export", str(path), "--to", "sglang", "--format", "launch").stdout,
            "audit": run_cli("audit", str(path)).stdout,
        }
        for where, text in said.items():
            assert f"DeepEP's built-in defaults for this EP size ({which}" in text, (where, text)
            assert "extrapolated beyond" not in text, (where, text)


def test_a_modelled_sm_count_is_said_modelled_in_both_exports(tmp_path):
    """The vLLM export's num_sms line and the SGLang JSON (said on stderr: SGLang reads the JSON as
    it is) say where a count other than vLLM's came from: a modelled one is not a measurement."""
    import yaml

    from moepolicy.document.keys import compute_keys

    out = tmp_path / "p.yaml"
    assert (
        run_cli(
            "plan", "--model", "Qwen3-30B-A3B-FP8", "--ep-size", "2", "-o", str(out)
        ).returncode
        == 0
    )
    doc = yaml.safe_load(out.read_text())
    doc["deepep"].update(num_sms=24, num_nvl_bytes=2**30)
    doc["deepep"]["provenance"] = {"source": "modelled", "note": "a modelled SM count"}
    doc["key"] = compute_keys(doc)
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    vllm = run_cli("export", str(out), "--to", "vllm")
    assert vllm.returncode == 0, vllm.stderr
    line = next(ln for ln in vllm.stdout.splitlines() if "DeepEP num_sms 24" in ln)
    assert "modelled, not measured" in line, line
    sglang = run_cli("export", str(out), "--to", "sglang")
    assert sglang.returncode == 0 and '"num_sms": 24' in sglang.stdout
    assert "modelled, not measured" in sglang.stderr and "modelled" not in sglang.stdout


def test_the_sglang_launch_carries_one_bucket_the_backend_and_one_dtype(tmp_path):
    import json
    import shlex

    out = tmp_path / "q.yaml"
    tuned = run_cli(
        "tune",
        "--model",
        "Qwen3-30B-A3B-FP8",
        "--ep-size",
        "2",
        "--engine",
        "sglang",
        "--storage",
        f"sqlite:///{tmp_path}/s.db",
        "-o",
        str(out),
    )
    assert tuned.returncode == 0, tuned.stderr
    result = run_cli(
        "export", str(out), "--to", "sglang", "--format", "launch", "--tokens", "1024"
    )
    assert result.returncode == 0, result.stderr
    serve = next(
        line
        for line in result.stdout.splitlines()
        if line.startswith("python -m sglang.launch_server")
    )
    words = shlex.split(serve)
    flag = dict(zip(words, words[1:]))
    assert (
        flag["--moe-a2a-backend"] == "deepep"
        and flag["--deepep-mode"] == "normal"
        and flag["--ep-size"] == "2"
    )
    assert flag["--deepep-dispatcher-output-dtype"] == "fp8"  # every MoE layer sends block-128 fp8
    config = json.loads(flag["--deepep-config"])
    plain = json.loads(run_cli("export", str(out), "--to", "sglang", "--tokens", "1024").stdout)
    assert (
        config == plain
        and config["normal_dispatch"]["num_sms"] == config["normal_combine"]["num_sms"]
    )
    assert "not carried" in result.stdout and "> 1024" not in result.stdout


def test_the_sglang_launch_leaves_a_dtype_it_cannot_express_to_sglang(tmp_path):
    import shlex

    out = tmp_path / "mx.yaml"
    assert (
        run_cli(
            "plan",
            "--model",
            "amd/Mixtral-8x7B-Instruct-v0.1-FP8-KV",
            "--ep-size",
            "8",
            "-o",
            str(out),
        ).returncode
        == 0
    )
    result = run_cli("export", str(out), "--to", "sglang", "--format", "launch")
    words = shlex.split(
        next(line for line in result.stdout.splitlines() if line.startswith("python"))
    )
    assert "--deepep-dispatcher-output-dtype" not in words and "static per-tensor" in result.stdout


def test_a_v2_policy_exports_its_settings_to_vllm_and_sglang(tmp_path):
    import shlex

    out = tmp_path / "v2.yaml"
    planned = run_cli(
        "plan",
        "--model",
        "DeepSeek-V3",
        "--ep-size",
        "8",
        "--deep-ep-version",
        "v2-dd758ca",
        "-o",
        str(out),
    )
    assert planned.returncode == 0, planned.stderr
    vllm = run_cli("export", str(out), "--to", "vllm").stdout.splitlines()
    assert (
        "export VLLM_DEEPEP_V2_PREFER_OVERLAP=1" in vllm
        and "export VLLM_DEEPEP_V2_ALLOW_MULTIPLE_REDUCTION=1" in vllm
    )
    assert not any(
        "VLLM_DEEPEP_BUFFER_SIZE_MB" in line for line in vllm
    )  # the v2 manager does not read it
    words = shlex.split(next(line for line in vllm if line.startswith("vllm serve")))
    assert words[words.index("--all2all-backend") + 1] == "deepep_v2"
    sglang = run_cli(
        "export", str(out), "--to", "sglang", "--format", "launch"
    ).stdout.splitlines()
    assert "export SGLANG_DEEPEP_V2_NUM_SMS=0" in sglang


def test_tune_refuses_a_v2_target_with_what_it_cannot_measure():
    result = run_cli(
        "tune",
        "--model",
        "DeepSeek-V3",
        "--ep-size",
        "8",
        "--deep-ep-version",
        "v2-dd758ca",
        "--bench",
        "model",
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "prefer_overlap_with_compute" in result.stderr and "unverified" in result.stderr


def test_the_sglang_launch_carries_nvfp4_quantized_first(tmp_path):
    import shlex

    out = tmp_path / "nv.yaml"
    assert (
        run_cli(
            "plan",
            "--model",
            "nvidia/Qwen3-30B-A3B-NVFP4",
            "--gpu",
            "b200",
            "--ep-size",
            "8",
            "-o",
            str(out),
        ).returncode
        == 0
    )
    result = run_cli("export", str(out), "--to", "sglang", "--format", "launch")
    words = shlex.split(
        next(line for line in result.stdout.splitlines() if line.startswith("python"))
    )
    assert words[words.index("--deepep-dispatcher-output-dtype") + 1] == "nvfp4"
    vllm = run_cli("export", str(out), "--to", "vllm").stdout
    assert (
        "layers 0-47: left to vLLM: the plugin sends bf16 or fp8 only" in vllm
    )  # the plugin does not send NVFP4


@pytest.mark.parametrize("comm", [None, float("nan"), 0, True, 10**6])
def test_an_overlap_split_that_is_no_sm_count_is_refused_in_one_line(tmp_path, comm):
    """deepep.overlap is free-form: a hand edit the reader accepts (found by the command fuzz test:
    None and NaN raised TypeError and ValueError) is refused by the export in one line."""
    import yaml

    from moepolicy.document.keys import compute_keys

    out = tmp_path / "p.yaml"
    assert (
        run_cli(
            "plan", "--model", "Qwen3-30B-A3B-FP8", "--ep-size", "2", "-o", str(out)
        ).returncode
        == 0
    )
    doc = yaml.safe_load(out.read_text())
    doc["deepep"]["overlap"] = {"comm_sms": comm}
    doc["key"] = compute_keys(doc)
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    said = run_cli("export", str(out), "--to", "vllm")
    assert "Traceback" not in said.stderr
    if (
        run_cli("validate", str(out)).returncode == 0
    ):  # what the reader accepts, the export handles
        assert said.returncode == 6 and said.stderr.count("\n") == 1, said.stderr
        assert "deepep.overlap.comm_sms must be a whole number of SMs" in said.stderr
