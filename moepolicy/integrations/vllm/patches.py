"""Installing the plugin in vLLM 0.33 and 0.34: its subclasses go where vLLM constructs the originals.

- ``device_communicators/all2all.py``: ``DeepEPHTAll2AllManager`` and ``DeepEPV2All2AllManager``
  (``cuda_communicator.py:210-237`` imports them from that module when it builds the EP group);
- ``fused_moe/all2all_utils.py``: ``DeepEPHTPrepareAndFinalize`` and ``DeepEPV2PrepareAndFinalize``
  (``maybe_make_prepare_finalize`` builds one per MoE layer from that module's names, :243 and :303).

No method of vLLM's is replaced in place. Pinned (:mod:`moepolicy.integrations.vllm.pins`): the vLLM
releases checked (0.33.x, 0.34.x) and, per release, a hash of the source of every function the
plugin overrides or relies on; anything else installs nothing and says which. DeepEP v2 is pinned apart: a v2 difference leaves
high-throughput installed.
"""

from __future__ import annotations

import importlib.metadata
from typing import Optional

from moepolicy.integrations.vllm import pins, report
from moepolicy.integrations.vllm.run import PluginSettings

CHECKED_RELEASES = pins.CHECKED_RELEASES
_ORIGINALS: dict = {}


def _refuse(message: str, path: Optional[str], strict: bool) -> None:
    """Not installed: said in one line where a policy was asked for; refused with strict."""
    if not path:
        report.debug(f"not installed ({message}); MOEPOLICY_POLICY is not set")
        return
    report.warn(f"not applied: {message}; vLLM runs as it is")
    if strict:
        from moepolicy.errors import PolicyError

        raise PolicyError(f"MOEPOLICY_STRICT: {message}; refusing to start")


def install(path: Optional[str], strict: bool = False) -> Optional[PluginSettings]:
    """Install the plugin's classes if this vLLM is a release checked and its pinned source is the
    source checked; else say why (and with ``strict``, refuse). ``path`` None: the variable is unset
    here, and only the start-up agreement is installed (this rank votes "not applied")."""
    version = importlib.metadata.version("vllm")
    release = pins.release_of(version)
    if release is None:
        checked = " or ".join(r + ".x" for r in CHECKED_RELEASES)
        _refuse(
            f"vLLM {version} is not a release this plugin was checked against ({checked}): serve "
            f"with vLLM {checked} to apply the policy, or use a moepolicy checked against "
            f"{version}; without MOEPOLICY_POLICY the plugin stays silent",
            path,
            strict,
        )
        return None
    try:
        from moepolicy.integrations.vllm import classes
    except ImportError as exc:
        _refuse(f"vLLM's DeepEP modules do not import ({exc})", path, strict)
        return None
    drift = pins.drift(pins.PINNED[release])
    if drift:
        _refuse(
            f"vLLM {version}'s {', '.join(drift)} differ from the source this plugin was checked against",
            path,
            strict,
        )
        return None
    settings = PluginSettings(path, strict, (("moepolicy", _version()), ("vllm", version)))
    classes.SETTINGS = settings
    _swap_ht(classes)
    v2 = _install_v2(pins.PINNED_V2[release])
    report.debug(
        f"installed for vLLM {version}: DeepEP high-throughput{' and v2' if v2 else ''}"
        f"{'' if path else ' (start-up agreement only: MOEPOLICY_POLICY is not set)'}"
    )
    return settings


def _version() -> str:
    from moepolicy._version import __version__

    return __version__


def _swap(module, name: str, cls) -> None:
    _ORIGINALS.setdefault((module.__name__, name), getattr(module, name, None))
    setattr(module, name, cls)


def _swap_ht(classes) -> None:
    from vllm.distributed.device_communicators import all2all
    from vllm.model_executor.layers.fused_moe import all2all_utils

    _swap(all2all, "DeepEPHTAll2AllManager", classes.PolicyDeepEPHTAll2AllManager)
    _swap(all2all_utils, "DeepEPHTPrepareAndFinalize", classes.PolicyDeepEPHTPrepareAndFinalize)


def _install_v2(pinned: dict) -> bool:
    """DeepEP v2's pair, when its module imports (a DeepEP with ElasticBuffer) and its source is pinned."""
    try:
        from moepolicy.integrations.vllm import classes_v2
    except Exception as exc:  # noqa: BLE001 (no DeepEP v2 here: high-throughput only)
        report.debug(f"DeepEP v2 classes not installed ({type(exc).__name__}: {exc})")
        return False
    from vllm.distributed.device_communicators import all2all
    from vllm.model_executor.layers.fused_moe import all2all_utils

    drift = pins.drift(pinned)
    if drift:
        message = f"DeepEP v2: vLLM's {', '.join(drift)} differ from the source this plugin was checked against"
        settings = classes_v2.classes.SETTINGS
        if (
            settings.path and settings.strict
        ):  # refused where it matters: when vLLM builds a v2 manager
            _swap(
                all2all,
                "DeepEPV2All2AllManager",
                _refusing(all2all.DeepEPV2All2AllManager, message),
            )
        elif settings.path:
            report.warn(f"not applied on DeepEP v2: {message}; vLLM's v2 path runs as it is")
        return False

    _swap(all2all, "DeepEPV2All2AllManager", classes_v2.PolicyDeepEPV2All2AllManager)
    _swap(all2all_utils, "DeepEPV2PrepareAndFinalize", classes_v2.PolicyDeepEPV2PrepareAndFinalize)
    return True


def _refusing(cls, message: str):
    """vLLM's v2 manager that refuses to start (MOEPOLICY_STRICT) because the plugin cannot apply there."""
    from moepolicy.errors import PolicyError

    def __init__(self, *args, **kwargs):
        raise PolicyError(f"MOEPOLICY_STRICT: {message}; refusing to start")

    return type(cls.__name__, (cls,), {"__init__": __init__})


def uninstall() -> None:
    """Put vLLM's own classes back (tests; a second engine in one process that wants none)."""
    import importlib

    for (module_name, name), original in _ORIGINALS.items():
        module = importlib.import_module(module_name)
        if original is None:
            if hasattr(module, name):
                delattr(module, name)
        else:
            setattr(module, name, original)
    _ORIGINALS.clear()
