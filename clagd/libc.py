"""The two C library calls clagd makes through ctypes, with the library loaded once:
`syncfs(2)` (one flush per commit, store/durable.py) and glibc's `malloc_trim` (the heap
freed by a full load handed back to the system, serve/daemon.py). Both are optional: where
the C library lacks them, the callers take their slower or larger path."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
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


def malloc_trim() -> bool:
    """Give the free heap back to the system (glibc's malloc_trim(0)); False where there is
    no glibc or nothing was released."""
    fn = getattr(libc(), "malloc_trim", None)
    return bool(fn(0)) if fn is not None else False
