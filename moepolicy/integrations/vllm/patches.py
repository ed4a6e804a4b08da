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
import sys
from typing import Callable, Optional

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


# vLLM's CUDA communicator imports its DeepEP managers from this module when it builds the EP group
# (cuda_communicator.py, at call time): only processes that build one import it
MANAGERS_MODULE = "vllm.distributed.device_communicators.all2all"


def install_on_import(path: str, strict: bool = False) -> None:
    """:func:`install` once vLLM imports its DeepEP managers' module (now, if it has): the API server
    and the engine core, which build no manager, import none of vLLM's MoE modules for the plugin and
    hash nothing. A release that is not checked is said at once, in every process."""
    if (
        pins.release_of(importlib.metadata.version("vllm")) is None
        or MANAGERS_MODULE in sys.modules
    ):
        _install_guarded(path, strict)
        return
    sys.meta_path.insert(0, _AfterImport(MANAGERS_MODULE, lambda: _install_guarded(path, strict)))


def _install_guarded(path: str, strict: bool) -> None:
    """:func:`install`; an unexpected failure leaves vLLM as it is, said in one line (vLLM does not
    guard its plugins), unless MOEPOLICY_STRICT asks to refuse."""
    try:
        install(path, strict)
    except Exception as exc:  # noqa: BLE001 (never take vLLM down unless asked to)
        if strict:
            raise
        report.warn(f"not applied: {type(exc).__name__}: {exc}; vLLM runs as it is")


class _AfterImport:
    """A meta-path finder that runs ``then`` once, right after ``name`` is executed (its import
    is otherwise the default finders' and loader's). ``then`` raising (MOEPOLICY_STRICT's refusal)
    fails that import, as a refusal to start should."""

    def __init__(self, name: str, then: Callable[[], object]):
        self.name, self.then = name, then

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # once; the finders after it find the module itself
        import importlib.util

        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run_module = spec.loader.exec_module

        def exec_module(module) -> None:
            run_module(module)
            self.then()

        spec.loader.exec_module = exec_module  # this module's loader only (one per module)
        return spec


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
