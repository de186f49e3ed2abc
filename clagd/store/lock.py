"""One daemon per store: the single-writer lock, `.git/clagd.lock`."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from clagd.errors import StoreLocked
from clagd.store.gitcmd import git_dir

LOCK_FILE = "clagd.lock"  # in .git/: `git clean -fdx` and `rm -rf .clagd` leave it alone
_HELD: set[int] = set()  # the lock files this process holds (`close_inherited`)


class StoreLock:
    """One daemon per store: an flock on `.git/clagd.lock`. The kernel drops it when the
    process dies, so a lock left by a killed daemon never blocks a restart; and it lives in
    `.git/`, which no cleaning of the working tree removes, so a second daemon can never
    start beside a running one whose runtime folder was deleted."""

    def __init__(self, store: Path) -> None:
        self.path = git_dir(Path(store)) / LOCK_FILE
        self.fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                other = os.read(fd, 32).decode().strip()
            except OSError:
                other = "?"
            os.close(fd)
            raise StoreLocked(
                f"another clagd daemon (pid {other or '?'}) is running on this store"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        _HELD.add(fd)

    def release(self) -> None:
        if self.fd is not None:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            finally:
                _HELD.discard(self.fd)
                os.close(self.fd)
                self.fd = None


def close_inherited() -> None:
    """In a forked child: close its copies of the parent's lock files. The flock belongs to
    the open file, which the child shares, so a child that outlived a killed daemon held
    the store ("another clagd daemon is running") until it ended. Closing (never
    unlocking: that would free the parent's lock) leaves the parent the only holder."""
    for fd in list(_HELD):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


def lock_holder(store: Path) -> int | None:
    """The pid of the daemon holding the store's lock, or None when no daemon does (so a
    "not running" message can be checked before it is printed)."""
    path = git_dir(Path(store)) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.read(fd, 32).decode(errors="replace").strip()
            return int(text) if text.isdigit() else -1
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
