"""Reading inputs and choosing outputs safely: regular files only, reads bounded by bytes read.

Inputs: a device (``/dev/zero``), a FIFO or a socket is refused before it is read, and a read stops
one byte past its limit whatever size the file system reports. Outputs: a path is written only where
it is, or will be, a regular file in a writable folder; a symbolic link is written *through* (its
target is replaced atomically, the link stays a link), so ``policy.yaml -> v3.yaml`` updates v3.yaml.
Writes are atomic (a temporary file of this process beside the target, fsync, rename): two writers
of one path never touch each other's temporary file, and a killed writer's is removed by the next
writer of the same machine and PID namespace (the only one that can tell it is dead: a process id
means nothing on another host or in another container sharing the folder).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Optional, Type

from moepolicy.errors import MoePolicyError, OutputError


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def file_kind(path: str | os.PathLike) -> Optional[str]:
    """What ``path`` is (``a regular file``, ``a FIFO``, ``a device``, ``a folder``, ...), following
    links; None where nothing is there (or it cannot be looked at)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return "a regular file" if stat.S_ISREG(mode) else _kind(mode)


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """True when ``a`` and ``b`` name one file: the same resolved path (symbolic links followed), or
    the same device and inode (a hard link, a bind mount, a folder reached by two names)."""
    try:
        if os.path.realpath(a) == os.path.realpath(b):
            return True
        sa, sb = os.stat(a), os.stat(b)
    except (OSError, ValueError):
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def read_bounded(path: str | os.PathLike, limit: int, error: Type[MoePolicyError]) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them; else ``error`` with one line."""
    try:
        fd = os.open(
            path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
        )  # a FIFO must not block the open
    except OSError as exc:
        if exc.errno == errno.EISDIR:
            raise error(f"{path}: is a folder, not a file") from None
        raise error(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise error(f"{path}: is {_kind(mode)}, not a regular file; give a file")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise error(f"{path}: cannot be read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if size > limit:
        raise error(f"{path}: larger than {limit} bytes, more than any such file holds")
    return b"".join(chunks)


def write_target(path: str | os.PathLike, what: str = "the policy") -> Path:
    """The file a write of ``path`` replaces (a link's target), checked writable; else :class:`OutputError`."""
    p = Path(path)
    target = Path(os.path.realpath(p)) if p.is_symlink() else p
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise OutputError(f"{path}: cannot be written ({exc.strerror or exc})") from None
    if mode is not None and not stat.S_ISREG(mode):
        raise OutputError(f"{path}: is {_kind(mode)}; write {what} to a file path")
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise OutputError(f"{path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"{path}: the folder {folder} is not writable")
    if mode is not None and not os.access(target, os.W_OK) and os.geteuid() != 0:
        raise OutputError(f"{path}: the file is read-only")
    return target


def atomic_write(path: str | os.PathLike, text: str) -> None:
    """Replace the regular file ``path`` (a link's target) with ``text`` atomically, or raise
    :class:`~moepolicy.errors.OutputError` with one line and leave the previous file as it was.

    The temporary file's name is unique and says who writes it: a random part, this machine and
    PID namespace (:func:`writer_id`) and this process's id (``.policy.yaml.k3j9x.3f2a9c01b7e4.4242.tmp``):
    another writer of the same path never removes it while this process lives, wherever it runs;
    temporaries of writers of this machine and namespace that died (kill -9) are removed after a
    write."""
    import tempfile

    target = write_target(path)
    directory = target.parent if str(target.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(
            prefix=f".{target.name}.", suffix=f".{writer_id()}.{os.getpid()}.tmp", dir=directory
        )
    except OSError as exc:
        raise OutputError(f"{path}: cannot be written ({exc.strerror or exc})") from None
    try:
        os.chmod(tmp, 0o666 & ~_umask())
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise OutputError(
                f"{path}: cannot be written ({exc.strerror or exc}); the previous file is kept"
            ) from None
        raise
    remove_stale_temps(directory, target.name)


STALE_AGE_S = 3600  # a temporary file without a writer's id (older moepolicy) is stale after this


def writer_id() -> str:
    """This machine and PID namespace, as 12 hex digits (a hash of the host name and the namespace's
    inode): a process id can be checked only by a writer with the same one."""
    import hashlib
    import socket

    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:  # no /proc (another system): the host name alone
        namespace = ""
    return hashlib.sha256(f"{socket.gethostname()}\0{namespace}".encode()).hexdigest()[:12]


def remove_stale_temps(directory: Path, name: str) -> None:
    """Temporary files of writers of ``name`` that died mid-write (kill -9 leaves them behind): only
    those of this machine and PID namespace whose process is gone, never one of a live writer nor
    one written elsewhere (another host, another container), whose process cannot be checked here.
    A temporary without a writer's id (older moepolicy) is removed once it is an hour old."""
    import time

    mine, prefix = writer_id(), f".{name}."
    for stale in directory.glob(f".{name}.*.tmp"):
        parts = stale.name[len(prefix) : -len(".tmp")].split(".")
        try:
            if len(parts) == 3:  # random part, writer id, process id
                dead = parts[1] == mine and _is_pid(parts[2]) and not _alive(int(parts[2]))
            elif len(parts) == 2:  # random part, process id: whose namespace is unknown
                dead = time.time() - stale.stat().st_mtime > STALE_AGE_S
            else:  # another file's temporary (``name.bak``'s), or not one of ours
                dead = False
            if dead:
                stale.unlink()
        except OSError:
            pass


def _is_pid(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
