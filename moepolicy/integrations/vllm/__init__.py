"""moepolicy as a vLLM general plugin: ``MOEPOLICY_POLICY=policy.yaml vllm serve ...``.

vLLM calls :func:`register` early in every process it starts (API server, engine, each worker),
outside any ``try``. Without ``MOEPOLICY_POLICY`` it does nothing at all (no import, no patch): a
moepolicy installed but not asked for never changes vLLM. With the variable it installs the plugin's
classes where vLLM constructs its DeepEP managers and prepare/finalize objects, when vLLM first imports
its managers' module (only processes that build a manager do; see
:mod:`moepolicy.integrations.vllm.patches`); at each manager start the ranks vote over the manager's
CPU group's store and apply the policy only if every rank would apply the same one
(:mod:`moepolicy.integrations.vllm.vote`). Set the variable on every rank: a rank without it casts no
vote, and the others wait for it (``VOTE_TIMEOUT_S``, 2 minutes), then keep vLLM's behaviour as it does. A plugin that cannot apply the policy leaves vLLM as it is and says why in one line;
with ``MOEPOLICY_STRICT`` on it refuses to start instead.
"""

from __future__ import annotations

import os

POLICY_ENV = "MOEPOLICY_POLICY"
STRICT_ENV = "MOEPOLICY_STRICT"  # on: refuse to start instead of leaving vLLM's behaviour in place
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def strict_from_env(environ=None) -> bool:
    """``MOEPOLICY_STRICT``: 1/true/yes/on or 0/false/no/off (any case); anything else is refused."""
    from moepolicy.errors import UsageError

    raw = (os.environ if environ is None else environ).get(STRICT_ENV, "")
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    from moepolicy.integrations.vllm.report import safe

    raise UsageError(
        f"{STRICT_ENV}='{safe(raw)}' is not one of 1/true/yes/on or 0/false/no/off (any case); set one "
        "of them, or unset it"
    )


def register() -> None:
    """The ``vllm.general_plugins`` entry point."""
    path = os.environ.get(POLICY_ENV)
    if not path:
        return
    try:
        strict = strict_from_env()
    # an unknown spelling: refuse in one line (strict or not cannot be told)
    except Exception as exc:
        from moepolicy.integrations.vllm.report import warn

        warn(f"refused: {exc}")
        raise
    try:
        from moepolicy.integrations.vllm.patches import install_on_import

        install_on_import(path, strict=strict)
    except Exception as exc:  # noqa: BLE001 (vLLM does not guard its plugins: never take it down)
        if strict:
            raise
        from moepolicy.integrations.vllm.report import warn

        warn(f"not applied: {type(exc).__name__}: {exc}; vLLM runs as it is")
