"""optuna storages from a URL, and URLs made safe to print, log or write (passwords hidden)."""

from __future__ import annotations

import re
import shlex
from typing import Sequence

from moepolicy.errors import TuningError

HIDDEN = "***"
# query parameters that carry a secret in database URLs (libpq, MySQL drivers, cloud tokens)
_SECRET_PARAMS = re.compile(r"(?i)^(password|passwd|pwd|pass|secret|token|access_token|api_key|apikey|sslpassword)$")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")


def redact_url(url: str) -> str:
    """``url`` with its password and password-like query parameters replaced by ``***``.

    The user information ends at the *last* ``@`` before the query (RFC 3986), so a password that
    holds ``@`` or ``:`` is hidden whole (SQLAlchemy's parser would split it at the first ``@``).
    A file path or other word without a scheme is returned as it is.
    """
    if not _URL.match(url):
        return url
    scheme, rest = url.split("://", 1)
    head, q, query = rest.partition("?")
    at = head.rfind("@")
    if at > 0 and not head.startswith("/"):
        user, colon, _ = head[:at].partition(":")
        if colon:
            head = f"{user}:{HIDDEN}{head[at:]}"
    if q:
        parts = []
        for item in query.split("&"):
            key, eq, _ = item.partition("=")
            parts.append(f"{key}={HIDDEN}" if eq and _SECRET_PARAMS.match(key) else item)
        query = "&".join(parts)
    return f"{scheme}://{head}{q}{query}"


def redact_command(argv: Sequence[str]) -> str:
    """A command line, shell-quoted, with every URL-looking word (or ``--flag=URL``) redacted."""
    words = []
    for word in argv:
        flag, eq, value = word.partition("=")
        if eq and flag.startswith("--") and _URL.match(value):
            words.append(f"{flag}={redact_url(value)}")
        else:
            words.append(redact_url(word))
    return " ".join(shlex.quote(w) for w in words)


def make_storage(url: str):
    """An optuna storage: an RDB URL (sqlite, postgresql, mysql) or a journal file (``*.log``)."""
    import warnings

    import optuna

    # ask/tell with our own heartbeat thread is the point; optuna's experimental notes are noise here
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")

    if url.endswith(".log") or url.startswith("journal:"):
        path = url.removeprefix("journal:")
        return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(path))
    if url.startswith(("sqlite", "postgresql", "mysql")):
        try:
            return _rdb_with_retry(url)
        except ImportError:
            raise TuningError(f"storage {redact_url(url)}: the database driver is not installed "
                              "(PostgreSQL: pip install 'psycopg[binary]'; MySQL: pip install pymysql)") from None
        except Exception as exc:  # noqa: BLE001 (sqlalchemy's errors: connection refused, bad URL)
            reason = _redact_text(str(exc).splitlines()[0], url) if str(exc) else type(exc).__name__
            raise TuningError(f"storage {redact_url(url)}: cannot open the study database ({reason})") from None
    raise TuningError(f"storage {redact_url(url)!r}: expected an optuna RDB URL (sqlite, postgresql, "
                      "mysql) or a journal file (*.log)")


def _redact_text(text: str, url: str) -> str:
    """An error message with any secret of ``url`` removed (drivers may echo the URL or its parts)."""
    text = text.replace(url, redact_url(url))
    for secret in _secrets(url):
        text = text.replace(secret, HIDDEN)
    return text


def _secrets(url: str) -> list[str]:
    """The secret strings in ``url`` (its password, password-like query values)."""
    if not _URL.match(url):
        return []
    head, _, query = url.split("://", 1)[1].partition("?")
    found = []
    at = head.rfind("@")
    if at > 0 and not head.startswith("/"):
        found.append(head[:at].partition(":")[2])
    for item in query.split("&"):
        key, _, value = item.partition("=")
        if _SECRET_PARAMS.match(key):
            found.append(value)
    return [s for s in found if s]


def _rdb_with_retry(url: str, attempts: int = 6):
    """Workers that start together race to create optuna's tables; the loser retries."""
    import random
    import time

    import optuna

    for attempt in range(attempts):
        try:
            return optuna.storages.RDBStorage(url, heartbeat_interval=10, grace_period=60)
        except ImportError:
            raise
        except Exception:  # noqa: BLE001
            if attempt == attempts - 1:
                raise
            time.sleep(0.2 + random.random() * 0.5 * (attempt + 1))
    raise AssertionError("unreachable")
