"""Durable file writes: fsync of files and folders, atomic replace (the one syncfs(2) per
commit is `clagd.libc.syncfs`).

These are the primitives behind the store's crash safety (see docs/robustness.md): a file is
either the old or the new version after a crash, never a torn one."""

from __future__ import annotations

import itertools
import os
import stat
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from clagd.libc import rename_exchange


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


class Trash:
    """Where the writer's files go when a new version replaces them or they are removed, to
    be unlinked later by `empty()` off the writer's hold (issue 26).

    ext4 frees an inode's blocks inside the rename(2) that replaces it or the unlink(2) that
    removes it, and that took 1-3 ms a file here at 11k clusters (journal and bitmap work
    on a virtio disk): 40-140 ms of a route slice's 40-file commit. So the new file is
    swapped in with RENAME_EXCHANGE (atomic as a rename is: any reader finds the old file or
    the new one, never none, and no name ever has two links), the old one, now at the
    temporary name, is moved in here, and the unlinks happen on the writer's reaper thread
    after the commit. Where the exchange is not available (not Linux, another filesystem)
    or `path` is not a regular file, `os.replace` as before. The folder is emptied at
    start-up (what a crash left) and right after a forget (no copy stays)."""

    def __init__(self, folder: Path, on_thread_start: Callable[[], None] | None = None) -> None:
        self.folder = folder
        self._names = itertools.count()
        self._reaper = ThreadPoolExecutor(1, "clagd-writer-reap", on_thread_start)
        self._reaping = threading.Event()  # set while an `empty` is queued

    def reap_soon(self) -> None:
        """`empty()` on the reaper thread (one queued at most)."""
        if self._reaping.is_set():
            return
        self._reaping.set()

        def empty() -> None:
            self._reaping.clear()  # what a later commit moves in gets its own run
            self.empty()

        try:
            self._reaper.submit(empty)
        except RuntimeError:  # closed: `close` emptied it
            self._reaping.clear()

    def close(self) -> None:
        """Stop the reaper thread, then empty the trash here."""
        self._reaper.shutdown(wait=True)
        self.empty()

    def replace(self, tmp: Path, path: Path) -> None:
        """`os.replace(tmp, path)`, the old file at `path` kept here for `empty()`."""
        try:
            swapped = stat.S_ISREG(os.lstat(path).st_mode) and rename_exchange(tmp, path)
        except FileNotFoundError:
            swapped = False  # nothing there (or removed since the lstat: a person's rm)
        if not swapped:
            os.replace(tmp, path)
            return
        self.keep(tmp)  # the old version, at the temporary name now

    def remove(self, path: Path) -> None:
        """Remove `path` (if there): moved here for `empty()`."""
        if os.path.lexists(path):
            self.keep(path)

    def keep(self, path: Path) -> None:
        """Move `path` in here; unlink it at once where that cannot be done (the folder on
        another filesystem, or not made)."""
        target = self.folder / f"{os.getpid()}-{next(self._names)}"
        try:
            os.rename(path, target)
            return
        except FileNotFoundError:
            if not os.path.lexists(path):
                return  # removed meanwhile (a person's git clean)
            try:  # the folder is missing (`git clean -fdx` of .clagd/)
                self.folder.mkdir(parents=True, exist_ok=True)
                os.rename(path, target)
                return
            except OSError:
                pass
        except OSError:
            pass
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def empty(self) -> int:
        """Unlink everything in here; how many files."""
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return 0
        done = 0
        for name in names:
            try:
                os.unlink(self.folder / name)
                done += 1
            except FileNotFoundError:
                pass
        return done


def atomic_write_text(
    path: Path,
    text: str,
    sync_dir: bool = True,
    fsync: bool = True,
    make_dir: bool = False,
    trash: Trash | None = None,
) -> None:
    """Temp file in the same folder, fsync, rename, fsync the folder: all or nothing.

    `fsync=False` leaves flushing to the caller (the writer flushes a whole commit's files
    with one `syncfs`, and its transaction marker covers a crash before that). `make_dir`:
    a folder removed before or while writing is made again (a memory folder). `trash`: the
    old file goes there instead of being freed now (`Trash`)."""
    path = Path(path)
    for attempt in (1, 2):
        try:
            _write_and_replace(path, text, fsync, trash)
            break
        except FileNotFoundError:
            # the folder was removed (`rm -rf unsorted`, a committed `git rm -r`, `git
            # clean`), before or while writing: made again, and the file written again
            if not make_dir or attempt == 2 or path.parent.exists():
                raise
            path.parent.mkdir(parents=True, exist_ok=True)
    if sync_dir:
        fsync_dir(path.parent)


def _write_and_replace(path: Path, text: str, fsync: bool, trash: Trash | None) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix="." + path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        if trash is None:
            os.replace(tmp, path)
        else:
            trash.replace(Path(tmp), path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
