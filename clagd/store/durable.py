"""Durable file writes: fsync of files and folders, atomic replace (the one syncfs(2) per
commit is `clagd.libc.syncfs`).

These are the primitives behind the store's crash safety (see docs/robustness.md): a file is
either the old or the new version after a crash, never a torn one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


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


def atomic_write_text(
    path: Path, text: str, sync_dir: bool = True, fsync: bool = True, make_dir: bool = False
) -> None:
    """Temp file in the same folder, fsync, rename, fsync the folder: all or nothing.

    `fsync=False` leaves flushing to the caller (the writer flushes a whole commit's files
    with one `syncfs`, and its transaction marker covers a crash before that). `make_dir`:
    a folder removed before or while writing is made again (a memory folder)."""
    path = Path(path)
    for attempt in (1, 2):
        try:
            _write_and_replace(path, text, fsync)
            break
        except FileNotFoundError:
            # the folder was removed (`rm -rf unsorted`, a committed `git rm -r`, `git
            # clean`), before or while writing: made again, and the file written again
            if not make_dir or attempt == 2 or path.parent.exists():
                raise
            path.parent.mkdir(parents=True, exist_ok=True)
    if sync_dir:
        fsync_dir(path.parent)


def _write_and_replace(path: Path, text: str, fsync: bool) -> None:
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
