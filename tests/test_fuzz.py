"""Property-based fuzzing of every reader of user files: checkpoint configs, rule packs, policy
documents. Each reader either accepts the input or refuses it with its own error naming the place;
nothing else escapes, and a non-strict load_policy always returns a usable policy.

The example count per reader is MOEPOLICY_FUZZ_EXAMPLES (CI: 10000)."""

import json
import os
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moepolicy.checkpoint.reader import facts_from_raw
from moepolicy.checkpoint.source import RawCheckpoint
from moepolicy.errors import CheckpointError, PolicyError, RulePackError
from moepolicy._resources import data_dir  # noqa: E402

EXAMPLES = int(os.environ.get("MOEPOLICY_FUZZ_EXAMPLES", "300"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=False,
    suppress_health_check=list(HealthCheck),
)
ROOT = Path(__file__).resolve().parents[1]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(
        [
            "fp8",
            "e4m3",
            "dynamic",
            "static",
            "re:.*",
            "*",
            "Linear",
            "token",
            "group",
            "NVFP4",
            "FP8",
            "mxfp4",
            "compressed-tensors",
            "gptq",
        ]
    ),
)
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5), st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=20,
)


def catalog_configs():
    out = []
    for folder in sorted(data_dir("catalog").iterdir()):
        config = json.loads((folder / "config.json").read_text())
        quant = folder / "hf_quant_config.json"
        out.append((config, json.loads(quant.read_text()) if quant.exists() else None))
    return out


CONFIGS = catalog_configs()
CONFIG_KEYS = sorted(
    {k for c, _ in CONFIGS for k in c}
    | {
        "text_config",
        "mlp_layer_types",
        "moe_layers",
        "num_nextn_predict_layers",
        "quantization_config",
    }
)


@st.composite
def mutated_config(draw):
    config, quant = draw(st.sampled_from(CONFIGS))
    config = json.loads(json.dumps(config))
    for _ in range(draw(st.integers(1, 4))):
        key = draw(st.sampled_from(CONFIG_KEYS))
        action = draw(st.sampled_from(["delete", "replace", "nest"]))
        if action == "delete":
            config.pop(key, None)
        elif action == "replace":
            config[key] = draw(json_values)
        elif isinstance(config.get("quantization_config"), dict):
            qc = config["quantization_config"]
            qc[
                draw(
                    st.sampled_from(
                        [
                            "quant_method",
                            "fmt",
                            "weight_block_size",
                            "activation_scheme",
                            "config_groups",
                            "ignore",
                            "modules_to_not_convert",
                            "bits",
                            "group_size",
                            "scale_fmt",
                        ]
                    )
                )
            ] = draw(json_values)
    if quant is not None and draw(st.booleans()):
        quant = {
            "quantization": draw(
                st.dictionaries(
                    st.sampled_from(["quant_algo", "group_size", "exclude_modules"]), json_values
                )
            )
        }
    return config, quant


@FUZZ
@given(mutated_config(), st.sampled_from(["vllm", "sglang"]))
def test_checkpoint_reader_accepts_or_refuses(case, engine):
    config, quant = case
    raw = RawCheckpoint(
        name="fuzz",
        source="fuzz",
        config=config,
        hf_quant_config=quant,
        config_path="fuzz/config.json",
        hf_quant_path="fuzz/hf_quant_config.json",
    )
    try:
        facts = facts_from_raw(raw, engine=engine)
    except CheckpointError as exc:
        assert "fuzz/" in str(exc)  # names the file
        return
    assert len(facts.layers) >= 1 and facts.sha256()


@FUZZ
@given(st.binary(max_size=300))
def test_checkpoint_file_bytes(tmp_path_factory, data):
    from moepolicy.checkpoint import read_model

    path = tmp_path_factory.mktemp("c") / "config.json"
    path.write_bytes(data)
    try:
        read_model(str(path))
    except CheckpointError as exc:
        assert str(path) in str(exc)


PACK_TEXT = (data_dir("rules") / "deepep.yaml").read_text()


@st.composite
def mutated_pack(draw):
    text = PACK_TEXT
    kind = draw(st.sampled_from(["truncate", "splice", "tag", "bomb", "replace_line", "deep"]))
    if kind == "truncate":
        return text[: draw(st.integers(0, len(text)))]
    if kind == "splice":
        at = draw(st.integers(0, len(text)))
        return text[:at] + draw(st.text(max_size=30)) + text[at:]
    if kind == "tag":
        return "pack: !!python/object/apply:os.system ['true']\nversion: '1'\nrules: []\n"
    if kind == "bomb":
        lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
        lines += [f"a{i}: &a{i} [{', '.join(['*a%d' % (i - 1)] * 10)}]" for i in range(1, 9)]
        return "\n".join(lines) + "\npack: p\nversion: '1'\nrules: *a8\n"
    if kind == "deep":
        depth = draw(st.integers(50, 3000))
        cond = "{fact: layer.kind, op: eq, value: moe}"
        for _ in range(depth):
            cond = "{not: " + cond + "}"
        return f"pack: p\nversion: '1'\nrules:\n  - {{id: r, priority: 1, why: w, source: s, when: {cond}, then: {{order: none}}}}\n"
    lines = text.splitlines()
    i = draw(st.integers(0, len(lines) - 1))
    lines[i] = draw(st.text(max_size=40))
    return "\n".join(lines)


@FUZZ
@given(mutated_pack())
def test_rule_pack_loader_accepts_or_refuses(tmp_path_factory, text):
    from moepolicy.rules.grammar import load_pack
    from moepolicy.rules.packs import known_capabilities

    path = tmp_path_factory.mktemp("p") / "pack.yaml"
    path.write_bytes(text.encode("utf-8", "replace"))
    try:
        pack = load_pack(path, known_capabilities())
    except RulePackError as exc:
        assert str(path) in str(exc)
        return
    assert pack.name


def _policy_text():
    """A small but complete policy (DeepSeek-V3's scheme on 5 layers: dense, MoE, MTP) keeps each
    example fast; every section and code path of a real policy is there."""
    from moepolicy.checkpoint.reader import facts_from_raw
    from moepolicy.document.yaml_io import dumps
    from moepolicy.document.compose import build_document
    from moepolicy.planner import make_plan
    from moepolicy.rules.packs import pack_stack
    from moepolicy.target import TargetSpec, resolve_target

    config, _ = next(
        c
        for c in CONFIGS
        if c[0].get("model_type") == "deepseek_v3"
        and (c[0].get("quantization_config") or {}).get("quant_method") == "fp8"
    )
    config = {**config, "num_hidden_layers": 4, "first_k_dense_replace": 2}
    raw = RawCheckpoint(name="small", source="fuzz", config=config)
    plan = make_plan(
        facts_from_raw(raw),
        resolve_target(TargetSpec(gpu="h200", ep_size=8), probe=False),
        pack_stack(),
    )
    return dumps(build_document(plan))


POLICY_TEXT = _policy_text()
POLICY = yaml.safe_load(POLICY_TEXT)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            if (
                k == "layer_facts"
            ):  # the table itself, not each fact in it (as with a layer's facts)
                yield prefix + (k,)
            elif k != "facts":
                yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node[:3]):
            yield from _paths(v, prefix + (i,))


PATHS = [p for p in _paths(POLICY) if p]


@st.composite
def mutated_policy(draw):
    kind = draw(st.sampled_from(["edit", "edit", "edit", "truncate", "splice", "tag", "bomb"]))
    if kind == "truncate":
        return POLICY_TEXT[: draw(st.integers(0, len(POLICY_TEXT)))]
    if kind == "splice":
        at = draw(st.integers(0, len(POLICY_TEXT)))
        return POLICY_TEXT[:at] + draw(st.text(max_size=20)) + POLICY_TEXT[at:]
    if kind == "tag":
        return POLICY_TEXT.replace(
            "schema_version: '1.0'", "schema_version: !!python/name:os.system ''", 1
        )
    if kind == "bomb":
        lines = ["x0: &x0 [a, a, a, a, a, a, a, a, a, a]"]
        lines += [f"x{i}: &x{i} [{', '.join(['*x%d' % (i - 1)] * 10)}]" for i in range(1, 9)]
        return POLICY_TEXT + "\n".join(lines) + "\n"
    doc = json.loads(json.dumps(POLICY))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(PATHS))
        parent = doc
        try:
            for part in path[:-1]:
                parent = parent[part]
            if draw(st.booleans()) and isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = draw(json_values)
        except (KeyError, IndexError, TypeError):
            continue
    if draw(st.booleans()):  # keep the keys consistent so the deeper checks are reached
        from moepolicy.document.keys import compute_keys

        try:
            doc["key"] = compute_keys(doc)
        except Exception:  # noqa: BLE001
            pass
    return yaml.dump(doc, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False)


@FUZZ
@given(mutated_policy())
def test_policy_reader_never_crashes_serving(tmp_path_factory, text):
    from moepolicy import load_policy

    path = tmp_path_factory.mktemp("d") / "policy.yaml"
    path.write_bytes(text.encode("utf-8", "replace"))
    policy = load_policy(path, ep_size=8)  # non-strict: always usable
    layer = policy.layer(3)
    assert layer.order in (
        "quant_then_dispatch",
        "dispatch_then_quant",
        "in_kernel_quant",
        "no_quant",
        "none",
    )
    assert policy.deepep.num_sms > 0
    if policy.is_fallback:
        assert policy.fallback_reason
    try:
        load_policy(path, ep_size=8, strict=True)
    except PolicyError as exc:
        assert str(path) in str(exc) and "\n" not in str(exc)


# ------------------------------------------------------------------ every command, mutated policies
# Whatever `validate` accepts, every command handles: one line and a documented exit code at worst,
# never a traceback. Seeds: a plan, a tuned policy (search scan, re-measurement), an overlap policy;
# mutations reach the free-form fields (provenance, measured, overlap, facts) the schema does not type.
# Each example runs every command in this process: a sixtieth of MOEPOLICY_FUZZ_EXAMPLES, at least 30.
COMMAND_EXAMPLES = max(EXAMPLES // 60, 30)
COMMAND_FUZZ = settings(
    max_examples=COMMAND_EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
    database=None,
)


def _overlap_row() -> dict:
    from moepolicy.tuning.overlap_report import OverlapBucketRow, SplitBound, SplitTimes

    orders = {"gemm_first": 900.0, "comm_first": 950.0, "comm_first_no_wait": 920.0}
    chosen = SplitTimes(900.0, (880.0, 930.0), 400.0, 700.0, "persistent", 100, orders, 380.0)
    vllm = SplitTimes(
        1000.0,
        (990.0, 1020.0),
        450.0,
        650.0,
        "persistent",
        112,
        {k: v + 90 for k, v in orders.items()},
        420.0,
        7,
    )
    return OverlapBucketRow(
        "gemm-first",
        7,
        chosen,
        1300.0,
        "full",
        600.0,
        880.0,
        vllm,
        (0.9, 0.91, 0.88),
        SplitBound(700.0, 32, "GEMM"),
    ).to_doc()


@pytest.fixture(scope="module")
def seed_policies(tmp_path_factory):
    """Policy texts every command accepts: the plan above, a model-bench tune, the tune made an overlap."""
    import subprocess
    import sys

    from moepolicy.document.keys import compute_keys
    from moepolicy.document.yaml_io import dumps

    folder = tmp_path_factory.mktemp("seeds")
    tuned = folder / "tuned.yaml"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "moepolicy",
            "tune",
            "--model",
            "Qwen3-30B-A3B-FP8",
            "--ep-size",
            "2",
            "--bench",
            "model",
            "--trials",
            "2",
            "--tokens",
            "128,1024",
            "--storage",
            f"sqlite:///{folder}/s.db",
            "-o",
            str(tuned),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "MOEPOLICY_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr
    overlap = yaml.safe_load(tuned.read_text())
    for bucket in overlap["deepep"]["buckets"]:
        bucket["measured"] = _overlap_row()
    overlap["deepep"]["overlap"] = {
        "comm_sms": overlap["deepep"]["num_sms"],
        "gemm_sms": 100,
        "order": "gemm-first",
        "gemm": "persistent",
        "splits_us": {12: 950.0, 20: 1000.0, 32: 900.0},
    }
    overlap["key"] = compute_keys(overlap)
    return _Seeds([POLICY_TEXT, tuned.read_text(), dumps(overlap)])


class _Seeds(list):
    def __repr__(
        self,
    ) -> str:  # hypothesis prints a failing example's arguments: not three whole policies
        return f"<{len(self)} seed policies: plan, tuned, overlap>"


def _all_paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _all_paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node[:4]):
            yield from _all_paths(v, prefix + (i,))


FREE_FORM = (
    "provenance",
    "measured",
    "overlap",
    "facts",
    "layer_facts",
    "generated",
    "measured_orders",
    "low_latency",
    "confirm",
    "scan",
)  # layer_facts: a 2.3 file's facts, named from layers
wild = st.one_of(
    json_values,
    st.sampled_from(
        [
            0,
            -1,
            0.0,
            -0.0,
            1e308,
            -1e308,
            float("nan"),
            float("inf"),
            2**70,
            "",
            "x",
            [],
            {},
            [0, 0],
            [1e308, -1e308],
            None,
            True,
        ]
    ),
)


def _mutate(data, doc: dict) -> dict:
    paths = [p for p in _all_paths(doc) if p]
    free = [p for p in paths if any(part in FREE_FORM for part in p if isinstance(part, str))]
    for _ in range(data.draw(st.integers(1, 4))):
        path = data.draw(st.sampled_from(free if free and data.draw(st.integers(0, 3)) else paths))
        try:
            parent = doc
            for part in path[:-1]:
                parent = parent[part]
            if isinstance(parent, dict) and data.draw(st.booleans()):
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = data.draw(wild)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed or replaced the way there
        doc = json.loads(
            json.dumps(doc)
        )  # a fresh tree: shared YAML anchors are mutated one at a time
    return doc


def _in_process(argv: list[str]) -> tuple[int, str, str]:
    """``moepolicy ARGV`` in this process; an exception escaping it fails the test (a crash)."""
    import contextlib
    import io
    import signal

    from moepolicy.cli.main import main

    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:
                code = exc.code
    finally:
        signal.signal(signal.SIGINT, handlers[0])
        signal.signal(signal.SIGTERM, handlers[1])
    return int(code or 0), out.getvalue(), err.getvalue()


def _commands(path: Path, layer: int, plots: Path) -> list[list[str]]:
    p = str(path)
    return [
        ["audit", p],
        ["explain", p, "--layer", str(layer)],
        ["export", p, "--to", "vllm"],
        ["export", p, "--to", "vllm", "--format", "json"],
        ["export", p, "--to", "sglang"],
        ["export", p, "--to", "sglang", "--format", "launch"],
        ["export", p, "--to", "sglang", "--tokens", "1"],
        ["report", p, "--plots", str(plots)],
        ["bench", p, "--dry-run"],
    ]


@COMMAND_FUZZ
@given(data=st.data())
def test_every_command_handles_whatever_validate_accepts(seed_policies, tmp_path_factory, data):
    from moepolicy.document.keys import compute_keys

    doc = _mutate(
        data, yaml.safe_load(seed_policies[data.draw(st.sampled_from(range(len(seed_policies))))])
    )
    if data.draw(st.integers(0, 4)):  # mostly keys kept consistent: the deeper checks are reached
        try:
            doc["key"] = compute_keys(doc)
        except Exception:  # noqa: BLE001
            pass
    folder = tmp_path_factory.mktemp("cmd")
    path = folder / "p.yaml"
    path.write_text(
        yaml.dump(doc, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False)
    )
    code, _, err = _in_process(["validate", str(path)])
    accepted = code == 0
    layers = doc.get("layers") if isinstance(doc, dict) else None
    first = (
        layers[min(3, len(layers) - 1)].get("index", 0)
        if isinstance(layers, list)
        and layers
        and isinstance(layers[min(3, len(layers) - 1)], dict)
        else 0
    )
    for argv in _commands(path, first if isinstance(first, int) else 0, folder / "plots"):
        code, _, err = _in_process(argv)
        lines = err.strip().splitlines()
        assert "Traceback" not in err, (argv, err)
        if code != 0:
            assert lines and lines[-1].startswith("moepolicy: "), (argv, err)
        if accepted and argv[0] == "report" and code == 1:
            assert "nothing tuned to draw" in lines[-1], (
                argv,
                err,
            )  # an untuned policy: said, exit 1
        elif accepted and argv[0] in ("audit", "report"):
            assert code == 0, (argv, err)  # what validate accepts, these show whole
