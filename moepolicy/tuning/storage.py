"""optuna storages from a URL (``redact`` hides their secrets wherever they are shown)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from moepolicy.errors import TuningError
from moepolicy.redact import redact_text, redact_url, storage_url_problem
from moepolicy.files import file_kind

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
    chain: list[BaseException] = []
    seen: Optional[BaseException] = exc
    while seen is not None and len(chain) < 20:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    storage_kinds = (
        "StorageUnresponsive",
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
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(path))
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
    """Workers that start together race to create optuna's tables; the loser retries. The storage's
    connections are watched (:class:`StallWatch`)."""
    import random
    import time

    import optuna

    for attempt in range(attempts):
        try:
            storage = optuna.storages.RDBStorage(
                url,
                heartbeat_interval=10,
                grace_period=60,
                engine_kwargs=_engine_kwargs(url),
            )
            StallWatch(url).attach(storage.engine)
            return storage
        except ImportError:
            raise
        except Exception:  # noqa: BLE001
            if attempt == attempts - 1:
                raise
            time.sleep(0.2 + random.random() * 0.5 * (attempt + 1))
    raise AssertionError("unreachable")


CONNECT_TIMEOUT_S = 15  # a server that accepts the connection but never answers it


def _engine_kwargs(url: str) -> dict:
    """A database server is given a time to answer a new connection (libpq's and PyMySQL's
    ``connect_timeout``), unless the URL sets one."""
    scheme = url.strip().split(":", 1)[0].split("+", 1)[0]
    if scheme not in ("postgresql", "mysql"):
        return {}
    from sqlalchemy.engine import make_url

    if "connect_timeout" in make_url(url).query:
        return {}
    return {"connect_args": {"connect_timeout": CONNECT_TIMEOUT_S}}


class StorageUnresponsive(Exception):
    """The study database did not answer (a stopped server, a lost network): once it is said, every
    new use of the storage fails at once rather than wait again, until the database answers
    (:func:`storage_failure` reads it as the storage failing)."""


class StallWatch:
    """Says when the study database does not answer: a connection held by one storage call for
    ``SAY_AFTER_S`` (optuna's calls take milliseconds) is a server that stopped answering. The tune
    is told in one line (it waits; Ctrl-C ends it), and, until the database answers again, a call
    that needs another connection fails at once (:class:`StorageUnresponsive`) instead of waiting
    too, so an interrupted tune ends with what it measured."""

    SAY_AFTER_S = 20.0

    def __init__(self, url: str):
        import threading

        self.url = url
        self._held: dict[int, float] = {}  # a checked-out connection -> since when
        self._lock = threading.Lock()
        self._stalled_since: Optional[float] = None
        self._watcher: Optional[threading.Thread] = None

    def attach(self, engine) -> None:
        from sqlalchemy import event

        event.listen(engine, "do_connect", self._connecting)  # before a new connection waits
        event.listen(engine.pool, "checkout", self._checkout)
        event.listen(engine.pool, "checkin", self._checkin)
        event.listen(engine, "after_cursor_execute", self._answered)

    def _refuse_while_stalled(self) -> None:
        import time

        if self._stalled_since is not None:
            raise StorageUnresponsive(
                f"no answer for {time.monotonic() - self._stalled_since:.0f} s: a stopped server "
                "or a lost network"
            )

    def _connecting(self, *args) -> None:
        with self._lock:
            self._refuse_while_stalled()

    def _checkout(self, dbapi_connection, record, proxy) -> None:
        import threading
        import time

        with self._lock:
            self._refuse_while_stalled()
            self._held[id(record)] = time.monotonic()
            if self._watcher is None:
                self._watcher = threading.Thread(
                    target=self._watch, name="moepolicy-storage-watch", daemon=True
                )
                self._watcher.start()

    def _checkin(self, dbapi_connection, record) -> None:
        with self._lock:
            self._held.pop(id(record), None)

    def _answered(self, *args) -> None:
        """A statement got its answer: the database answers (again)."""
        import time

        with self._lock:
            if self._stalled_since is None:
                return
            waited = time.monotonic() - self._stalled_since
            self._stalled_since = None
        _log().warning(
            "storage %s: the study database answered again after %.0f s",
            redact_url(self.url),
            waited,
        )

    def _watch(self) -> None:
        import time

        while True:
            time.sleep(1.0)
            with self._lock:
                oldest = min(self._held.values(), default=None)
                if oldest is None or self._stalled_since is not None:
                    continue
                if time.monotonic() - oldest < self.SAY_AFTER_S:
                    continue
                self._stalled_since = oldest
                waited = time.monotonic() - oldest
            _log().warning(
                "storage %s: the study database has not answered for %.0f s (a stopped server or a "
                "lost network); the tune waits for it, Ctrl-C ends it (the trials stored are kept)",
                redact_url(self.url),
                waited,
            )


def _log():
    import logging

    return logging.getLogger("moepolicy.tuning")
