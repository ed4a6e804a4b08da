"""URLs and command lines made safe to print, log or write: passwords and secret parameters hidden."""

from __future__ import annotations

import re
import shlex
from urllib.parse import unquote
from typing import Sequence

HIDDEN = "***"
# query parameters that carry a secret in database URLs (libpq, MySQL drivers, cloud tokens)
_SECRET_PARAMS = re.compile(r"(?i)^(password|passwd|pwd|pass|secret|token|access_token|api_key|apikey|sslpassword)$")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")


def redact_url(url: str) -> str:
    """``url`` with its password and password-like query parameters replaced by ``***``.

    Everything between the user name and the *last* ``@`` of the URL is the password, so one that
    holds ``@``, ``:``, ``/`` or ``?`` is hidden whole (SQLAlchemy's parser would split it at the first
    ``@``; a query value with an ``@`` is then hidden too, which is the safe side). A file path or
    another word without a scheme is returned as it is.
    """
    if not _URL.match(url):
        return url
    scheme, rest = url.split("://", 1)
    at = rest.rfind("@")
    if at > 0 and not rest.startswith("/"):
        user, colon, _ = rest[:at].partition(":")
        if colon and "/" not in user:
            rest = f"{user}:{HIDDEN}{rest[at:]}"
    head, q, query = rest.partition("?")
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


def redact_text(text: str, url: str) -> str:
    """An error message with any secret of ``url`` removed (drivers may echo the URL or its parts)."""
    text = text.replace(url, redact_url(url))
    for secret in _secrets(url):
        text = text.replace(secret, HIDDEN)
    return text


def _secrets(url: str) -> list[str]:
    """The secret strings in ``url`` (its password, password-like query values)."""
    if not _URL.match(url):
        return []
    rest = url.split("://", 1)[1]
    found = []
    at = rest.rfind("@")
    if at > 0 and not rest.startswith("/"):
        user, colon, password = rest[:at].partition(":")
        if colon and "/" not in user:
            found += [password, unquote(password)]  # drivers may echo the decoded form
        rest = rest[at:]
    for item in rest.partition("?")[2].split("&"):
        key, _, value = item.partition("=")
        if _SECRET_PARAMS.match(key):
            found += [value, unquote(value)]
    return [s for s in found if s]
