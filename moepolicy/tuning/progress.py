"""Progress of a long tune as events on the ``moepolicy.tuning.progress`` logger: a phase starts
with its number of steps, then steps advance. The CLI draws a bar per phase (with ETA) from them;
a library caller sees nothing unless it adds a handler (records carry ``phase``/``total`` or
``advance`` attributes)."""

from __future__ import annotations

import logging

log = logging.getLogger("moepolicy.tuning.progress")
log.propagate = False  # events, not messages: the tuning logger's text handler must not print them


def phase(name: str, total: int) -> None:
    log.info(name, extra={"phase": name, "total": total})


def advance(steps: int = 1) -> None:
    log.info("", extra={"advance": steps})
