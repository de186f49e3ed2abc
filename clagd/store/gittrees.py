"""A commit's trees written from the base's trees and the changed entries, not by
`write-tree` over a whole index.

`write-tree` of the scratch index (and the `update-index` that puts the daemon's paths into
it first) read and hash an index of every file in the store: at 11k clusters ~12 ms of each
commit's ~27 ms of git. Here the trees a commit changes (the folders of its paths, up to
the root) are made from the base commit's trees: their entries are read once per tree with
`git cat-file tree` and kept (trees never change), the changed entries are put in, and the
new tree's bytes (git's tree format: "<mode> <name>\\0<binary id>" per entry, sorted as git
sorts them: a folder's name as if it ended in "/") go to one long-running `git hash-object
-t tree -w --stdin-paths` (through a file `.git/clagd-tree-*.tmp`, removed once written; a
kill's leftover is removed by the start-up's recovery), which checks their format, hashes
and writes them (~2 ms for the 11k-entry `clusters/` tree). git still writes every object;
only the entries are assembled here. Anything this does not handle (an unmerged path, a
file where the base has a folder or the other way round, a tree it cannot read, a
repository of SHA-256 ids, a failed or dead `hash-object`) raises `TreesUnsupported` and
the caller builds the tree in its scratch index as before.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import subprocess
import tempfile
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path

from clagd.store.gitcmd import GIT_ENV, IDENTITY

TREE_MODE = b"40000"
LISTINGS_KEPT = 16  # trees whose entries are kept (a commit reads the root and a folder)
# in .git/: the bytes of the tree being written, one file per tree (removed once written)
TREE_PREFIX, TREE_SUFFIX = "clagd-tree-", ".tmp"


class TreesUnsupported(Exception):
    """This change's trees are not made here (see the module's docstring)."""


class Listing:
    """One tree's entries: `keys` in git's tree order, `entries[key]` its bytes in the
    tree, `kinds[name]` (mode, id) by the entry's name."""

    __slots__ = ("keys", "entries", "kinds")

    def __init__(self) -> None:
        self.keys: list[bytes] = []
        self.entries: dict[bytes, bytes] = {}
        self.kinds: dict[bytes, tuple[bytes, bytes]] = {}

    @classmethod
    def parse(cls, raw: bytes) -> Listing:
        out = cls()
        entries, kinds, keys = out.entries, out.kinds, out.keys
        i, n = 0, len(raw)
        while i < n:
            nul = raw.find(b"\0", i)
            mode, _, name = raw[i:nul].partition(b" ")
            end = nul + 21  # SHA-1 ids (the daemon's blob ids are SHA-1 too)
            if nul < 0 or end > n or not name:
                raise TreesUnsupported("a tree this cannot read")
            key = name + b"/" if mode == TREE_MODE else name
            keys.append(key)
            entries[key] = raw[i:end]
            kinds[name] = (mode, raw[nul + 1 : end])
            i = end
        if keys != sorted(keys):  # not a tree git wrote: let git build this one
            raise TreesUnsupported("a tree's entries are not in git's order")
        return out

    def copy(self) -> Listing:
        out = Listing()
        out.keys, out.entries, out.kinds = list(self.keys), dict(self.entries), dict(self.kinds)
        return out

    def put(self, name: bytes, mode: bytes, oid: bytes) -> None:
        """Add or replace the entry `name` (`oid`: 20 bytes)."""
        old = self.kinds.get(name)
        if old is not None and (old[0] == TREE_MODE) != (mode == TREE_MODE):
            raise TreesUnsupported("a file where the base has a folder, or the other way")
        key = name + b"/" if mode == TREE_MODE else name
        if old is None:
            bisect.insort(self.keys, key)
        self.entries[key] = mode + b" " + name + b"\0" + oid
        self.kinds[name] = (mode, oid)

    def drop(self, name: bytes) -> None:
        old = self.kinds.pop(name, None)
        if old is None:
            return
        key = name + b"/" if old[0] == TREE_MODE else name
        del self.entries[key]
        del self.keys[bisect.bisect_left(self.keys, key)]

    def tree_bytes(self) -> bytes:
        return b"".join(map(self.entries.__getitem__, self.keys))


# a path's new entry: (mode, blob id in hex), or None: the path is removed
Change = tuple[str, str] | None


class TreeWriter:
    """The trees of the daemon's commits (see the module's docstring). Used by one thread
    at a time (the writer's git thread); `close` ends the `hash-object` processes."""

    def __init__(self, root: Path, gitdir: Path) -> None:
        self.root = root
        self.gitdir = gitdir
        self._listings: OrderedDict[str, Listing] = OrderedDict()
        self._procs: dict[tuple[str, ...], subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()
        # a store object dropped without `close` (a command-line run, a test) ends them too
        weakref.finalize(self, _stop_all, self._procs)

    def tree_with(
        self, base_tree: str | None, changes: Mapping[str, Change], opts: tuple[str, ...]
    ) -> str:
        """The id of `base_tree` (None: the empty tree) with `changes` made; `opts`: the
        `-c` options of the `hash-object` that writes the trees (fsync, compression)."""
        groups: dict[str, dict[str, Change]] = {}
        for path, change in changes.items():
            if not path or path.startswith("/") or "//" in path or path.endswith("/"):
                raise TreesUnsupported(f"a path git would not take: {path!r}")
            head, sep, rest = path.partition("/")
            groups.setdefault(head, {})[rest if sep else ""] = change
        with self._lock:
            return self._tree(base_tree, groups, opts)

    def _tree(
        self, base: str | None, groups: dict[str, dict[str, Change]], opts: tuple[str, ...]
    ) -> str:
        listing = self._listing(base).copy() if base is not None else Listing()
        for head, sub in groups.items():
            name = os.fsencode(head)
            if name in (b".", b"..", b".git"):
                raise TreesUnsupported(f"a path git would not take: {head!r}")
            if "" in sub:  # the entry itself
                if len(sub) > 1:
                    raise TreesUnsupported(f"{head} is a file and a folder in one change")
                change = sub[""]
                if change is None:
                    listing.drop(name)
                else:
                    mode, blob = change
                    if mode.startswith("40"):
                        raise TreesUnsupported(f"{head} is a folder in the index")
                    listing.put(name, mode.encode(), bytes.fromhex(blob))
                continue
            now = listing.kinds.get(name)
            if now is not None and now[0] != TREE_MODE:
                raise TreesUnsupported(f"{head} is a file in the base, a folder in the change")
            nested: dict[str, dict[str, Change]] = {}
            for rest, change in sub.items():
                h, sep, r = rest.partition("/")
                nested.setdefault(h, {})[r if sep else ""] = change
            sub_base = now[1].hex() if now is not None else None
            new = self._tree(sub_base, nested, opts)
            if self._listing(new).keys:
                listing.put(name, TREE_MODE, bytes.fromhex(new))
            else:
                listing.drop(name)  # git keeps no empty folder
        return self._write(listing, opts)

    def read_tree(self, tree: str) -> bytes:
        """The tree's raw bytes (`git cat-file tree`)."""
        got = subprocess.run(
            ["git", *IDENTITY, "cat-file", "tree", tree],
            cwd=self.root,
            env={**os.environ, **GIT_ENV},
            capture_output=True,
        )
        if got.returncode != 0:
            raise TreesUnsupported(f"git cat-file tree {tree}: {got.stderr[:200]!r}")
        return got.stdout

    def _listing(self, tree: str) -> Listing:
        got = self._listings.get(tree)
        if got is None:
            got = Listing.parse(self.read_tree(tree))
            self._keep(tree, got)
        else:
            self._listings.move_to_end(tree)
        return got

    def _keep(self, tree: str, listing: Listing) -> None:
        self._listings[tree] = listing
        while len(self._listings) > LISTINGS_KEPT:
            self._listings.popitem(last=False)

    def _write(self, listing: Listing, opts: tuple[str, ...]) -> str:
        proc = self._proc(opts)
        fd, path = tempfile.mkstemp(prefix=TREE_PREFIX, suffix=TREE_SUFFIX, dir=self.gitdir)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(listing.tree_bytes())
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(os.fsencode(path) + b"\n")
            proc.stdin.flush()
            line = proc.stdout.readline().strip()
        except (OSError, ValueError) as exc:
            self._end(opts)
            raise TreesUnsupported(f"git hash-object: {exc}") from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        if len(line) != 40 or not all(c in b"0123456789abcdef" for c in line):
            self._end(opts)
            raise TreesUnsupported(f"git hash-object answered {line[:80]!r}")
        tree = line.decode()
        self._keep(tree, listing)
        return tree

    def _proc(self, opts: tuple[str, ...]) -> subprocess.Popen[bytes]:
        proc = self._procs.get(opts)
        if proc is not None:
            if proc.poll() is None:
                return proc
            self._end(opts)  # it died: its pipes are closed, another is started
        args = ["git", *IDENTITY, *opts, "hash-object", "-t", "tree", "-w", "--stdin-paths"]
        try:
            proc = subprocess.Popen(
                args,
                cwd=self.root,
                env={**os.environ, **GIT_ENV},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
        except OSError as exc:
            raise TreesUnsupported(f"git hash-object: {exc}") from None
        self._procs[opts] = proc
        return proc

    def _end(self, opts: tuple[str, ...]) -> None:
        proc = self._procs.pop(opts, None)
        if proc is not None:
            _stop(proc)

    def close(self) -> None:
        with self._lock:
            for opts in list(self._procs):
                self._end(opts)


def drop_tree_files(gitdir: Path, older_than: float = 60.0) -> int:
    """Remove the tree files (`TREE_PREFIX`) a killed process left in `gitdir` (one lives for
    the ~2 ms of writing its tree: older ones are nobody's); returns how many."""
    done = 0
    now = time.time()
    for path in gitdir.glob(f"{TREE_PREFIX}*{TREE_SUFFIX}"):
        with contextlib.suppress(OSError):
            if now - path.lstat().st_mtime > older_than:
                path.unlink()
                done += 1
    return done


def _stop_all(procs: dict[tuple[str, ...], subprocess.Popen[bytes]]) -> None:
    while procs:
        _stop(procs.popitem()[1])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    try:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        proc.kill()
        proc.wait()
    finally:
        if proc.stdout is not None:
            proc.stdout.close()
