"""Durable file writes: fsync of files and folders, one syncfs(2) per commit, atomic replace.

These are the primitives behind the store's crash safety (see docs/robustness.md): a file is
either the old or the new version after a crash, never a torn one."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import tempfile
from pathlib import Path
from typing import Any


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    """fsync a file that may have been removed meanwhile."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def syncfs(path: Path) -> bool:
    """Flush the whole filesystem holding `path` in one call (Linux syncfs(2)); False where
    that is not available, and the caller must fsync file by file."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            _libc.syncfs  # noqa: B018 - raises AttributeError where there is no syncfs
        except (OSError, AttributeError):
            _libc = False
    if not _libc:
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        return bool(_libc.syncfs(fd) == 0)
    finally:
        os.close(fd)


_libc: Any = None


def atomic_write_text(path: Path, text: str, sync_dir: bool = True, fsync: bool = True) -> None:
    """Temp file in the same folder, fsync, rename, fsync the folder: all or nothing.

    `fsync=False` leaves flushing to the caller (the writer flushes a whole commit's files
    with one `syncfs`, and its transaction marker covers a crash before that)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix="." + path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if sync_dir:
        fsync_dir(path.parent)
