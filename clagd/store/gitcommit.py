"""Commits built with plumbing, on top of the daemon's base and nothing else.

`update-index --add --remove` stages exactly the daemon's paths; a scratch index
(`.git/clagd-build-index`) holds the base commit's tree with those paths as the index has
them (nothing else the person staged), `write-tree` and `commit-tree` make the commit, and `Refs.update_branch`
moves the branch by compare-and-swap.

The scratch index is kept between commits: after `write-tree` it holds exactly the tree it
wrote, so when the next commit's base has that tree (the daemon's own last commit, the
usual case) it is used as it is, without a `read-tree` of the whole base (a pass over
every file of the store: `clusters/` is one flat folder of a file per cluster).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from clagd.errors import GitFailed, HeadMoved, StoreError
from clagd.store.changewatch import ChangeWatch, Key, file_key
from clagd.store.gitcmd import Stdin
from clagd.store.gitlog import format_message
from clagd.store.gitrefs import Refs
from clagd.store.gitstate import UNSYNCED, mark_unsynced

# in .git/: the index a commit's tree is built in (the user's index is never committed whole)
BUILD_INDEX = "clagd-build-index"
ZERO = "0" * 40
TREES_KEPT = 64  # the trees of the latest commits made or looked up (commits never change)
# loose objects written without zlib: the daemon's `git gc --auto` packs and compresses them
UNCOMPRESSED = ("-c", "core.looseCompression=0")
# the scratch index is split (git's split index): a write rewrites the few entries changed
# since its shared part, not the whole index (~1 MB at 11k clusters: 5 ms of `update-index`
# and as much of `write-tree` a commit). Only the scratch index, which is the daemon's own:
# the person's `.git/index` stays one file every tool reads (libgit2 reads no split index)
SPLIT_INDEX = ("-c", "core.splitIndex=true")


class Commits(Refs):
    """Staging and committing the daemon's own paths (see the module's docstring)."""

    def __init__(self, root: Path, branch: str = "") -> None:
        super().__init__(root, branch)
        # the tree the scratch index holds, and the file it is in (`file_key`), when kept
        self._scratch: tuple[str, Key | None] | None = None
        # the staged entries of the last `build_tree`'s paths: {path: blob, None: absent}
        self._built_entries: dict[str, str | None] | None = None
        self._trees: dict[str, str] = {}  # commit -> its tree, the latest TREES_KEPT
        self.watch: ChangeWatch | None = None  # told of each index the staging writes

    def commit(
        self,
        paths: Iterable[str],
        subject: str,
        body: str = "",
        trailers: dict[str, Any] | None = None,
        allow_empty: bool = False,
        flush: Callable[[], object] | None = None,
        expected: dict[str, str | None] | None = None,
    ) -> str | None:
        """Stage exactly `paths` (added, changed or deleted) and commit only them, on top of
        `base` (the commit the daemon's view was loaded from) and on the daemon's branch.

        The commit is built with plumbing: its tree is `base`'s tree with these paths as the
        index has them (nothing else the person staged), `commit-tree`, then `update-ref`
        with `base` as the expected old value: an atomic compare-and-swap, so a commit of
        ours never lands on a HEAD the daemon has not loaded (a reset, rebase, amend or a
        person's commit in between raises HeadMoved, and the caller reloads and retries).

        With `flush`, staging, `write-tree` and `commit-tree` write their objects without an
        fsync each (core.fsync=none) and `flush()` is called after them, before the branch
        is moved: it must make them durable (the writer's one syncfs per commit), so that no
        ref names an object that a power loss could take. `update-ref` keeps git's fsync.

        `expected`: the blob each path must have in the commit (None: absent). When a git
        command of the person's (stash, reset, checkout of a file) changed a file between
        the daemon's write and this commit, HeadMoved: the change is written again.

        Returns the new commit, or None when nothing changed."""
        paths = sorted(set(paths))
        self.check_not_paused()
        fsync = flush is None
        if not fsync:
            mark_unsynced(self.gitdir)
        try:
            if paths:
                try:
                    self._stage(paths, fsync=fsync)
                except GitFailed:
                    self.check_index_flags(paths)  # the clear reason, when it is that
                    raise
            parent = self.base
            self._built_entries = None
            tree = self.build_tree(parent, paths, fsync=fsync)
            if expected:
                try:
                    self._check_tree(tree, expected)
                except HeadMoved:
                    self.check_index_flags(sorted(expected))  # git did not see the change
                    raise
            if not allow_empty and parent is not None and tree == self._tree_of(parent):
                return None
            msg = format_message(subject, body, trailers)
            new = self._commit_object(tree, parent, msg, fsync=fsync)
        finally:
            if flush is not None:
                # syncfs (or sync) flushes every object written since the mark (blobs,
                # trees, the commit; a failed command's too) before any ref names them
                flush()
                (self.gitdir / UNSYNCED).unlink(missing_ok=True)
        self.update_branch(new, parent, msg.splitlines()[0])
        return new

    def _check_tree(self, tree: str, expected: dict[str, str | None]) -> None:
        built = self._built_entries
        if built is not None and set(expected) <= set(built):
            # the tree holds these paths exactly as `build_tree` put them there
            found = {p: b for p, b in built.items() if b is not None}
        else:
            out = self.run("ls-tree", "-r", "-z", tree, "--", *sorted(expected))
            found = {}
            for entry in out.split("\0"):
                meta, _, path = entry.partition("\t")
                if path:
                    found[path] = meta.split()[2]
        for path, blob in expected.items():
            if found.get(path) != blob:
                raise HeadMoved(
                    f"{path} was changed by a git command of the person's while clagd "
                    "committed it (stash, reset, checkout?)"
                )

    def check_index_flags(self, paths: list[str]) -> None:
        """Raise StoreError naming a memory file the person marked skip-worktree or
        assume-unchanged in git's index (`git update-index`): git does not stage clagd's
        change to it (a refused `git add`, or a commit without the change), and the
        person's flag, not a race, is why."""
        out = self.run("ls-files", "-v", "-z", "--", *paths) if paths else ""
        for entry in out.split("\0"):
            tag, _, path = entry.partition(" ")
            if not path:
                continue
            what = "skip-worktree" if tag == "S" else "assume-unchanged" if tag.islower() else ""
            if what:
                raise StoreError(
                    f"{path} is marked {what} in git's index, so git does not take clagd's "
                    f"change to it; run git update-index --no-skip-worktree "
                    f"--no-assume-unchanged -- {path} (nothing was committed; clagd retries)"
                )

    def _tree_of(self, commit: str) -> str:
        trees = self._trees
        tree = trees.get(commit)
        if tree is None:
            tree = self.run("rev-parse", f"{commit}^{{tree}}").strip()
            self._remember_tree(commit, tree)
        return tree

    def _remember_tree(self, commit: str, tree: str) -> None:
        trees = self._trees
        if len(trees) >= TREES_KEPT:
            del trees[next(iter(trees))]
        trees[commit] = tree

    def build_tree(self, parent: str | None, paths: list[str], fsync: bool = True) -> str:
        """`parent`'s tree with `paths` as the index holds them (absent there: removed).
        The scratch index is read from `parent` only when it does not hold its tree already
        (see the module's docstring). Without `fsync`, the trees are written without git's
        fsync (the caller flushes them before a ref names them); the scratch index never
        needs one (it is made again from the base when it is not what was kept)."""
        build = self.gitdir / BUILD_INDEX
        env = {"GIT_INDEX_FILE": str(build)}
        nosync = ("-c", "core.fsync=none")
        kept, self._scratch = self._scratch, None
        try:
            want = self._tree_of(parent) if parent is not None else None
            if kept is None or want is None or kept != (want, file_key(build)):
                build.unlink(missing_ok=True)
                if parent is not None:
                    self.run(*SPLIT_INDEX, "read-tree", parent, env=env)
                else:
                    self.run(*SPLIT_INDEX, "read-tree", "--empty", env=env)
            built: dict[str, str | None] = {}
            if paths:
                staged = self.run("ls-files", "-s", "-z", "--", *paths)
                entries = [e for e in staged.split("\0") if e]
                for e in entries:
                    meta, _, path = e.partition("\t")
                    mode, blob, stage = meta.split()
                    # an unmerged path (stages 1-3) is never "as expected"
                    built[path] = blob if stage == "0" and path not in built else "unmerged"
                present = {e.split("\t", 1)[1] for e in entries}
                gone = [p for p in paths if p not in present and not (self.root / p).is_dir()]
                entries += [f"0 {ZERO}\t{p}" for p in gone]
                built.update(dict.fromkeys(gone))
                self.run(
                    *nosync,
                    *SPLIT_INDEX,
                    "update-index",
                    "-z",
                    "--index-info",
                    env=env,
                    istream=Stdin("\0".join(entries) + "\0"),
                )
            # --missing-ok: no lookup of every entry's object (a stat of each loose object:
            # ~40 ms at 4,500 clusters); the entries are the base's tree and what `git add`
            # has just written, and `_check_tree` compares the daemon's paths with their blobs.
            # The trees are written uncompressed, as the blobs are (`clusters/`'s tree is
            # ~0.5 MB at 11k clusters: zlib was 11-13 ms of each commit; packing compresses)
            fs = (*(() if fsync else nosync), *SPLIT_INDEX, *UNCOMPRESSED)
            tree = self.run(*fs, "write-tree", "--missing-ok", env=env)
            tree = tree.strip()
        except BaseException:
            build.unlink(missing_ok=True)
            raise
        self._scratch = (tree, file_key(build))
        self._built_entries = built
        return tree

    def _stage(self, paths: list[str], fsync: bool) -> None:
        """Stage exactly these paths (a deleted file is staged as deleted). A file
        the daemon wrote that was never committed and is gone now (a person's `git clean`
        removed it mid-write) fails the commit with a clear StoreError: committing without
        it would acknowledge memories that are nowhere."""
        there = [p for p in paths if os.path.lexists(self.root / p)]
        gone = [p for p in paths if p not in set(there)]
        if gone:
            tracked = set(self.run("ls-files", "-z", "--", *gone).split("\0"))
            lost = [p for p in gone if p not in tracked]
            if lost:
                # tracked in the commit the view is on: a git command of the person's took
                # it out of the index (a staged deletion), not a clean of an untracked file
                was = self.base and self.run("ls-tree", "--name-only", self.base, "--", lost[0])
                raise StoreError(
                    f"{lost[0]} was removed while clagd committed it ("
                    + (
                        "staged as deleted by a git command of the person's"
                        if was
                        else "git clean?"
                    )
                    + "); nothing was committed, the change is made again"
                )
        # uncompressed loose objects: half of `git add`'s time for a route pass's ~500
        # files; the daemon's `git gc --auto` packs (and compresses) them (store/packing.py)
        fs = UNCOMPRESSED + (() if fsync else ("-c", "core.fsync=none"))
        # `update-index --add --remove` of exactly these files: what `git add -A -- paths`
        # stages, without `add`'s scan of their folders for untracked files matching the
        # paths (`clusters/` is one flat folder: 38-118 ms for one file at 11k clusters,
        # against 18-20 ms), and whatever a .gitignore of the person's says. A file the
        # person marked skip-worktree is left as the index has it (not staged as deleted,
        # as --remove would): the commit then lacks the change and `check_index_flags`
        # names the flag
        watch = self.watch
        before = watch.index_key() if watch is not None else None
        self.run(
            *fs, "update-index", "--add", "--remove", "--ignore-skip-worktree-entries",
            "-z", "--stdin", istream=Stdin("\0".join(paths) + "\0"),
        )  # fmt: skip
        if watch is not None:
            watch.index_written(before, watch.index_key())

    def commit_tree(self, tree: str, parent: str | None, msg: str) -> str:
        new = self._commit_object(tree, parent, msg)
        self.update_branch(new, parent, msg.splitlines()[0])
        return new

    def _commit_object(self, tree: str, parent: str | None, msg: str, fsync: bool = True) -> str:
        self.check_not_paused()
        args = ["commit-tree", tree] + (["-p", parent] if parent else [])
        fs = () if fsync else ("-c", "core.fsync=none")
        new = self.run(*fs, *args, istream=Stdin(msg)).strip()
        self._remember_tree(new, tree)
        return new
