"""moepolicy as a vLLM general plugin: ``MOEPOLICY_POLICY=policy.yaml vllm serve ...``.

vLLM calls :func:`register` early in every process it starts (API server, engine, each worker),
outside any ``try``. So it does nothing at all — not even an import of torch — when
``MOEPOLICY_POLICY`` is unset, and otherwise only installs patches on vLLM's DeepEP high-throughput
classes, catching every error: a plugin that cannot apply the policy leaves vLLM exactly as it is
and says why in one line. See :mod:`moepolicy.integrations.vllm.patches` for what is patched.
"""

from __future__ import annotations

import os

POLICY_ENV = "MOEPOLICY_POLICY"
STRICT_ENV = "MOEPOLICY_STRICT"  # 1: refuse to start instead of leaving vLLM's behaviour in place


def register() -> None:
    """The ``vllm.general_plugins`` entry point."""
    if not os.environ.get(POLICY_ENV):
        return
    try:
        from moepolicy.integrations.vllm.patches import install

        install(os.environ[POLICY_ENV], strict=os.environ.get(STRICT_ENV) == "1")
    except Exception as exc:  # noqa: BLE001 (vLLM does not guard its plugins: never take it down)
        if os.environ.get(STRICT_ENV) == "1":
            raise
        from moepolicy.integrations.vllm.report import say

        say(f"not applied: {type(exc).__name__}: {exc}")
