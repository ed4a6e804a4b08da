"""Recognise the installed DeepEP build by feature (its ``__version__`` is the same across builds).

A build can offer two APIs: DeepEP 2.x exports the legacy ``Buffer`` (vLLM's high-throughput and
low-latency backends) beside ``ElasticBuffer`` (its ``deepep_v2`` backend). Each capability sheet
describes one API, so a build is matched per API: the API the running backend uses, not the whole
build."""

from __future__ import annotations

import sys
from types import ModuleType
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from moepolicy.schema.capability import DeepEPSheet


def features_of(module: ModuleType) -> frozenset[str]:
    found = {
        name
        for name in ("Buffer", "Config", "ElasticBuffer", "topk_idx_t")
        if hasattr(module, name)
    }
    import inspect

    buffer = getattr(module, "Buffer", None)
    if buffer is not None:
        try:
            params = inspect.signature(buffer.__init__).parameters
            found |= {f"Buffer.{p}" for p in params if p != "self"}
        except (TypeError, ValueError):
            pass
    is_sm90 = getattr(buffer, "is_sm90_compiled", None)
    if callable(is_sm90):
        try:
            if is_sm90():
                found.add("sm90_compiled")
        except Exception:  # noqa: BLE001 (a probe never fails the caller)
            pass
    return frozenset(found)


def imported_features() -> Optional[frozenset[str]]:
    """Features of ``deep_ep`` if this process already imported it; never imports it."""
    module = sys.modules.get("deep_ep")
    return features_of(module) if module is not None else None


def import_features() -> Optional[frozenset[str]]:
    """Import ``deep_ep`` (CLI only) and return its features, or ``None`` if it is not installed."""
    try:
        import deep_ep  # noqa: F401
    except Exception:  # noqa: BLE001 (missing or broken build: both mean 'not usable')
        return None
    return features_of(sys.modules["deep_ep"])


def offers(features: frozenset[str], sheet: "DeepEPSheet") -> bool:
    """Whether a build with ``features`` offers the API ``sheet`` describes."""
    return set(sheet.probe.requires) <= features and not set(sheet.probe.forbids) & features


def matching_sheet(
    features: frozenset[str], sheets: dict[str, "DeepEPSheet"], api: Optional[str] = None
) -> Optional["DeepEPSheet"]:
    """The sheet of the API ``api`` ("legacy" or "v2") the build offers; with no ``api``, its legacy
    API where it has one (what vLLM's default DeepEP backends use), else its v2 API."""
    found = [s for s in sheets.values() if offers(features, s) and api in (None, s.api)]
    found.sort(key=lambda s: s.api != "legacy")
    return found[0] if found else None


def offered_sheets(features: frozenset[str], sheets: dict[str, "DeepEPSheet"]) -> list[str]:
    """The names of every sheet whose API the build offers (one per API)."""
    return sorted(s.name for s in sheets.values() if offers(features, s))
