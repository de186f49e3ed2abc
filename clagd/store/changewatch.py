"""Whether anything but the daemon changed the memory folders or git's index since the last
full check, known without running git (issue 26).

The outside-edit check that every write runs first (`engine/outside.py`) asked `git status`
of the memory folders: 40-45 ms at 11k clusters (git reads the whole index and stats every
file), the largest single cost of an `add` at 100k memories. This keeps an inotify watch
(Linux; watchdog's ctypes bindings of the calls) on `clusters/`, `archive/` and `unsorted/`,
read without blocking when asked, and the identity of `.git/index`:

- every file event in those folders makes its path a suspect, unless the file is now exactly
  what the daemon committed there (the inode, size, mtime and ctime noted right after its
  write, kept once the commit lands: any later write, rename or `touch` changes them);
- git's index must be the file the daemon's own staging left (`index_written`), or the one
  the last full check saw: a `git add`, `git rm --cached` or `reset` writes a new one;
- a lost watch (a folder removed, moved or replaced), a full event queue, or a folder that
  could not be watched (inotify missing or out of watches) mean "not known".

`quiet()` is true only when none of that happened since a full check that found the folders
clean; otherwise the caller runs the full check (`git status`), calling `begin_full` before
and `end_full` after it. What a change between the check and the daemon's commit can do is
what it could do with `git status` too (the window is the same operation); housekeeping
runs the full check on its own schedule whatever the watch says.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

from clagd.store.files import is_data_path

log = logging.getLogger("clagd")

try:  # Linux only; elsewhere every check is the full one
    from watchdog.observers.inotify_c import InotifyConstants as _IN
    from watchdog.observers.inotify_c import InotifyFD as _InotifyFD
    from watchdog.observers.inotify_c import inotify_add_watch, inotify_init, inotify_rm_watch

    HAVE_INOTIFY = True
except Exception:  # noqa: BLE001 - ImportError, or watchdog's UnsupportedLibcError
    HAVE_INOTIFY = False

Key = tuple[int, int, int, int]


def file_key(path: Path) -> Key | None:
    """Which file is at `path` now (None: nothing): git and editors write a new inode, any
    write moves mtime and ctime."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class ChangeWatch:
    """See the module's docstring. Used on the writer thread and its git thread, one at a
    time (the writer waits for its commit)."""

    def __init__(self, root: Path, gitdir: Path, dirs: tuple[str, ...]) -> None:
        self.root = root
        self.index = gitdir / "index"
        self.dirs = dirs
        self.fd = -1
        self._wd: dict[int, str] = {}  # watch descriptor -> its folder
        self._suspects: set[str] = set()  # paths with an event since the last full check
        self._own: dict[str, Key | None] = {}  # what the daemon committed at each path
        self._index_key: Key | None = None  # the index the daemon knows to be clean
        self._clean = False  # the last full check found nothing to take in
        self._lost = True  # events may have been missed since the last full check
        self.full_checks = 0  # (status: how often git had to be asked)
        self.quiet_checks = 0
        if HAVE_INOTIFY:
            try:
                fd = inotify_init()
                if fd < 0:
                    raise OSError(errno.EMFILE, "inotify_init failed")
                os.set_blocking(fd, False)
                os.set_inheritable(fd, False)
                self.fd = fd
            except OSError as exc:
                log.info("no inotify watch of the memory folders (%s): git status each write", exc)

    @property
    def active(self) -> bool:
        return self.fd >= 0

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    # -- the daemon's own writes ----------------------------------------------------------
    def own(self, keys: dict[str, Key | None]) -> None:
        """The files the daemon just committed, as it wrote them (`file_key` taken right
        after each write: a change of the person's since is not the daemon's)."""
        self._own.update(keys)

    def index_key(self) -> Key | None:
        return file_key(self.index)

    def index_written(self, before: Key | None, after: Key | None) -> None:
        """The daemon's staging changed git's index from `before` to `after`: when `before`
        was the index known clean, `after` is (nothing else staged meanwhile)."""
        if before is not None and before == self._index_key:
            self._index_key = after

    # -- the checks -----------------------------------------------------------------------
    def quiet(self) -> bool:
        """Nothing but the daemon changed the memory folders or the index since a full
        check that found them clean (see the module's docstring)."""
        if not self.active or not self._clean:
            return False
        self._drain()
        if self._lost or self.index_key() != self._index_key:
            return False
        for rel in list(self._suspects):
            if rel not in self._own or file_key(self.root / rel) != self._own[rel]:
                return False
            self._suspects.discard(rel)
        self.quiet_checks += 1
        return True

    def begin_full(self) -> None:
        """Before a full check: every change from here on is seen by the next `quiet`."""
        self.full_checks += 1
        if not self.active:
            return
        self._drain()
        self._arm()
        self._suspects.clear()
        self._own.clear()
        self._index_key = self.index_key()

    def end_full(self, clean: bool) -> None:
        """After it: whether it found nothing to take in (else the next check is full too)."""
        self._clean = clean

    def unsettle(self) -> None:
        """The branch moved under the daemon (a reset, a person's commit): what git's index
        holds is to be compared with the new HEAD, which no event says (`git reset --soft`
        leaves the index as it was), so the next check is full."""
        self._clean = False

    # -- inotify --------------------------------------------------------------------------
    def _arm(self) -> None:
        """Watch every folder not watched (again: removed and made anew, or never there)."""
        self._lost = False
        watched = set(self._wd.values())
        for d in self.dirs:
            if d in watched:
                continue
            mask = (
                _IN.IN_MODIFY | _IN.IN_ATTRIB | _IN.IN_CLOSE_WRITE | _IN.IN_MOVED_FROM
                | _IN.IN_MOVED_TO | _IN.IN_CREATE | _IN.IN_DELETE | _IN.IN_DELETE_SELF
                | _IN.IN_MOVE_SELF | _IN.IN_ONLYDIR | _IN.IN_DONT_FOLLOW
            )  # fmt: skip
            wd = inotify_add_watch(self.fd, os.fsencode(self.root / d), mask)
            if wd < 0:  # missing, a symlink, out of watches: unknown until watched
                self._lost = True
                continue
            self._wd[wd] = d

    def _drain(self) -> None:
        while True:
            try:
                buf = os.read(self.fd, 64 * 1024)
            except BlockingIOError:
                return
            except OSError:
                self._lost = True
                return
            if not buf:
                return
            for wd, mask, _cookie, name in _InotifyFD._parse_event_buffer(buf):  # noqa: SLF001
                if mask & _IN.IN_Q_OVERFLOW:
                    self._lost = True
                    continue
                folder = self._wd.get(wd)
                if folder is None:
                    continue
                if mask & (_IN.IN_IGNORED | _IN.IN_DELETE_SELF | _IN.IN_MOVE_SELF | _IN.IN_UNMOUNT):
                    # the folder is gone or elsewhere: watched anew by the next full check
                    self._lost = True
                    del self._wd[wd]
                    if not mask & _IN.IN_IGNORED:
                        inotify_rm_watch(self.fd, wd)
                    continue
                rel = f"{folder}/{os.fsdecode(name)}"
                if name and is_data_path(rel):
                    self._suspects.add(rel)
