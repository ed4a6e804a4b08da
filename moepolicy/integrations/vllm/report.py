"""The plugin's log lines, in vLLM's logging: the ``vllm.moepolicy`` logger (a child of vLLM's
``vllm`` logger, so vLLM's handler, format and ``VLLM_LOGGING_LEVEL`` apply, and nothing is printed
twice), made with vLLM's ``init_logger`` where vLLM is importable. One summary line per process and
start at INFO, refusals at WARNING, details at DEBUG. Every message is escaped: text that comes from
a policy or a model (names, reasons) cannot put terminal control sequences, bidirectional overrides
or line breaks into the log.
"""

from __future__ import annotations

import logging
import re
import threading

from moepolicy.text import printable

LOGGER_NAME = "vllm.moepolicy"
PREFIX = "moepolicy: "
# beyond moepolicy.text's set: the bidi marks and the BOM, and line breaks (a log line stays one line)
_MORE = re.compile(r"[\u200e\u200f\u061c\ufeff\n\t]")

_logger = None
_SAID: set[tuple[int, str]] = set()
_LOCK = threading.Lock()


def logger() -> logging.Logger:
    global _logger
    if _logger is None:
        try:
            from vllm.logger import init_logger

            _logger = init_logger(LOGGER_NAME)
        except Exception:  # noqa: BLE001 (vLLM absent or broken: a plain logger of the same name)
            _logger = logging.getLogger(LOGGER_NAME)
    return _logger


def safe(text: object) -> str:
    """``text`` for one log line: control and bidi characters escaped (``\\x1b``, ``\\u202e``), line breaks too."""
    return _MORE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), printable(text))


def say(message: str, level: int = logging.INFO) -> None:
    logger().log(level, "%s", PREFIX + safe(message))


def warn(message: str) -> None:
    say(message, logging.WARNING)


def debug(message: str) -> None:
    lg = logger()
    if lg.isEnabledFor(logging.DEBUG):
        lg.debug("%s", PREFIX + safe(message))


def say_once(key: int, message: str, level: int = logging.INFO) -> bool:
    """``say`` unless this start (``key``) already said ``message``; whether it was said."""
    with _LOCK:
        if (key, message) in _SAID:
            return False
        _SAID.add((key, message))
    say(message, level)
    return True
