"""The plugin's one line per process: what it applied, or why not."""

from __future__ import annotations

import logging
import os

log = logging.getLogger("moepolicy.vllm")


def say(message: str) -> None:
    line = f"moepolicy (vLLM plugin, pid {os.getpid()}): {message}"
    log.warning(line)
    if not log.handlers and not logging.getLogger().handlers:
        print(line, flush=True)
