"""``load_policy``: one call inside a serving process.

- A damaged file or a decision-key mismatch gives the safe policy (bf16 on the wire, the engine's
  own handling after dispatch) unless ``strict=True``, which raises.
- A tuning-key mismatch keeps the decisions and uses DeepEP's default configs.
- Either way ``is_fallback`` says so and one warning is logged per process (per file and reason).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Optional, Sequence, SupportsIndex

from moepolicy.errors import PolicyError
from moepolicy.wire import Scale, Wire
from moepolicy.deepep.configs import ChunkConfig
from moepolicy.deepep.settings import Bucket, DeepEPSettings, V2Settings
from moepolicy.runtime.policy import (
    BucketOrder,
    LayerDecision,
    LoadReport,
    Policy,
    PolicyTarget,
    SafePolicy,
    ServedModel,
)

_WARNED: set[tuple[str, str]] = set()
_WARN_LOCK = threading.Lock()


def _warn_once(source: str, message: str) -> None:
    with _WARN_LOCK:
        if (source, message) in _WARNED:
            return
        _WARNED.add((source, message))
    import logging  # only when there is something to say: keeps the loader's import light

    from moepolicy.text import printable

    # a policy's text (its model name, a reason, the path) reaches the operator's terminal through
    # the engine's log: control and bidirectional characters escaped, one line
    logging.getLogger("moepolicy").warning("moepolicy: %s", printable(message, one_line=True))


def _settings_from_doc(deepep: dict) -> DeepEPSettings:
    buckets = tuple(
        Bucket(
            b["max_tokens"],
            ChunkConfig.from_doc(b["dispatch"]),
            ChunkConfig.from_doc(b["combine"]),
        )
        for b in deepep["buckets"]
    )
    source = deepep["provenance"]["source"]
    return DeepEPSettings(
        num_sms=deepep["num_sms"],
        num_nvl_bytes=deepep["num_nvl_bytes"],
        num_rdma_bytes=deepep["num_rdma_bytes"],
        buckets=buckets,
        source=source,
        is_default=source == "default",
        low_latency=dict(deepep.get("low_latency") or {}),
        v2=_v2_settings(deepep.get("v2")),
    )


def _v2_settings(doc: Optional[dict]) -> Optional[V2Settings]:
    if not doc:
        return None
    return V2Settings(
        num_sms=doc.get("num_sms", 0),
        prefer_overlap_with_compute=doc.get("prefer_overlap_with_compute", True),
        allow_multiple_reduction=doc.get("allow_multiple_reduction", True),
    )


def default_settings(
    ep_size: Optional[int], hidden: Optional[int] = None, sheet_name: Optional[str] = None
) -> DeepEPSettings:
    """DeepEP's built-in configs for ``ep_size`` (what DeepEP would use without a policy)."""
    from moepolicy import datasheets
    from moepolicy.deepep.buffers import ht_buffer_bytes
    from moepolicy.deepep.configs import default_configs, default_num_sms

    try:
        sheet = datasheets.deepep_sheet(sheet_name or datasheets.NEWEST_SHEET)
    except Exception:  # noqa: BLE001 (an unknown sheet name still gets the newest defaults)
        sheet = datasheets.deepep_sheet(datasheets.NEWEST_SHEET)
    ranks = ep_size or 8
    disp, comb = default_configs(sheet, ranks)
    num_sms = default_num_sms(sheet)
    nvl = rdma = (
        None  # no hidden size known: the engine decides (never 0, which no buffer can run with)
    )
    if hidden:
        nvl, rdma = ht_buffer_bytes(num_sms, (disp, comb), hidden, ranks)
    return DeepEPSettings(
        num_sms=num_sms,
        num_nvl_bytes=nvl,
        num_rdma_bytes=rdma,
        buckets=(Bucket(None, disp, comb),),
        source="default",
        is_default=True,
    )


def _wire(doc: dict) -> Wire:
    scale = doc["scale"]
    return Wire(
        doc["dtype"],
        Scale(scale["granularity"], scale["dtype"], scale["layout"], scale["group"])
        if scale is not None
        else None,
    )


def _layer(entry: dict, measured: bool = True) -> LayerDecision:
    """A layer's decision; without ``measured`` (tuning key mismatch, partial tune), the rules'
    decision without measured facts and no per-bucket orders."""
    combine = (entry.get("combine") or {}).get("dtype", "bf16")
    decided = entry if measured or entry.get("unmeasured") is None else entry["unmeasured"]
    orders = (
        tuple(
            BucketOrder(o["max_tokens"], o["order"], _wire(o["wire"]))
            for o in (entry.get("orders") or ())
        )
        if measured
        else ()
    )
    return LayerDecision(
        index=entry["index"],
        kind=entry["kind"],
        order=decided["order"],
        wire=_wire(decided["wire"]),
        numerics=decided["numerics"],
        rule=decided["rule"],
        reason=decided["reason"],
        combine=combine,
        orders=orders,
    )


def _safe(
    source: str,
    reason: str,
    ep_size: Optional[int],
    report: dict[str, str],
    details: tuple[str, ...] = (),
    warnings: tuple[str, ...] = (),
    hidden: Optional[int] = None,
) -> SafePolicy:
    _warn_once(source, f"{source}: falling back to the safe policy (bf16 on the wire): {reason}")
    return SafePolicy(
        (),
        default_settings(ep_size, hidden),
        LoadReport(source, report, details, warnings=warnings, fallback_reason=reason),
    )


def _hidden_hint(path: str | Path, model: Optional[str | ServedModel]) -> Optional[int]:
    """The hidden size for sizing DeepEP's default buffers on the safe path: the served model's (a
    name, or the engine's ServedModel), else what the (damaged) file says; None when neither can be
    read."""
    if model is not None:
        try:
            from moepolicy.runtime.keycheck import _served_facts

            return _served_facts(model, "vllm")[0].hidden_size
        except Exception:  # noqa: BLE001 (the safe path must not fail)
            pass
    try:
        from moepolicy.document.yaml_io import parse_text
        from moepolicy.files import read_bounded
        from moepolicy.document.reader import MAX_POLICY_BYTES

        raw = parse_text(
            read_bounded(path, MAX_POLICY_BYTES, PolicyError).decode("utf-8", "replace")
        )
        hidden = raw["model"]["hidden_size"]
        return hidden if isinstance(hidden, int) and 0 < hidden <= 1 << 20 else None
    except Exception:  # noqa: BLE001
        return None


MAX_EP_SIZE = 65536  # the schema's bound on target.ep_size


def _argument_problem(
    ep_size: object, model: object, rules: object = (), layout: object = None
) -> Optional[str]:
    """Why ``load_policy``'s own arguments cannot be used (a caller's mistake, not the file's), or None."""
    if ep_size is not None:
        import operator

        try:
            n = (
                operator.index(ep_size)
                if isinstance(ep_size, SupportsIndex) and not isinstance(ep_size, bool)
                else None
            )
        except TypeError:
            n = None
        if n is None or not 1 <= n <= MAX_EP_SIZE:
            return f"ep_size must be a whole number from 1 to {MAX_EP_SIZE} (the EP ranks serving), got {ep_size!r}"
    if model is not None and not isinstance(model, (str, os.PathLike, ServedModel)):
        return (
            f"model must be a name, a config.json or a folder (a string), or the ServedModel an engine loaded, "
            f"got {type(model).__name__}"
        )
    given = [rules] if isinstance(rules, (str, os.PathLike)) else rules
    if not isinstance(given, (list, tuple)) or not all(
        isinstance(p, (str, os.PathLike)) for p in given
    ):
        return f"rules must be a list of files or folders (rule packs), got {type(rules).__name__}"
    if layout not in (None, "intranode", "internode"):
        return f"layout must be 'intranode' or 'internode' (how the engine's DeepEP runs), got {layout!r}"
    return None


def _places(
    path: str | Path, rules: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
) -> tuple[Path, ...]:
    """Where user rule packs are looked up: what the caller named (files or folders), then the
    policy's own folder; absolute, so that the working folder does not change what is found."""
    given = [rules] if isinstance(rules, (str, os.PathLike)) else list(rules)
    return tuple(Path(p).absolute() for p in given) + (Path(path).absolute().parent,)


def load_policy(
    path: str | Path,
    *,
    ep_size: Optional[int] = None,
    model: Optional[str | ServedModel] = None,
    strict: bool = False,
    schedule: Optional[str] = None,
    rules: Sequence[str | Path] = (),
    layout: Optional[str] = None,
) -> Policy:
    """Load ``path`` for a serving process (see :func:`_load`); never raises unless ``strict``.

    ``rules``: files or folders holding the user rule packs the policy was planned with (the
    policy names them, never their paths); the policy's own folder is always searched.
    """
    problem = _argument_problem(ep_size, model, rules, layout)
    if problem is not None:
        if strict:
            raise PolicyError(f"{path}: {problem}")
        return _safe(
            str(path),
            problem,
            None,
            {"decision": "unchecked", "tuning": "unchecked"},
            hidden=_hidden_hint(path, model if isinstance(model, (str, ServedModel)) else None),
        )
    ep_size = None if ep_size is None else int(ep_size)
    places = _places(path, rules)
    if strict:
        return _load(
            path,
            ep_size=ep_size,
            model=model,
            strict=True,
            schedule=schedule,
            places=places,
            layout=layout,
        )
    try:
        return _load(
            path,
            ep_size=ep_size,
            model=model,
            strict=False,
            schedule=schedule,
            places=places,
            layout=layout,
        )
    except Exception as exc:  # noqa: BLE001 (serving must never be taken down by a policy file)
        return _safe(
            str(path),
            f"unexpected error while loading ({type(exc).__name__}: {exc})",
            ep_size,
            {"decision": "unchecked", "tuning": "unchecked"},
            hidden=_hidden_hint(path, model),
        )


def _load(
    path: str | Path,
    *,
    ep_size: Optional[int],
    model: Optional[str | ServedModel],
    strict: bool,
    schedule: Optional[str] = None,
    places: Sequence[Path] = (),
    layout: Optional[str] = None,
) -> Policy:
    """Load ``path`` for a serving process with ``ep_size`` ranks serving ``model``.

    Args:
        path: the policy YAML (or JSON) written by ``moepolicy plan`` or ``tune``.
        ep_size: the EP size this process serves with; checked against the policy.
        model: the checkpoint (name, config.json or folder) being served, or a :class:`ServedModel`
            (what the engine loaded: its folder or parsed config); its normalised facts are hashed
            and compared with the policy's.
        strict: raise :class:`~moepolicy.errors.PolicyError` instead of falling back.
        schedule: ``serial`` or ``overlapped`` (DBO/TBO), as the engine runs; checked against the
            schedule the DeepEP configs were tuned for.
        layout: ``intranode`` or ``internode``, as the engine's DeepEP buffer runs (vLLM's
            ``manager.internode``); without it the layout is inferred from ``ep_size`` and the
            policy's GPUs per node.
    """
    from moepolicy.document.reader import parse_policy_light, read_policy
    from moepolicy.document.fast_validate import View
    from moepolicy.runtime.keycheck import check_keys, summarise

    source = str(path)
    try:
        loaded = read_policy(path, strict=strict, parse=parse_policy_light)
    except PolicyError as exc:
        if strict:
            raise
        return _safe(
            source,
            f"damaged policy: {exc}",
            ep_size,
            {"decision": "unchecked", "tuning": "unchecked"},
            hidden=_hidden_hint(path, model),
        )
    for warning in loaded.warnings:
        _warn_once(source, warning)
    data = loaded.doc
    doc = View(data)
    checks = check_keys(
        doc, ep_size=ep_size, model=model, schedule=schedule, pack_places=places, layout=layout
    )
    report = {
        "decision": summarise(checks, "decision", "model_facts"),
        "tuning": summarise(checks, "tuning", "ep_size"),
    }
    details = tuple(c.render() for c in checks)
    mismatches = [c.render() for c in checks if c.status == "mismatched"]
    if strict and mismatches:
        raise PolicyError(f"{source}: key mismatch: {'; '.join(mismatches)}")
    if report["decision"] == "mismatched":
        reason = "decision key mismatch: " + "; ".join(
            c.render() for c in checks if c.part == "decision" and c.status == "mismatched"
        )
        return _safe(
            source,
            reason,
            ep_size,
            report,
            details,
            loaded.warnings,
            hidden=data["model"]["hidden_size"],
        )
    partial = data["deepep"].get("partial")
    if partial is not None and strict:
        raise PolicyError(
            f"{source}: a partial result ({partial['reason']}); re-run the tune to completion"
        )
    if report["tuning"] == "mismatched" or partial is not None:
        reason = (
            "tuning key mismatch (decisions kept without measured facts, DeepEP default configs used): "
            + "; ".join(
                c.render() for c in checks if c.part == "tuning" and c.status == "mismatched"
            )
            if partial is None
            else f"partial result ({partial['reason']}): decisions kept without measured facts, DeepEP "
            "default configs used"
        )
        layers = tuple(_layer(entry, measured=False) for entry in data["layers"])
        _warn_once(source, f"{source}: {reason}")
        settings = default_settings(
            ep_size, data["model"]["hidden_size"], data["target"]["deep_ep"]["sheet"]
        )
        return Policy(
            layers,
            settings,
            LoadReport(source, report, details, doc.model.name, loaded.warnings, reason),
            PolicyTarget.from_doc(data),
        )
    layers = tuple(_layer(entry) for entry in data["layers"])
    return Policy(
        layers,
        _settings_from_doc(data["deepep"]),
        LoadReport(source, report, details, doc.model.name, loaded.warnings),
        PolicyTarget.from_doc(data),
    )


def policy_as_written(data: dict, source: str = "") -> Policy:
    """The policy exactly as its validated document ``data`` says: no key checks, no fallback (what
    ``validate --live`` runs through DeepEP). Serving processes use :func:`load_policy`."""
    return Policy(
        tuple(_layer(entry) for entry in data["layers"]),
        _settings_from_doc(data["deepep"]),
        LoadReport(source, {"decision": "unchecked", "tuning": "unchecked"}),
        PolicyTarget.from_doc(data),
    )
