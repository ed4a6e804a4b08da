"""One start of a vLLM DeepEP manager under the plugin: load the policy for what vLLM really runs,
agree with every other rank over the manager's CPU group, then bind each MoE layer once.

State lives here, one object per manager start (a re-created manager, for elastic EP or a second
engine in one process, starts afresh). Every not-applied branch says why in one line and, with
``MOEPOLICY_STRICT`` on, refuses to start, after the agreement (so that no rank waits for one that
left).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from moepolicy.names import Backend
from moepolicy.errors import PolicyError
from moepolicy.export import vllm_actions as actions
from moepolicy.integrations.vllm import report
from moepolicy.integrations.vllm.serving import (
    ServingPlan,
    Vote,
    digest,
    digest_fields,
    policy_index,
)
from moepolicy.integrations.vllm.vote import agree


@dataclass(frozen=True)
class PluginSettings:
    """What ``register`` read: the policy path (None: unset on this rank), strict, the versions."""

    path: Optional[str]
    strict: bool
    versions: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ServingFacts:
    """What vLLM runs, from its current config."""

    ep_size: int
    rank: int
    model: Any  # ServedModel
    cudagraphs: str  # "" when off
    microbatching: bool  # DBO or --ubatch-size > 1: vLLM's micro-batches, under its SM split
    dbo_comm_sms: int
    layout: str  # intranode | internode, as this manager's DeepEP buffer runs


def serving_facts(manager, kind: str = "ht") -> ServingFacts:
    import vllm.envs as envs
    from vllm.config import get_current_vllm_config

    from moepolicy.integrations.vllm.served import served_model

    cfg = get_current_vllm_config()
    load = getattr(cfg, "load_config", None)
    model = served_model(getattr(cfg, "model_config", None), getattr(load, "download_dir", None))
    mode = getattr(getattr(cfg, "compilation_config", None), "cudagraph_mode", None)
    name = getattr(mode, "name", str(mode))
    parallel = getattr(cfg, "parallel_config", None)
    # ParallelConfig.use_ubatching (pinned): enable_dbo or ubatch_size > 1
    microbatching = bool(getattr(parallel, "use_ubatching", False))
    # the high-throughput buffer runs intranode where vLLM forces it (deepep_ht _make_all2all_kwargs)
    internode = bool(getattr(manager, "internode", False)) and not (
        kind == "ht" and envs.VLLM_DEEPEP_HIGH_THROUGHPUT_FORCE_INTRA_NODE
    )
    return ServingFacts(
        manager.world_size,
        manager.rank,
        model,
        "" if mode is None or name == "NONE" else name,
        microbatching,
        int(envs.VLLM_DBO_COMM_SMS),
        "internode" if internode else "intranode",
    )


class _Held(logging.Handler):
    """A handler that keeps the records it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.held.append(record)


@contextlib.contextmanager
def _loader_lines() -> Iterator[list[logging.LogRecord]]:
    """The loader's own warnings (logger ``moepolicy``) held back while the plugin loads: the plugin
    says the outcome itself, in vLLM's log, once."""
    lg = logging.getLogger("moepolicy")
    handler = _Held()
    propagate, lg.propagate = lg.propagate, False
    lg.addHandler(handler)
    try:
        yield handler.held
    finally:
        lg.removeHandler(handler)
        lg.propagate = propagate


_STARTS = itertools.count()


class ManagerRun:
    """The plugin for one manager start (``kind``: "ht" or "v2")."""

    def __init__(self, settings: PluginSettings, kind: str, make_config):
        self.settings, self.kind, self.make_config = settings, kind, make_config
        self.plan: Optional[ServingPlan] = None
        self.applied = False
        self.reason = ""
        self.digest = ""
        self.facts: Optional[ServingFacts] = None
        self._lock = threading.Lock()
        self._bound = False
        self._unbound_why = ""  # why a layer bound after the first dispatch is left to vLLM
        self.key = next(_STARTS)  # what this start has said, it does not say again
        self.per_layer: dict[int, tuple] = {}  # policy index -> its bucket actions
        self.bound: dict[str, bool] = {}  # vLLM prefix -> applied
        self.unmatched: dict[str, str] = {}
        self.experts_built: set[str] = set()  # the experts classes vLLM built for these layers

    @property
    def _plan(self) -> ServingPlan:
        """The plan, read once the policy applies (``_prepare`` made it on every rank)."""
        assert self.plan is not None, "the plan is read only where the policy applies"
        return self.plan

    @property
    def _facts(self) -> ServingFacts:
        """The serving facts, read once ``start`` has read them."""
        assert self.facts is not None, "the serving facts are read only after start"
        return self.facts

    # ---------------------------------------------------------------------------------- start
    def start(self, manager) -> None:
        try:
            self.facts = serving_facts(manager, self.kind)
            fields = self._prepare()
        except Exception as exc:  # noqa: BLE001 (any failure is this rank's "not applied", said below)
            fields, self.reason = None, f"{type(exc).__name__}: {exc}"
        self.digest = digest(fields) if fields else ""
        vote = Vote(manager.rank, fields is not None, self.digest, self.reason)
        try:
            disagreement = agree(manager.cpu_group, vote)
        except Exception as exc:  # noqa: BLE001 (the group failed: no rank can know the others agree)
            disagreement = f"the ranks could not be asked ({type(exc).__name__}: {exc})"
        self.applied = not disagreement
        if (
            disagreement and fields is not None
        ):  # this rank would apply it; another would not, or not the same
            self.reason = f"the ranks do not agree: {disagreement}"
        self._report(manager, disagreement)

    def _report(self, manager, disagreement: str) -> None:
        if self.applied:
            if self.kind == "ht" and self._plan.sets_deepep:
                manager.num_sms = (
                    self._plan.policy.deepep.num_sms
                )  # vLLM fixes 20; set_num_sms only lowers it
            report.debug(
                f"rank {manager.rank}: all {manager.world_size} ranks agree on digest {self.digest}; the "
                "policy applies from the first DeepEP dispatch"
            )
            return
        self.plan = None
        if not self.settings.path:
            report.debug(
                f"rank {manager.rank}: MOEPOLICY_POLICY is not set here; agreed: vLLM's behaviour "
                f"({disagreement or 'no rank applies'})"
            )
            return
        report.say_once(
            self.key,
            f"not applied: {self.reason}; vLLM's own DeepEP behaviour is kept on every rank",
            logging.WARNING,
        )
        if self.settings.strict:
            raise PolicyError(
                f"MOEPOLICY_STRICT: the policy is not applied ({self.reason}); refusing to start"
            )

    def _prepare(self) -> Optional[dict]:
        """Load and check the policy on this rank; the digest's fields, or None with ``reason`` set."""
        if not self.settings.path:
            self.reason = "MOEPOLICY_POLICY is not set on this rank"
            return None
        policy = self._load()
        for (
            warning
        ) in policy.warnings:  # the loader's own (unknown keys ignored, ...), once per start
            report.say_once(self.key, warning, logging.WARNING)
        problem = self._problem(policy)
        if problem:
            self.reason = problem
            return None
        facts = self._facts
        dbo_sms = (
            min(facts.dbo_comm_sms, policy.deepep.num_sms)
            if facts.microbatching and self.kind == "ht" and not policy.is_fallback
            else None
        )
        self.plan = ServingPlan(
            policy, self.make_config, dbo_num_sms=dbo_sms, deepep_v2=self.kind == "v2"
        )
        buffers = (
            {"nvl": policy.deepep.num_nvl_bytes, "rdma": policy.deepep.num_rdma_bytes}
            if self.plan.sets_deepep
            else {"vllm": "its own"}
        )
        return digest_fields(policy, buffers, dbo_sms, dict(self.settings.versions))

    def _load(self):
        from moepolicy import load_policy

        facts = self._facts
        with _loader_lines():
            return load_policy(
                self.settings.path,
                ep_size=facts.ep_size,
                model=facts.model,
                strict=False,
                schedule="overlapped" if facts.microbatching else "serial",
                layout=facts.layout,
            )

    def _problem(self, policy) -> str:
        facts = self._facts
        if facts.cudagraphs and self.kind == "ht":
            return (
                f"CUDA graphs are on ({facts.cudagraphs}); per-bucket choices cannot follow the token count "
                "inside a captured graph (vLLM turns them off for DeepEP high-throughput with DP > 1)"
            )
        if not policy.keeps_decisions:  # the safe policy: vLLM's own path is the safe one here
            return str(policy.fallback_reason)
        if self.settings.strict and policy.is_fallback:
            return f"{policy.fallback_reason} (MOEPOLICY_STRICT)"
        if self.settings.strict and policy.warnings:
            return f"{policy.warnings[0]} (MOEPOLICY_STRICT)"
        target = policy.target
        wanted = "v2" if self.kind == "v2" else "legacy"
        if target.deepep_api != wanted or (
            self.kind == "ht" and target.backend != Backend.DEEPEP_HT
        ):
            return (
                f"the policy is for DeepEP {target.deepep_api} {target.backend}; vLLM runs "
                f"{'deepep_v2' if self.kind == 'v2' else 'deepep_high_throughput'}"
            )
        if self.kind == "ht" and not policy.is_fallback and policy.deepep.num_nvl_bytes is None:
            return "the policy has no buffer sizes"
        return ""

    # ------------------------------------------------------------------------------ binding
    def bind(self, instance, owner_class, layer_quant) -> Any:
        """Each MoE layer's table, computed once for every layer of this manager at its first dispatch."""
        with self._lock:
            if not self._bound:
                self._bound = True
                self._unbound_why = self._bind_all(owner_class, layer_quant)
            if instance._moepolicy_table is None:
                instance._moepolicy_table = self._plan.left_to_vllm(self._unbound_why)
            return instance._moepolicy_table

    def _bind_all(self, owner_class, layer_quant) -> str:
        """Bind every layer of this manager, then say what applies (MOEPOLICY_STRICT raises there);
        returns why a layer found unbound later is left to vLLM."""
        why = "the layer is not in vLLM's forward context"
        try:
            kernels = list(moe_kernels())
        except (
            AttributeError,
            KeyError,
            TypeError,
        ) as exc:  # another vLLM's table: every rank alike
            kernels = []
            why = f"vLLM's MoE layers could not be read ({type(exc).__name__}: {exc})"
            report.say_once(self.key, f"{why}; every layer is left to vLLM", logging.WARNING)
        for prefix, impl in kernels:
            pf = getattr(impl, "prepare_finalize", None)
            if not isinstance(pf, owner_class) or pf._moepolicy_run is not self:
                continue
            self.experts_built.add(type(getattr(impl, "fused_experts", None)).__name__)
            pf._moepolicy_table = self._layer_table(prefix, impl, layer_quant)
        self._summarise()
        return why

    def _layer_table(self, prefix: str, impl, layer_quant):
        try:
            index, why = policy_index(prefix, self._plan.policy.target)
            if index is None:
                self.unmatched[prefix] = why
                return self._plan.left_to_vllm(why)
            quant = layer_quant(
                impl.fused_experts, self._plan.policy.target.layer_kernels.get(index, "")
            )
            table = self._plan.layer_table(index, quant)
            self.per_layer[index] = table.bucket_actions
            self.bound[prefix] = all(b.action.applied for b in table.bucket_actions)
            return table
        except Exception as exc:  # noqa: BLE001 (the same inputs on every rank: the same fallback)
            why = f"{type(exc).__name__}: {exc}"
            self.unmatched[prefix] = why
            return self._plan.left_to_vllm(why)

    def _summarise(self) -> None:
        policy, facts = self._plan.policy, self._facts
        summary = actions.summary_line(self.bound, self.per_layer, self.unmatched)
        deepep = policy.deepep
        if self.kind == "v2":
            v2 = deepep.v2
            settings = "DeepEP v2 " + (
                f"num_sms {v2.num_sms}, prefer_overlap_with_compute "
                f"{v2.prefer_overlap_with_compute}"
                if v2 is not None
                else "defaults"
            )
        elif not self._plan.sets_deepep:
            settings = (
                f"DeepEP's settings left to vLLM (its num_sms, buffers and DeepEP's default configs: "
                f"{policy.fallback_reason})"
            )
        else:
            settings = (
                f"DeepEP num_sms {deepep.num_sms}"
                + (
                    f" ({self._plan.dbo_num_sms} in DBO micro-batches, vLLM's split)"
                    if self._plan.dbo_num_sms
                    else ""
                )
                + f", {actions.configs_line(deepep.source, len(deepep.buckets))}"
            )
        report.say_once(
            self.key,
            f"applied (digest {self.digest}): {self.settings.path} for {facts.model} "
            f"(EP {facts.ep_size}): {settings}; {summary}; vLLM built "
            f"{', '.join(sorted(self.experts_built)) or 'no DeepEP MoE experts'} "
            f"(the policy's expert kernel: {policy.target.expert_kernel})",
        )
        applied, left = actions.layer_lines(self.per_layer, self._plan.policy.target.mtp_layers)
        for line in (
            applied
            + left
            + [f"{prefix}: left to vLLM: {why}" for prefix, why in self.unmatched.items()]
        ):
            report.debug(line)
        held_back = [line for line in left]
        if self.settings.strict and held_back:
            raise PolicyError(
                f"MOEPOLICY_STRICT: policy layers left to vLLM ({held_back[0]}); refusing to run"
            )


def moe_kernels():
    """(prefix, FusedMoEKernel impl) of every MoE layer in vLLM's layer table (the forward context's,
    else the current config's)."""
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if is_forward_context_available():
        layers = get_forward_context().no_compile_layers
    else:
        from vllm.config import get_current_vllm_config

        layers = get_current_vllm_config().compilation_config.static_forward_context
    for prefix, layer in list(layers.items()):
        method = getattr(getattr(layer, "routed_experts", layer), "quant_method", None)
        impl = getattr(getattr(method, "moe_kernel", None), "impl", None)
        if impl is not None:
            yield prefix, impl
