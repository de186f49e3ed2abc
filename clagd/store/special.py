"""Only regular files hold memories.

A symlink (to a file outside the store, which git versions as the link only), a file
hard-linked to another name (written through it, unseen), a FIFO (a read would block), a
socket or a device in `clusters/`, `archive/`, `unsorted/` is never read as memory: the
daemon reads what HEAD holds for that path from git's objects, lists the entry in
`status.special_files`, and refuses it as an outside edit ("... is a symlink, not a
regular file"). In the inbox such an entry is moved to `inbox/rejected/` with that reason.
Checked with `lstat`, so nothing is ever opened to find out.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from pathlib import Path

log = logging.getLogger("clagd")


def kind_of(st: os.stat_result) -> str | None:
    """What a directory entry is when it is not a plain file (None: a regular file with
    one name)."""
    mode = st.st_mode
    if stat.S_ISREG(mode):
        return f"a hard-linked file ({st.st_nlink} names)" if st.st_nlink > 1 else None
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "not a regular file"


def special_kind(path: Path | str) -> str | None:
    """`kind_of` the entry at `path` (None also when nothing is there)."""
    try:
        return kind_of(os.lstat(path))
    except (FileNotFoundError, NotADirectoryError):
        return None


def not_regular(rel: str, kind: str) -> str:
    """The reason given for such an entry, naming it."""
    return (
        f"{rel} is {kind}, not a regular file: only regular files hold memories (replace it "
        "with a plain copy of its contents, or remove it)"
    )


def special_entries(root: Path, folders: tuple[str, ...], limit: int = 50) -> list[tuple[str, str]]:
    """(`folder/name`, kind) for each special entry in these folders of the store (dot
    names included: a FIFO named `.x` would block a reader just as well; subfolders are
    git's business, not listed): at most `limit` in all, by name within each folder."""
    out: list[tuple[str, str]] = []
    for d in folders:
        # only the special entries are sorted, not every name (11k files: 50-79 ms -> 35-51)
        found: list[tuple[str, str]] = []
        try:
            entries = os.scandir(Path(root) / d)
        except OSError:
            continue
        with entries:
            for e in entries:
                try:
                    kind = kind_of(e.stat(follow_symlinks=False))
                except OSError:
                    continue
                if kind is not None and kind != "a folder":
                    found.append((f"{d}/{e.name}", kind))
        out.extend(sorted(found)[: limit - len(out)])
        if len(out) >= limit:
            break
    return out


class SpecialFiles:
    """The special entries of one store's memory folders, as last scanned (`refresh`, from
    housekeeping and at start: one `lstat` per entry, too many for every `status`)."""

    def __init__(self, root: Path, folders: tuple[str, ...]) -> None:
        self.root = Path(root)
        self.folders = folders
        self.files: tuple[str, ...] = ()  # "folder/name: kind", for status
        self.paths: tuple[str, ...] = ()  # "folder/name"
        self._at = float("-inf")  # when the last scan ran (monotonic)

    def maybe_refresh(self, min_interval: float = 30.0) -> None:
        """`refresh` unless one ran within `min_interval` seconds (housekeeping: one lstat
        per memory file, 30 ms for 8,000 files on a loaded 2-core machine, is not worth
        every 2-s tick)."""
        if time.monotonic() - self._at >= min_interval:
            self.refresh()

    def refresh(self) -> tuple[str, ...]:
        """Scan again; the special entries' paths."""
        self._at = time.monotonic()
        found = special_entries(self.root, self.folders)
        files = tuple(f"{rel}: {kind}" for rel, kind in found)
        if files and files != self.files:
            # %r: a newline in a name cannot forge a log line
            log.warning("not regular files, never read as memories: %r", list(files))
        self.files, self.paths = files, tuple(rel for rel, _k in found)
        return self.paths
