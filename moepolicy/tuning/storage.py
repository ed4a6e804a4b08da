"""optuna storages from a URL (``redact`` hides their secrets wherever they are shown)."""

from __future__ import annotations

from typing import Optional

from moepolicy.errors import TuningError
from moepolicy.redact import redact_text, redact_url

def check_storage(url: str) -> None:
    """Refuse, before any work, a file storage whose folder does not exist, and a database URL
    that the driver would read otherwise than it is shown (see :func:`ambiguous_password`)."""
    from pathlib import Path

    problem = ambiguous_password(url)
    if problem:
        raise TuningError(f"storage {redact_url(url)}: {problem}", field="storage")
    if url.endswith(".log") or url.startswith("journal:"):
        path = url.removeprefix("journal:")
    elif url.startswith("sqlite:///"):
        path = url.removeprefix("sqlite:///").split("?", 1)[0]
    else:
        return
    folder = Path(path).parent
    if path and not folder.is_dir():
        raise TuningError(f"storage {redact_url(url)}: the folder {folder} does not exist", field="storage")


def ambiguous_password(url: str) -> Optional[str]:
    """Why a database URL's password would reach the driver wrong, or None.

    An ``@`` in a password must be written ``%40``: SQLAlchemy's own parser (``make_url``, which
    optuna's RDB storage uses) splits the URL at the first ``@``, so the rest of the password would
    be taken for the host, sent to a name server and echoed in the driver's error message.
    """
    if not url.startswith(("sqlite", "postgresql", "mysql")):
        return None
    try:
        from sqlalchemy.engine import make_url

        host = make_url(url).host or ""
    except Exception:  # noqa: BLE001 (not a URL SQLAlchemy reads: the storage says so when opened)
        return None
    if "@" in host:
        return "the password holds an '@', which the database driver reads as the start of the host; write it as %40"
    return None


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
        problem = ambiguous_password(url)
        if problem:
            raise TuningError(f"storage {redact_url(url)}: {problem}", field="storage")
        try:
            return _rdb_with_retry(url)
        except ImportError:
            raise TuningError(f"storage {redact_url(url)}: the database driver is not installed "
                              "(PostgreSQL: pip install 'psycopg[binary]'; MySQL: pip install pymysql)") from None
        except Exception as exc:  # noqa: BLE001 (sqlalchemy's errors: connection refused, bad URL)
            reason = redact_text(str(exc).splitlines()[0], url) if str(exc) else type(exc).__name__
            raise TuningError(f"storage {redact_url(url)}: cannot open the study database ({reason})") from None
    raise TuningError(f"storage {redact_url(url)!r}: expected an optuna RDB URL (sqlite, postgresql, "
                      "mysql) or a journal file (*.log)")


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
