"""optuna storages from a URL (``redact`` hides their secrets wherever they are shown)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from moepolicy.errors import TuningError
from moepolicy.redact import redact_text, redact_url, storage_url_problem

RDB_SCHEMES = ("sqlite", "postgresql", "mysql")


def storage_file(url: str) -> Optional[Path]:
    """The file a storage URL reads and writes (a SQLite database, a journal), or None (a server)."""
    if url.endswith(".log") or url.startswith("journal:"):
        return Path(url.removeprefix("journal:"))
    if not url.startswith("sqlite:"):
        return None
    try:
        from sqlalchemy.engine import make_url

        database = make_url(url).database
    except Exception:  # noqa: BLE001 (unparsable: check_storage refuses it)
        database = (
            url.removeprefix("sqlite:///").split("?", 1)[0]
            if url.startswith("sqlite:///")
            else None
        )
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database)


def check_storage(url: str) -> None:
    """Refuse, before any work: a URL that is neither an optuna RDB URL nor a journal file; a database
    URL that the driver would read otherwise than it is shown (:func:`moepolicy.redact.storage_url_problem`);
    a storage file in a folder that does not exist, or that is a FIFO, a device or a folder (opening a
    FIFO would block the tune forever)."""
    from moepolicy.files import file_kind

    scheme = url.strip().split(":", 1)[0].split("+", 1)[0]
    is_journal = url.endswith(".log") or url.startswith("journal:")
    if not is_journal and scheme not in RDB_SCHEMES:
        raise TuningError(
            f"storage {redact_url(url)!r}: expected an optuna RDB URL (sqlite:///FILE, postgresql://, "
            "mysql://) or a journal file (*.log)",
            field="storage",
        )
    problem = None if is_journal else storage_url_problem(url)
    if problem:
        raise TuningError(f"storage {redact_url(url)}: {problem}", field="storage")
    path = storage_file(url)
    if path is None:
        return
    if not path.parent.is_dir():
        raise TuningError(
            f"storage {redact_url(url)}: the folder {path.parent} does not exist", field="storage"
        )
    kind = file_kind(path)
    if kind not in (None, "a regular file"):
        raise TuningError(
            f"storage {redact_url(url)}: {path} is {kind}, not a database file; give a file path",
            field="storage",
        )


class StorageFailed(TuningError):
    """The study database failed while a tune wrote to it (a full disk, a lost server): the tune
    stops, keeps what it measured (a partial result) and says what failed in one line."""

    def __init__(self, message: str, cause: str):
        super().__init__(message, field="storage")
        self.cause = cause


def storage_failure(exc: BaseException, url: str) -> Optional[StorageFailed]:
    """``exc`` as a :class:`StorageFailed` when it came from the study database (optuna's storage
    errors, SQLAlchemy's, the sqlite3 or PostgreSQL driver's, a full disk under a journal), else None."""
    import errno

    if isinstance(exc, StorageFailed):
        return exc
    if isinstance(exc, (KeyboardInterrupt, TuningError)):
        return None
    chain, seen = [], exc
    while seen is not None and len(chain) < 20:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    storage_kinds = (
        "StorageInternalError",
        "OperationalError",
        "DatabaseError",
        "InterfaceError",
        "DiskFull",
    )
    from_storage = [
        e
        for e in chain
        if type(e).__name__ in storage_kinds
        or (
            isinstance(e, OSError)
            and e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC), errno.EROFS)
        )
    ]
    if not from_storage:
        return None
    root = chain[-1]
    cause = redact_text(
        " ".join(str(getattr(root, "orig", None) or root).split()) or type(root).__name__, url
    )
    cause = cause.split(" [SQL:", 1)[0]
    return StorageFailed(
        f"storage {redact_url(url)}: the study database failed during the tune ({cause}); the trials "
        "it stored are kept: fix it (free space, restart the server) and run the same command to "
        "resume",
        cause,
    )


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
        problem = storage_url_problem(url)
        if problem:
            raise TuningError(f"storage {redact_url(url)}: {problem}", field="storage")
        try:
            return _rdb_with_retry(url)
        except ImportError:
            raise TuningError(
                f"storage {redact_url(url)}: the database driver is not installed "
                "(PostgreSQL: pip install 'psycopg[binary]'; MySQL: pip install pymysql)"
            ) from None
        except Exception as exc:  # noqa: BLE001 (sqlalchemy's errors: connection refused, bad URL)
            reason = redact_text(str(exc).splitlines()[0], url) if str(exc) else type(exc).__name__
            raise TuningError(
                f"storage {redact_url(url)}: cannot open the study database ({reason})"
            ) from None
    raise TuningError(
        f"storage {redact_url(url)!r}: expected an optuna RDB URL (sqlite, postgresql, "
        "mysql) or a journal file (*.log)"
    )


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
