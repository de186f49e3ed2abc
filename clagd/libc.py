"""The four C library calls clagd makes through ctypes, with the library loaded once:
`syncfs(2)` (one flush per commit, store/durable.py), `renameat2(2)` with RENAME_EXCHANGE
(a file's old version kept out of the writer's hold, store/durable.py `Trash`), glibc's
`malloc_trim` (the heap freed by a full load handed back to the system, serve/daemon.py)
and `prctl(2)` PR_SET_PDEATHSIG (a loader process dies with the daemon, engine/loader.py).
All are optional: where the C library or the filesystem lacks them, the callers take their
slower or larger path."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os
import signal
from pathlib import Path


@functools.cache
def libc() -> ctypes.CDLL | None:
    """The process's C library (with errno kept for the caller), or None where none loads."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


def syncfs(path: Path) -> bool:
    """Flush the whole filesystem holding `path` in one call (Linux syncfs(2)); False where
    that is not available or fails, and the caller must fsync file by file."""
    fn = getattr(libc(), "syncfs", None)
    if fn is None:
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        return bool(fn(fd) == 0)
    finally:
        os.close(fd)


AT_FDCWD = -100
RENAME_EXCHANGE = 2  # linux/fs.h


def rename_exchange(a: Path, b: Path) -> bool:
    """Swap the files at `a` and `b` in one atomic step (renameat2 RENAME_EXCHANGE): each
    name then holds what the other held. False where the C library, the kernel or the
    filesystem cannot (the caller takes `os.replace`); OSError for anything else (e.g. one
    of them is missing)."""
    fn = getattr(libc(), "renameat2", None)
    if fn is None:
        return False
    if fn(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def malloc_trim() -> bool:
    """Give the free heap back to the system (glibc's malloc_trim(0)); False where there is
    no glibc or nothing was released."""
    fn = getattr(libc(), "malloc_trim", None)
    return bool(fn(0)) if fn is not None else False


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent: int) -> None:
    """This (child) process is killed when `parent` ends (Linux PR_SET_PDEATHSIG, SIGKILL;
    strictly, when the thread of `parent` that forked it does); it exits at once when
    `parent` is gone already. Where prctl is missing, nothing happens."""
    fn = getattr(libc(), "prctl", None)
    if fn is not None:
        fn(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)
