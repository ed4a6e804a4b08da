"""The plugin's plan for one DeepEP manager, in plain Python (no vLLM, no torch): which policy layer a
vLLM MoE module is, each layer's action per token count with its pre-built ``deep_ep.Config`` pair,
and the digest every rank must agree on.

A vLLM MoE module is matched to a policy layer by its module prefix: decoder layers
``model.layers.N.`` and the VLM variants (``language_model.model.layers.N.``,
``model.language_model.layers.N.``). DeepSeek's MTP layer is built by vLLM 0.33 with its own
index as the prefix (``deepseek_mtp.py:157-158`` passes ``model.layers.N`` to the decoder layer, whose
experts are ``model.layers.N.mlp.experts``), so a decoder index the policy holds as an MTP layer is that
MTP layer; Qwen3-Next's ``mtp.layers.K.`` maps to the policy's first MTP index plus ``K``, where the
policy holds it. Anything else (a draft model under ``draft_model.``, an index the policy lacks) is
left to vLLM.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from moepolicy.export import vllm_actions as actions

_DECODER = re.compile(
    r"^(?:model|language_model\.model|model\.language_model|language_model)\.layers\.(\d+)\."
)
_QWEN_NEXT_MTP = re.compile(r"^mtp\.layers\.(\d+)\.")


def policy_index(prefix: str, target) -> tuple[Optional[int], str]:
    """The policy layer index of vLLM's MoE module ``prefix`` (``target``: the policy's
    :class:`~moepolicy.runtime.policy.PolicyTarget`), or None and why the module is left to vLLM."""
    qwen = _QWEN_NEXT_MTP.match(prefix)
    if qwen is not None:
        index = target.num_hidden_layers + int(qwen.group(1))
        return (
            (index, "")
            if index in target.mtp_layers
            else (None, "an MTP module the policy does not hold")
        )
    decoder = _DECODER.match(prefix)
    if decoder is None:
        return None, "not a decoder or MTP layer of the served model (a draft model's module?)"
    index = int(decoder.group(1))
    if index in target.mtp_layers:  # DeepSeek's MTP layer, named with its own index
        return index, ""
    if index not in target.layer_kernels:
        return None, "a layer the policy does not hold as a MoE layer"
    return index, ""


@dataclass(frozen=True)
class Entry:
    """What one dispatch does at a token count: the action and the (dispatch, combine) configs, for
    a plain step and for a DBO micro-batch (vLLM's SM split)."""

    action: actions.Action
    serial: tuple[Any, Any]
    dbo: tuple[Any, Any]


@dataclass(frozen=True)
class LayerTable:
    """A layer's entries by token count: ``entries[bisect_left(bounds, tokens)]``."""

    bounds: tuple[int, ...]
    entries: tuple[Entry, ...]
    bucket_actions: tuple[actions.BucketAction, ...] = ()

    def entry(self, tokens: int) -> Entry:
        return self.entries[bisect.bisect_left(self.bounds, tokens)]


def _bound(max_tokens: Optional[int]) -> int:
    return sys.maxsize if max_tokens is None else max_tokens


@dataclass
class ServingPlan:
    """The policy as one manager applies it: DeepEP buckets with pre-built configs, the SM counts
    (plain and under DBO), the layers' decisions and the target they were made for."""

    policy: Any  # moepolicy.runtime.policy.Policy
    make_config: Callable[..., Any]  # deep_ep.Config
    dbo_num_sms: Optional[int] = None  # vLLM's DBO communication SMs (None: DBO off)
    deepep_v2: bool = False
    tables: dict[str, LayerTable] = field(default_factory=dict)

    def __post_init__(self) -> None:
        deepep = self.policy.deepep
        dbo_sms = self.dbo_num_sms or deepep.num_sms
        self.bucket_bounds = tuple(_bound(b.max_tokens) for b in deepep.buckets)
        if not self.sets_deepep:  # vLLM's own configs (DeepEP's table) in every bucket
            self.bucket_configs = tuple(((None, None), (None, None)) for _ in deepep.buckets)
            return
        self.bucket_configs = tuple(
            (
                (
                    self.make_config(deepep.num_sms, *b.dispatch),
                    self.make_config(deepep.num_sms, *b.combine),
                ),
                (self.make_config(dbo_sms, *b.dispatch), self.make_config(dbo_sms, *b.combine)),
            )
            for b in deepep.buckets
        )

    @property
    def sets_deepep(self) -> bool:
        """Whether the policy's DeepEP settings (SM count, configs, buffers) apply: not where the
        loader fell back to DeepEP's defaults (a tuning-key mismatch or a partial result), which are
        what vLLM runs with anyway; the layers' decisions apply either way."""
        return not self.policy.is_fallback

    def _configs(self, tokens_bound: int) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
        i = min(bisect.bisect_left(self.bucket_bounds, tokens_bound), len(self.bucket_bounds) - 1)
        return self.bucket_configs[i]

    def table(self, bucket_actions: Sequence[actions.BucketAction]) -> LayerTable:
        """A layer's table: the union of its order buckets' and DeepEP's bucket bounds."""
        bounds = sorted({_bound(b.max_tokens) for b in bucket_actions} | set(self.bucket_bounds))
        order_bounds = [_bound(b.max_tokens) for b in bucket_actions]
        entries = []
        for bound in bounds:
            action = bucket_actions[
                min(bisect.bisect_left(order_bounds, bound), len(bucket_actions) - 1)
            ].action
            serial, dbo = self._configs(bound)
            entries.append(Entry(action, serial, dbo))
        return LayerTable(tuple(bounds[:-1]), tuple(entries), tuple(bucket_actions))

    def left_to_vllm(self, reason: str) -> LayerTable:
        """A layer the policy does not decide: vLLM's order and wire, the policy's DeepEP configs."""
        return self.table(
            [
                actions.BucketAction(
                    None, actions.Action(actions.VLLM, f"left to vLLM: {reason}", applied=False)
                )
            ]
        )

    def layer_table(self, index: int, layer: actions.LayerQuant) -> LayerTable:
        decision = self.policy.layer(index)
        decisions = [(o.max_tokens, o.order, o.wire) for o in decision.orders] or [
            (None, decision.order, decision.wire)
        ]
        quant = (
            layer
            if not self.deepep_v2
            else actions.LayerQuant(**{**layer.__dict__, "deepep_v2": True})
        )
        return self.table(
            [
                actions.BucketAction(
                    bound,
                    actions.action_for(
                        order, wire.dtype, wire.scale.granularity if wire.scale else None, quant
                    ),
                )
                for bound, order, wire in decisions
            ]
        )


def digest_fields(
    policy, buffers: Mapping[str, Any], dbo_num_sms: Optional[int], versions: Mapping[str, str]
) -> dict:
    """What every rank must agree on before any rank applies the policy."""
    deepep, target = policy.deepep, policy.target
    layers = {}
    for index in sorted(target.layer_kernels):
        d = policy.layer(index)
        orders = [(o.max_tokens, o.order, str(o.wire)) for o in d.orders] or [
            (None, d.order, str(d.wire))
        ]
        layers[str(index)] = [orders, target.layer_kernels[index]]
    return {
        "applied": True,
        "versions": dict(versions),
        "policy_content_sha256": target.content_key,
        "num_sms": deepep.num_sms,
        "dbo_num_sms": dbo_num_sms,
        "buffers": dict(buffers),
        "buckets": [[b.max_tokens, list(b.dispatch), list(b.combine)] for b in deepep.buckets],
        "v2": None
        if deepep.v2 is None
        else [
            deepep.v2.num_sms,
            deepep.v2.prefer_overlap_with_compute,
            deepep.v2.allow_multiple_reduction,
        ],
        "mtp_layers": sorted(target.mtp_layers),
        "layers": layers,
    }


def digest(fields: Mapping[str, Any]) -> str:
    blob = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@dataclass(frozen=True)
class Vote:
    """One rank's answer at start-up: whether it would apply, and the digest of what."""

    rank: int
    applied: bool
    digest: str
    reason: str = ""


def verdict(votes: Sequence[Vote]) -> str:
    """ "" when every rank applies the same thing; else why every rank keeps vLLM's behaviour."""
    if all(v.applied for v in votes) and len({v.digest for v in votes}) == 1:
        return ""
    refusing = [v for v in votes if not v.applied]
    if refusing:
        first = refusing[0]
        return (
            f"rank(s) {','.join(str(v.rank) for v in refusing)} of {len(votes)} would not apply it "
            f"(rank {first.rank}: {first.reason or 'not applied'})"
        )
    by_digest: dict[str, list[int]] = {}
    for v in votes:
        by_digest.setdefault(v.digest, []).append(v.rank)
    return (
        "the ranks' digests differ ("
        + "; ".join(f"{d}: ranks {','.join(map(str, r))}" for d, r in by_digest.items())
        + ")"
    )
