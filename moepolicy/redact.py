"""URLs and command lines made safe to print, log or write: passwords and secret parameters hidden.

A URL is read as the database layer will read it: with SQLAlchemy's own parser (``make_url``, which
optuna's RDB storage uses), so a query parameter it decodes to ``password`` (``?pass%77ord=``) is
hidden as ``password=`` is. A URL it cannot parse whole (a leading space, ``postgresql:/u:pw@h``
with one slash) is hidden whole, as is every URL when SQLAlchemy is not installed. SQLAlchemy is imported only when a URL is redacted (serving processes never do).
"""

from __future__ import annotations

import re
import shlex
from typing import Optional, Sequence
from urllib.parse import unquote

HIDDEN = "***"
# query parameters that carry a secret in database URLs (libpq, MySQL drivers, cloud tokens)
_SECRET_PARAMS = re.compile(
    r"(?i)^(password|passwd|pwd|pass|secret|token|access_token|api_key|apikey|sslpassword)$"
)
# a word that starts like a URL: a scheme and a colon (``postgresql:``, ``sqlite:``, ``u:`` of ``u:pw@h``)
_SCHEME = re.compile(r"^\s*([A-Za-z][A-Za-z0-9+.\-]*):")
_FILE_SCHEMES = {"journal"}  # moepolicy's own ``journal:PATH``: a file, no secret


def looks_like_url(word: str) -> bool:
    """True for a word that may be a URL with a secret: a scheme, a colon, and a ``/``, ``@`` or ``?``."""
    match = _SCHEME.match(word)
    return (
        match is not None
        and match.group(1).lower() not in _FILE_SCHEMES
        and any(c in word for c in "/@?")
    )


def _parsed(url: str):
    """SQLAlchemy's reading of ``url``; None where it cannot read it whole (or is not installed)."""
    try:
        from sqlalchemy.engine import make_url
    except ImportError:
        return None
    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001 (ArgumentError, ValueError: unparsable)
        return None
    host = parsed.host or ""
    if "@" in host:  # an unencoded '@' in the password: the host holds the rest of it
        rest, _, host = host.rpartition("@")
        parsed = parsed.set(password=f"{parsed.password or ''}@{rest}", host=host)
    if _misplaced_user(parsed):
        return None
    return parsed


def _misplaced_user(parsed) -> bool:
    """A URL whose user and password SQLAlchemy read as the database name (``postgresql:///u:pw@h/db``,
    three slashes), or whose "host" is no host name (an ``@`` in a query value): not the URL its writer meant. A SQLite database is a path, where ``@`` is a plain
    character unless the path starts as ``user:password@`` does."""
    database = parsed.database or ""
    if parsed.host and not re.fullmatch(r"[A-Za-z0-9._:\-]+", parsed.host):
        return True  # not a host name: what SQLAlchemy took for the host is the rest of a password or query
    if any(not re.fullmatch(r"[A-Za-z0-9_.\-]+", key) for key in parsed.query):
        return True  # not a parameter's name: the rest of a password that held '?'
    if (
        parsed.get_backend_name() == "sqlite"
    ):  # no server: a host is a mistyped path, and so is user info
        first = database.lstrip("/").split("/", 1)[0]
        return bool(parsed.host) or "@" in first or (":" in first and database != ":memory:")
    return any(c in database for c in "@:?&=")  # user info or a query read as the database's name


def _hidden_whole(url: str) -> str:
    match = _SCHEME.match(url)
    return f"{match.group(1)}:{HIDDEN}" if match else HIDDEN


def _secret_keys(parsed) -> list[str]:
    return [key for key in parsed.query if _SECRET_PARAMS.match(key)]


def redact_url(url: str) -> str:
    """``url`` with its password and password-like query parameters replaced by ``***``; a URL that
    SQLAlchemy cannot parse whole is hidden whole (its scheme kept); a password with an unencoded
    ``@`` is hidden up to the URL's last ``@``. A word that is not a URL (a file
    path, ``journal:studies.log``) is returned as it is, and so is a URL without a secret."""
    if not looks_like_url(url):
        return url
    parsed = _parsed(url)
    if parsed is None:
        return _hidden_whole(url)
    secrets = _secret_keys(parsed)
    if parsed.password is None and not secrets:
        return url
    query = {key: (HIDDEN if key in secrets else value) for key, value in parsed.query.items()}
    shown = parsed.set(query=query).render_as_string(hide_password=True)
    return shown.replace("%2A%2A%2A", HIDDEN)  # the query's *** as written, not %-encoded


def redact_command(argv: Sequence[str]) -> str:
    """A command line, shell-quoted, with every URL-looking word (or ``--flag=URL``) redacted."""
    words = []
    for word in argv:
        flag, eq, value = word.partition("=")
        if eq and flag.startswith("--") and looks_like_url(value):
            words.append(f"{flag}={redact_url(value)}")
        else:
            words.append(redact_url(word))
    return " ".join(shlex.quote(w) for w in words)


def redact_text(text: str, url: str) -> str:
    """An error message with any secret of ``url`` removed (drivers may echo the URL or its parts)."""
    for form in {url, url.strip()}:
        if form:
            text = text.replace(form, redact_url(url))
    for secret in sorted(_secrets(url), key=len, reverse=True):
        text = text.replace(secret, HIDDEN)
    return text


def _secrets(url: str) -> list[str]:
    """The secret strings in ``url``: its password and password-like query values, as written and
    as decoded (SQLAlchemy's reading and a plain split at the last ``@``, whichever is longer)."""
    if not looks_like_url(url):
        return []
    found: list[str] = []
    parsed = _parsed(url)
    if parsed is not None:
        found.append(parsed.password or "")
        for key in _secret_keys(parsed):
            value = parsed.query[key]
            found += list(value) if isinstance(value, tuple) else [value]
    found += _split_secrets(url)
    return sorted({s for s in found if s} | {unquote(s) for s in found if s})


def _split_secrets(url: str) -> list[str]:
    """The password between the user name and the *last* ``@``, and secret query values, by a plain split."""
    rest = (url.split("://", 1)[1] if "://" in url else url.split(":", 1)[1]).lstrip("/")
    found: list[str] = []
    at = rest.rfind("@")
    if at > 0 and not rest.startswith("/"):
        user, colon, password = rest[:at].partition(":")
        if colon and "/" not in user:
            found.append(password)
        rest = rest[at:]
    for item in rest.partition("?")[2].split("&"):
        key, _, value = item.partition("=")
        if _SECRET_PARAMS.match(unquote(key)):
            found.append(value)
    return found


def storage_url_problem(url: str) -> Optional[str]:
    """Why SQLAlchemy would read the database URL ``url`` otherwise than it is shown, or None."""
    if url != url.strip():
        return "the URL starts or ends with a space; remove it"
    try:
        from sqlalchemy.engine import make_url
    except ImportError:
        return None  # the storage says so when opened (the driver is missing)
    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001
        return "not a URL SQLAlchemy can read (a database URL is scheme://user:password@host/database)"
    if "@" in (parsed.host or ""):
        return (
            "the password holds an '@', which the database driver reads as the start of the host; "
            "write it as %40"
        )
    if _misplaced_user(parsed):
        return (
            "the host or database name holds user info or a query ('@', ':', '?', '&', '='): write "
            "scheme://user:password@host/database?key=value, with '@', '?' and '/' in a password as %40, %3F, %2F"
        )
    return None
