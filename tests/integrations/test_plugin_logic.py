"""The vLLM plugin's plain-Python parts, without vLLM: which policy layer a vLLM module is, the
per-layer tables, the digest and the ranks' verdict, the action function the plugin and the export
share, the served model's folder, the strict switch and the log escaping. (Against vLLM's real
classes: test_vllm_plugin.py, in the vLLM environment.)"""

import json
import types

import pytest

from moepolicy.export import vllm_actions as actions
from moepolicy.integrations.vllm import report, strict_from_env
from moepolicy.integrations.vllm.serving import (
    ServingPlan,
    Vote,
    digest,
    digest_fields,
    policy_index,
    verdict,
)
from moepolicy.runtime.policy import PolicyTarget


def target(**kw):
    base = dict(
        backend="deepep_ht",
        deepep_api="legacy",
        ep_size=8,
        arch="sm90",
        expert_kernel="deepgemm",
        schedule="serial",
        content_key="c" * 64,
        num_hidden_layers=61,
        layer_kernels={i: "deepgemm" for i in range(3, 62)},
        mtp_layers=frozenset({61}),
    )
    return PolicyTarget(**{**base, **kw})


@pytest.mark.parametrize(
    "prefix, index",
    [
        ("model.layers.3.mlp.experts", 3),
        ("language_model.model.layers.7.mlp.experts", 7),
        ("model.language_model.layers.60.mlp.experts", 60),
        # DeepSeek's MTP layer: vLLM 0.33 builds its decoder layer with the MTP layer's own prefix
        # (deepseek_mtp.py:157-158 and 104-110, the experts at deepseek_v2.py:386)
        ("model.layers.61.mlp.experts", 61),
        # Qwen3-Next's naming, mapped to the policy's first MTP layer
        ("mtp.layers.0.mlp.experts", 61),
        ("mtp.layers.1.mlp.experts", None),  # an MTP module the policy does not hold
        ("model.layers.1.mlp.experts", None),  # dense in the policy
        ("model.layers.62.mlp.experts", None),
        ("model.layers.99.mlp.experts", None),
        ("draft_model.model.layers.0.mlp.experts", None),
    ],
)
def test_a_vllm_module_maps_to_a_policy_layer_by_its_prefix(prefix, index):
    found, why = policy_index(prefix, target())
    assert found == index and (why == "") == (index is not None)


def test_a_layer_table_joins_its_order_buckets_and_deepeps():
    from moepolicy.deepep.settings import Bucket, DeepEPSettings
    from moepolicy.deepep.configs import ChunkConfig

    def chunk(n):
        return ChunkConfig(n, 256, 6, 128)

    deepep = DeepEPSettings(
        num_sms=24,
        num_nvl_bytes=1,
        num_rdma_bytes=0,
        source="modelled",
        buckets=(Bucket(128, chunk(4), chunk(2)), Bucket(None, chunk(8), chunk(3))),
    )
    policy = types.SimpleNamespace(deepep=deepep, is_fallback=False)
    plan = ServingPlan(policy, lambda *a: a, dbo_num_sms=16)
    first = actions.Action(actions.VLLM, "small")
    second = actions.Action(actions.BF16_THEN_QUANT, "large")
    table = plan.table([actions.BucketAction(1000, first), actions.BucketAction(None, second)])
    assert table.bounds == (128, 1000)
    assert (
        table.entry(100).serial == ((24, 4, 256, 6, 128), (24, 2, 256, 6, 128))
        and table.entry(100).action == first
    )
    assert (
        table.entry(128).serial[0][1] == 4 and table.entry(129).serial[0][1] == 8
    )  # up to max_tokens, inclusive
    assert table.entry(500).action == first and table.entry(1001).action == second
    assert table.entry(5000).dbo == (
        (16, 8, 256, 6, 128),
        (16, 3, 256, 6, 128),
    )  # vLLM's DBO SM split


def _policy(tmp_path, mutate=None):
    from moepolicy import load_policy
    from moepolicy.checkpoint import read_model
    from moepolicy.document.keys import compute_keys
    from moepolicy.document.compose import build_document
    from moepolicy.planner import make_plan
    from moepolicy.document.yaml_io import write_document
    from moepolicy.rules.packs import pack_stack
    from moepolicy.target import TargetSpec, resolve_target

    doc = build_document(
        make_plan(
            read_model("DeepSeek-V3"),
            resolve_target(TargetSpec(gpu="h200", ep_size=8), probe=False),
            pack_stack(),
        )
    )
    if mutate:
        mutate(doc)
        doc["key"] = compute_keys(doc)
    path = tmp_path / f"p{len(list(tmp_path.iterdir()))}.yaml"
    write_document(doc, path)
    return load_policy(path)


def test_the_digest_covers_what_the_ranks_must_share(tmp_path):
    base = _policy(tmp_path)

    def fields(p, **kw):
        return digest_fields(
            p,
            {"nvl": p.deepep.num_nvl_bytes, "rdma": 0},
            kw.get("dbo"),
            kw.get("versions", {"moepolicy": "1"}),
        )

    same = digest(fields(base))
    assert same == digest(fields(_policy(tmp_path))) and len(same) == 16
    changed = [
        digest(
            fields(
                _policy(tmp_path, lambda d: d["deepep"].update(num_sms=24, num_nvl_bytes=2**30))
            )
        ),
        digest(
            fields(
                _policy(
                    tmp_path,
                    lambda d: d["deepep"]["buckets"][0]["dispatch"].update(
                        num_max_nvl_chunked_send_tokens=8
                    ),
                )
            )
        ),
        digest(
            fields(_policy(tmp_path, lambda d: d["layers"][5].update(order="dispatch_then_quant")))
        ),
        digest(fields(base, dbo=16)),
        digest(fields(base, versions={"moepolicy": "2"})),
    ]
    assert same not in changed and len(set(changed)) == len(changed)


def test_the_verdict_is_unanimity():
    agree = [Vote(0, True, "abc"), Vote(1, True, "abc")]
    assert verdict(agree) == ""
    assert "rank(s) 1 of 2 would not apply it (rank 1: missing file)" in verdict(
        [Vote(0, True, "abc"), Vote(1, False, "", "missing file")]
    )
    assert "digests differ" in verdict([Vote(0, True, "abc"), Vote(1, True, "abd")])
    assert verdict([Vote(0, False, ""), Vote(1, False, "")]) != ""


def test_votes_travel_as_plain_dicts():
    from moepolicy.integrations.vllm.vote import gather_votes

    class Group:
        def all_gather_obj(self, mine):
            assert isinstance(mine, dict)
            return [mine, {"rank": 1, "applied": True, "digest": "x"}, "from another moepolicy"]

    votes = gather_votes(Group(), Vote(0, True, "x"))
    assert [v.applied for v in votes] == [True, True, False] and votes[2].reason


@pytest.mark.parametrize(
    "order, wire, scale, layer, kind, applied",
    [
        (
            "quant_then_dispatch",
            "fp8_e4m3",
            "block",
            dict(block=True, experts="TritonOrDeepGemmExperts"),
            actions.VLLM,
            True,
        ),
        (
            "quant_then_dispatch",
            "fp8_e4m3",
            "token",
            dict(per_token=True, experts="TritonExperts"),
            actions.TOKEN_FIRST,
            True,
        ),
        (
            "quant_then_dispatch",
            "fp8_e4m3",
            "token",
            dict(per_token=True, experts="FlashInferExperts"),
            actions.VLLM,
            False,
        ),
        (
            "quant_then_dispatch",
            "fp8_e4m3",
            None,
            dict(static=True, experts="FlashInferExperts"),
            actions.TENSOR_FIRST,
            True,
        ),
        (
            "quant_then_dispatch",
            "fp8_e4m3",
            None,
            dict(experts="TritonExperts"),
            actions.VLLM,
            False,
        ),  # no static scale
        (
            "dispatch_then_quant",
            "bf16",
            None,
            dict(block=True, experts="TritonExperts"),
            actions.BF16_THEN_QUANT,
            True,
        ),
        (
            "dispatch_then_quant",
            "bf16",
            None,
            dict(per_token=True, experts="TritonExperts"),
            actions.BF16_THEN_QUANT,
            True,
        ),
        (
            "dispatch_then_quant",
            "bf16",
            None,
            dict(static=True, experts="TritonExperts"),
            actions.VLLM,
            True,
        ),
        (
            "no_quant",
            "bf16",
            None,
            dict(block=True, experts="FlashInferExperts", defer_input_quant=True),
            actions.VLLM,
            True,
        ),
        (
            "quant_then_dispatch",
            "fp8_e4m3",
            "block",
            dict(block=True, experts="FlashInferExperts", defer_input_quant=True),
            actions.VLLM,
            False,
        ),
        (
            "quant_then_dispatch",
            "fp8_e4m3",
            "block",
            dict(block=True, experts="FlashInferExperts", policy_kernel="deepgemm"),
            actions.VLLM,
            False,
        ),
        (
            "quant_then_dispatch",
            "fp8_e4m3",
            "token",
            dict(per_token=True, experts="TritonExperts", deepep_v2=True),
            actions.VLLM,
            False,
        ),
        (
            "quant_then_dispatch",
            "nvfp4",
            None,
            dict(fp8=False, experts="FlashInferExperts"),
            actions.VLLM,
            False,
        ),
    ],
)
def test_the_action_for_a_layer(order, wire, scale, layer, kind, applied):
    quant = actions.LayerQuant(**{"fp8": True, "block": False, "per_token": False, **layer})
    action = actions.action_for(order, wire, scale, quant)
    assert (action.kind, action.applied) == (kind, applied), action.why


def test_layer_lines_and_the_summary():
    same = actions.Action(actions.VLLM, "bf16 on the wire, as in vLLM")
    left = actions.Action(actions.VLLM, "left to vLLM: the experts differ", applied=False)
    per_layer = {i: [actions.BucketAction(None, same)] for i in range(0, 4)}
    per_layer[4] = [actions.BucketAction(None, left)]
    per_layer[5] = [actions.BucketAction(64, same), actions.BucketAction(None, left)]
    applied, left_lines = actions.layer_lines(per_layer)
    assert applied == ["layers 0-3: bf16 on the wire, as in vLLM"]
    assert left_lines[0] == "layers 4: left to vLLM: the experts differ"
    assert (
        left_lines[1].startswith("layers 5: per token bucket: <=64 tokens: bf16")
        and ">64 tokens: left" in left_lines[1]
    )
    with_mtp = {**per_layer, 6: [actions.BucketAction(None, same)]}
    applied, _ = actions.layer_lines(with_mtp, mtp={6})
    assert applied == [
        "layers 0-3: bf16 on the wire, as in vLLM",
        "MTP layers 6 (built by vLLM only with --speculative-config): bf16 on the wire, as in vLLM",
    ]
    bound = {f"model.layers.{i}.mlp.experts": i < 4 for i in range(6)}
    line = actions.summary_line(bound, per_layer, {"draft_model.x": "a draft model's module"})
    assert (
        line.startswith("4/7 MoE layers applied; 3 left to vLLM: ")
        and "a draft model's module" in line
    )


def test_the_configs_line_never_says_tuned_when_nothing_was():
    assert "DeepEP's built-in defaults" in actions.configs_line("default", 1)
    assert "modelled, not measured" in actions.configs_line("modelled", 3)
    assert "measured on the target" in actions.configs_line("measured", 3)
    assert "extrapolated" in actions.configs_line("extrapolated", 2)
    assert all(
        "tuned" not in actions.configs_line(s, 1) for s in ("default", "modelled", "extrapolated")
    )
    kept_engine = actions.configs_line(
        "modelled", 3, ["engine"] * 3
    )  # the tune kept vLLM's own at every bucket
    assert (
        "DeepEP's defaults, as vLLM runs them" in kept_engine and "chosen with" not in kept_engine
    )
    assert "chosen with the model bench" in actions.configs_line(
        "modelled", 2, ["engine", "search"]
    )


@pytest.mark.parametrize(
    "value, strict",
    [
        ("1", True),
        ("TRUE", True),
        (" yes ", True),
        ("On", True),
        ("0", False),
        ("False", False),
        ("", False),
        ("no", False),
        ("OFF", False),
    ],
)
def test_strict_spellings(value, strict):
    assert strict_from_env({"MOEPOLICY_STRICT": value}) is strict


def test_strict_refuses_other_values_in_one_line():
    from moepolicy.errors import UsageError

    with pytest.raises(UsageError) as err:
        strict_from_env({"MOEPOLICY_STRICT": "sure\x1b[31m"})
    message = str(err.value)
    assert (
        "\n" not in message
        and "\x1b" not in message
        and "'sure\\x1b[31m' is not one of 1/true/yes/on" in message
    )


def test_log_text_is_one_escaped_line():
    text = report.safe("a\x1b]0;t\x07b\u202ec\u200fd\ne\tf\rg")
    assert text == "a\\x1b]0;t\\x07b\\u202ec\\u200fd\\ne\\tf\\rg"


def test_the_served_folder_comes_from_the_hugging_face_cache(tmp_path, monkeypatch):
    pytest.importorskip("huggingface_hub")
    from moepolicy.integrations.vllm.served import served_model

    repo = tmp_path / "hub" / "models--acme--m"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text(json.dumps({"model_type": "x"}))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    served = served_model(types.SimpleNamespace(model="acme/m", revision=None, hf_config=None))
    assert served.folder == str(repo / "snapshots" / "abc123")
    missing = served_model(
        types.SimpleNamespace(
            model="acme/other",
            revision=None,
            hf_config=types.SimpleNamespace(to_dict=lambda: {"a": 1}),
        )
    )
    assert missing.folder is None and missing.config == {"a": 1}


def test_a_layer_whose_binding_fails_is_left_to_vllm_with_the_reason(tmp_path):
    from moepolicy.integrations.vllm.run import ManagerRun, PluginSettings

    run = ManagerRun(PluginSettings("p.yaml", False), "ht", lambda *a: a)
    run.plan = ServingPlan(_policy(tmp_path), lambda *a: a)

    def broken(experts, kernel):
        raise AttributeError("no quant_config")

    table = run._layer_table(
        "model.layers.3.mlp.experts", types.SimpleNamespace(fused_experts=None), broken
    )
    action = table.entry(10).action
    assert (
        action.kind == actions.VLLM
        and not action.applied
        and "AttributeError: no quant_config" in action.why
    )
    assert run.unmatched == {"model.layers.3.mlp.experts": "AttributeError: no quant_config"}


def _bind_one(tmp_path, monkeypatch, kernels, strict=False):
    from moepolicy.integrations.vllm import run as run_module
    from moepolicy.integrations.vllm.run import ManagerRun, PluginSettings

    run = ManagerRun(PluginSettings("p.yaml", strict), "ht", lambda *a: a)
    run.plan = ServingPlan(_policy(tmp_path), lambda *a: a)
    run.facts = types.SimpleNamespace(model="m", ep_size=8, dbo=False)
    monkeypatch.setattr(run_module, "moe_kernels", kernels)
    return run


class _Owner:
    """A prepare/finalize class of the manager (``bind``'s ``owner_class``)."""


def test_a_layer_table_vllm_cannot_list_leaves_every_layer_to_vllm_in_one_warning(
    tmp_path, monkeypatch, caplog
):
    """``bind`` runs inside vLLM's first dispatch: a layer table it cannot read must not fail the
    forward pass; every layer is left to vLLM with that reason, said once."""
    import logging

    def unreadable():
        raise KeyError("no_compile_layers")

    run = _bind_one(tmp_path, monkeypatch, unreadable)
    layer = types.SimpleNamespace(_moepolicy_table=None)
    with caplog.at_level(logging.WARNING, logger="moepolicy"):
        table = run.bind(layer, _Owner, None)
        later = run.bind(types.SimpleNamespace(_moepolicy_table=None), _Owner, None)
    for t in (table, later):
        action = t.entry(10).action
        assert action.kind == actions.VLLM and not action.applied
        assert "could not be read (KeyError" in action.why
    said = [r.getMessage() for r in caplog.records if "could not be read" in r.getMessage()]
    assert len(said) == 1 and "every layer is left to vLLM" in said[0]


def test_strict_still_refuses_at_bind_when_a_layer_is_left_to_vllm(tmp_path, monkeypatch):
    """MOEPOLICY_STRICT's refusal (a layer the policy decides left to vLLM) reaches vLLM: it is not
    taken for a table that could not be read."""
    from moepolicy.errors import PolicyError

    pf = _Owner()
    impl = types.SimpleNamespace(prepare_finalize=pf, fused_experts=None)
    run = _bind_one(
        tmp_path, monkeypatch, lambda: iter([("model.layers.3.mlp.experts", impl)]), strict=True
    )
    pf._moepolicy_run, pf._moepolicy_table = run, None

    def unknown_experts(experts, kernel):  # experts the plugin has no action for: left to vLLM
        return actions.LayerQuant(
            fp8=True,
            block=True,
            per_token=False,
            experts="UnknownExperts",
            policy_kernel="deepgemm",
        )

    with pytest.raises(PolicyError, match="MOEPOLICY_STRICT"):
        run.bind(pf, _Owner, unknown_experts)


class _StoreGroup:
    """The shape of vLLM's StatelessProcessGroup that the vote uses: a store, a rank, a world size."""

    def __init__(self, store, rank: int, world: int):
        self.store, self.rank, self.world_size = store, rank, world


def _vote_in_threads(store, votes, timeout_s: float) -> dict:
    import threading

    from moepolicy.integrations.vllm.vote import agree

    decided = {}

    def one(v):
        decided[v.rank] = agree(_StoreGroup(store, v.rank, len(votes)), v, timeout_s=timeout_s)

    threads = [threading.Thread(target=one, args=(v,)) for v in votes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return decided


def test_the_vote_goes_through_the_store_and_every_rank_reads_one_decision():
    dist = pytest.importorskip("torch.distributed")
    store = dist.HashStore()
    same = [Vote(r, True, "abc") for r in range(3)]
    assert _vote_in_threads(store, same, 30) == {0: "", 1: "", 2: ""}
    other = [Vote(0, True, "abc"), Vote(1, True, "abd"), Vote(2, True, "abc")]
    again = _vote_in_threads(store, other, 30)  # the next start on the same store: a new round
    assert len(set(again.values())) == 1 and "digests differ" in again[0]


def test_a_rank_that_never_votes_and_one_that_votes_late_follow_the_same_decision():
    dist = pytest.importorskip("torch.distributed")
    from moepolicy.integrations.vllm.vote import agree

    store = dist.HashStore()
    early = agree(_StoreGroup(store, 0, 2), Vote(0, True, "abc"), timeout_s=0.5)
    assert early.startswith("rank(s) 1 of 2 had not voted within 0.5 s")
    # rank 1 arrives after rank 0 gave up: every vote is in the store now, yet it follows rank 0
    late = agree(_StoreGroup(store, 1, 2), Vote(1, True, "abc"), timeout_s=5)
    assert late == early


def test_the_checked_vllm_releases_are_one_list():
    """The releases the plugin pins are the ones the exports and docs name; a patch release of one
    is that release, another minor release is none."""
    from moepolicy.integrations.vllm import pins
    from moepolicy.names import CHECKED_VLLM_RELEASES

    assert (
        pins.CHECKED_RELEASES
        == CHECKED_VLLM_RELEASES
        == tuple(pins.PINNED)
        == tuple(pins.PINNED_V2)
    )
    assert pins.release_of("0.34.0") == pins.release_of("0.34.2") == "0.34"
    assert pins.release_of("0.33.1rc1") == "0.33"
    assert pins.release_of("0.3.4") is None and pins.release_of("0.340.0") is None
    assert pins.release_of("0.35.0") is None
