"""Reading inputs and choosing outputs safely: regular files only, reads bounded by bytes read.

Inputs: a device (``/dev/zero``), a FIFO or a socket is refused before it is read, and a read stops
one byte past its limit whatever size the file system reports. Outputs: a path is written only where
it is, or will be, a regular file in a writable folder; a symbolic link is written *through* (its
target is replaced atomically, the link stays a link), so ``policy.yaml -> v3.yaml`` updates v3.yaml.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Type

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


def read_bounded(path: str | os.PathLike, limit: int, error: Type[MoePolicyError]) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them; else ``error`` with one line."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO must not block the open
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


def write_target(path: str | os.PathLike) -> Path:
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
        raise OutputError(f"{path}: is {_kind(mode)}; write the policy to a file path")
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise OutputError(f"{path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"{path}: the folder {folder} is not writable")
    if mode is not None and not os.access(target, os.W_OK) and os.geteuid() != 0:
        raise OutputError(f"{path}: the file is read-only")
    return target
