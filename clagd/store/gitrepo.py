"""Git, through GitPython's command wrapper (`git.cmd.Git`), never its object layer.

Every change of memory content or organization is one commit with trailers that say what
kind of change it was; `log()` reads them back for `clagd log`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from git.cmd import Git
from git.exc import GitCommandError

from clagd.errors import Conflict, HeadMoved, NotFound, Paused, StoreError
from clagd.store.durable import fsync_dir

log = logging.getLogger("clagd.git")

IDENTITY = ("-c", "user.name=clagd", "-c", "user.email=clagd@localhost")
TRAILER_PREFIX = "Clagd-"
_FIELD = "\x1f"
_RECORD = "\x1e"
# in .git/: present while objects written without fsync may not be flushed yet
UNSYNCED = "clagd-unsynced-objects"
# in .git/: the index a commit's tree is built in (the user's index is never committed whole)
BUILD_INDEX = "clagd-build-index"
# in .git/: the commit the daemon's view was last on (survives `git clean -fdx`)
BASE_FILE = "clagd-base"
# git config key recording the branch the store was created with (the daemon's own branch)
BRANCH_KEY = "clagd.branch"
# markers of a git operation in progress in .git/, and how the person finishes each
IN_PROGRESS = (
    ("MERGE_HEAD", "a merge is in progress", "finish it (git commit) or run git merge --abort"),
    ("rebase-merge", "a rebase is in progress", "finish it or run git rebase --abort"),
    ("rebase-apply", "a rebase (or git am) is in progress", "finish it or run git rebase --abort"),
    (
        "CHERRY_PICK_HEAD",
        "a cherry-pick is in progress",
        "finish it or run git cherry-pick --abort",
    ),
    ("REVERT_HEAD", "a revert is in progress", "finish it or run git revert --abort"),
)
ZERO = "0" * 40
LOCK_WAIT = 3.0  # seconds a git call waits for another git process's index.lock


def _printable(text: str) -> str:
    """Commit messages hold no control characters but newlines and tabs (a memory's content
    quoted in a body may have any)."""
    return "".join(c if c >= " " or c in "\n\t" else " " for c in text)


def format_message(subject: str, body: str = "", trailers: dict[str, Any] | None = None) -> str:
    subject, body = _printable(subject), _printable(body)
    parts = [subject.strip().splitlines()[0][:200] if subject.strip() else "clagd change"]
    if body.strip():
        parts.append(body.strip())
    if trailers:
        parts.append(
            "\n".join(
                f"{TRAILER_PREFIX}{k.replace('_', '-').title()}: {' '.join(str(v).split())}"
                for k, v in trailers.items()
                if v is not None and str(v) != ""
            )
        )
    return "\n\n".join(parts) + "\n"


@dataclass(frozen=True)
class CommitInfo:
    """One commit as `GitStore.log` reads it: its clagd trailers (keys lowercased, without
    the `Clagd-` prefix) and its kind (`outside` for a commit clagd did not make)."""

    commit: str
    date: str
    subject: str
    kind: str
    trailers: dict[str, str]
    parents: tuple[str, ...]


class GitStore:
    """The store's repository. `branch` is the daemon's own branch: it commits nowhere else.
    `base` is the commit the daemon's view was loaded from: a commit of its own is made on
    top of exactly that commit, or not at all (`commit` raises HeadMoved)."""

    def __init__(self, root: Path, branch: str = "") -> None:
        self.root = Path(root)
        self.gitdir = self.root / ".git"
        self.git = Git(str(self.root))
        self._branch = branch
        self._base: str | None = None
        self._base_known = False
        self._lock_stuck_until = 0.0
        # A fixed environment: no pager, no editor, no prompts; a commit identity of our own.
        # GIT_OPTIONAL_LOCKS=0: our frequent `git status` must not take the index lock, or a
        # user's own git command in the store would fail with "index.lock: File exists".
        self.git.update_environment(
            GIT_TERMINAL_PROMPT="0",
            GIT_EDITOR="true",
            GIT_PAGER="cat",
            LC_ALL="C",
            GIT_OPTIONAL_LOCKS="0",
        )

    # -- plumbing ---------------------------------------------------------------
    def run(self, *args: str, **kw: Any) -> str:
        """Run git, retrying briefly (LOCK_WAIT) while another git process holds the index
        lock. After one such wait ran out, calls fail at once for a while: a stale lock
        left by a crashed git must not make every request wait past the client's timeout."""
        now = time.monotonic()
        deadline = now + (LOCK_WAIT if now >= self._lock_stuck_until else 0.0)
        while True:
            try:
                return str(self.git.execute(["git", *IDENTITY, *args], **kw))
            except GitCommandError as exc:
                # only a lock held by another git process is worth waiting for; a failed
                # write of our own lock (ENOSPC, a read-only store) also names index.lock
                err = str(exc.stderr)
                if "index.lock" in err and "File exists" in err:
                    if time.monotonic() < deadline:
                        time.sleep(0.05)
                        continue
                    self._lock_stuck_until = time.monotonic() + LOCK_WAIT
                    exc.stderr = (
                        f"{self.gitdir / 'index.lock'} exists: another git command is running "
                        "in the store, or one crashed and left it (remove it if none runs); "
                        "clagd retries"
                    )
                raise

    def init(self) -> None:
        if not (self.root / ".git").exists():
            self.run("init", "-q", "-b", "main")
            self.run("config", BRANCH_KEY, "main")
        self.make_private()
        for key, value in (("core.fsync", "all"), ("core.fsyncMethod", "fsync")):
            try:
                self.run("config", key, value)
            except GitCommandError:  # an old git without core.fsync
                log.warning("git does not support %s; commits rely on the OS to flush", key)
        self.run("config", "gc.auto", "0")  # no gc in the daemon's write path

    def make_private(self) -> None:
        """Objects, refs and logs git creates are 0600/0700 whatever the umask (the
        daemon's umask is 077 too; a person's git commands in the store obey this). A
        sharing the person set up themselves is left alone."""
        try:
            self.run("config", "--get", "core.sharedRepository")
            return
        except GitCommandError:
            pass  # not set
        self.run("config", "core.sharedRepository", "0600")

    def head(self) -> str | None:
        try:
            return self.run("rev-parse", "--verify", "-q", "HEAD").strip() or None
        except GitCommandError:
            return None

    # -- the daemon's own branch ----------------------------------------------------------
    @property
    def branch(self) -> str:
        if not self._branch:
            self._branch = self.own_branch()
        return self._branch

    @branch.setter
    def branch(self, name: str) -> None:
        self._branch = name

    @property
    def base(self) -> str | None:
        """The commit the daemon's view was loaded from (until set: the branch's commit)."""
        if not self._base_known:
            self._base, self._base_known = self.branch_head(), True
        return self._base

    @base.setter
    def base(self, commit: str | None) -> None:
        changed = commit != self._base
        self._base, self._base_known = commit, True
        if changed and commit is not None:
            # kept in .git/ so that a start-up can tell a move of the branch made while no
            # daemon ran (`saved_base`); not fsynced: a lost write only repeats a check
            tmp = self.gitdir / (BASE_FILE + ".tmp")
            try:
                tmp.write_text(commit + "\n", encoding="ascii")
                os.replace(tmp, self.gitdir / BASE_FILE)
            except OSError:
                pass

    def saved_base(self) -> str | None:
        """The commit the last daemon's view was on (see `base`), if recorded."""
        try:
            text = (self.gitdir / BASE_FILE).read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            return None
        return text if len(text) in (40, 64) else None

    def own_branch(self, configured: str = "") -> str:
        """The branch the daemon commits on: configured, else the one the store was created
        with (recorded by `init`), else the one checked out, else main."""
        if configured:
            return configured
        try:
            recorded = self.run("config", "--get", BRANCH_KEY).strip()
        except GitCommandError:
            recorded = ""
        if recorded:
            return recorded
        current = self.current_branch()
        return current or "main"

    def current_branch(self) -> str | None:
        """The branch HEAD points to; None when HEAD is detached (read from .git/HEAD, so
        it is cheap enough to check before every write and in every `status`)."""
        try:
            text = (self.gitdir / "HEAD").read_text(encoding="utf-8").strip()
        except OSError:
            return None
        if text.startswith("ref: refs/heads/"):
            return text[len("ref: refs/heads/") :]
        return None

    def pause_reason(self, wait: bool = False, locks: bool = True) -> str | None:
        """Why the daemon must not write now (None: it may): HEAD detached or on another
        branch, a merge, rebase, cherry-pick or revert in progress, or a git command of the
        person's running (its `.git/index.lock`: a checkout rewrites the working tree
        before it moves HEAD). Each reason says how the person resumes. `wait`: give a
        running git command up to LOCK_WAIT seconds to finish first. `locks=False`: from
        another thread than the writer's (whose own git commands take the lock)."""
        deadline = time.monotonic() + (LOCK_WAIT if wait else 0.0)
        while locks and (self.gitdir / "index.lock").exists():
            if time.monotonic() >= deadline:
                return (
                    "a git command is running in the store (.git/index.lock exists; if none "
                    "runs, a crashed one left it: remove it); writes resume by themselves"
                )
            time.sleep(0.02)
        branch = self.branch
        for marker, what, how in IN_PROGRESS:
            if (self.gitdir / marker).exists():
                return f"{what} in the store; {how} (ingestion resumes by itself)"
        current = self.current_branch()
        if current is None:
            return (
                f"HEAD is detached in the store (clagd commits only on branch {branch!r}); "
                f"run git checkout {branch} to resume"
            )
        if current != branch:
            return (
                f"branch {current!r} is checked out in the store (clagd commits only on "
                f"{branch!r}); run git checkout {branch} to resume"
            )
        return None

    def branch_head(self) -> str | None:
        """The commit the daemon's branch points to (None: the branch does not exist)."""
        try:
            out = self.run("rev-parse", "--verify", "-q", f"refs/heads/{self.branch}^{{commit}}")
            return out.strip() or None
        except GitCommandError:
            return None

    def is_ancestor(self, old: str, new: str) -> bool:
        try:
            self.run("merge-base", "--is-ancestor", old, new)
            return True
        except GitCommandError:
            return False

    def recover(self, own_operation: bool = False) -> list[str]:
        """Undo what a killed daemon (or a crashed git) left behind. Called at start-up,
        with the store lock held, so a stale lock file is not ours to keep. A revert or
        cherry-pick in progress is abandoned only when `own_operation` (the daemon's
        transaction marker says it was its own revert): a person's merge, rebase or
        revert is theirs to finish, and the daemon waits for it (`pause_reason`)."""
        notes = []
        gitdir = self.root / ".git"
        # a git command killed with the daemon leaves its lock files behind: the index, but
        # also HEAD, ORIG_HEAD and the branch ref (git commit locks those while it updates them)
        locks = [gitdir / n for n in ("index.lock", "HEAD.lock", "ORIG_HEAD.lock")]
        locks += [gitdir / n for n in ("packed-refs.lock", "config.lock")]
        locks += sorted((gitdir / "refs").rglob("*.lock")) if (gitdir / "refs").is_dir() else []
        for lock in locks:
            try:
                age = time.time() - lock.stat().st_mtime
            except FileNotFoundError:
                continue
            if age < 2.0:
                time.sleep(2.0 - age)  # maybe a live git command of the user's: let it finish
            if lock.exists():
                lock.unlink()
                notes.append(f"removed a stale .git/{lock.relative_to(gitdir)}")
        for marker in ("REVERT_HEAD", "CHERRY_PICK_HEAD") if own_operation else ():
            if (gitdir / marker).exists():
                for cmd in (("revert", "--quit"), ("cherry-pick", "--quit")):
                    try:
                        self.run(*cmd)
                    except GitCommandError:
                        pass
                notes.append(f"abandoned an unfinished git operation ({marker})")
        unsynced = gitdir / UNSYNCED
        if unsynced.exists():
            # killed (or the power lost) between `git add` and the flush: the objects written
            # since may be torn; nothing refers to them, but git would reuse one for the same
            # content, so the unreadable ones go
            dropped = drop_broken_objects(gitdir / "objects", unsynced.stat().st_mtime - 2.0)
            if dropped:
                notes.append(f"removed {len(dropped)} unreadable loose object(s) after a crash")
            unsynced.unlink()
        # Refresh the stat data in git's index once: after a clone, a copy, or a commit made
        # in the same second as a file's last write, every `git status` (run with
        # GIT_OPTIONAL_LOCKS=0, so it never saves a refresh) would re-read and hash those
        # files again (~0.1 s per status at 2,000 cluster files).
        try:
            self.run("update-index", "-q", "--refresh")
        except GitCommandError:
            pass  # changed files are listed as such and are none of this step's business
        return notes

    def _mark_unsynced(self) -> None:
        """Note, durably, that objects are about to be written without fsync."""
        path = self.root / ".git" / UNSYNCED
        if path.exists():
            return
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(path.parent)

    def reset_paths_to_head(self, dirs: Iterable[str]) -> None:
        """Drop uncommitted changes under the given folders (a half-applied operation)."""
        dirs = [d for d in dirs]
        if self.head():
            self.run("reset", "-q", "HEAD", "--", *dirs)
            try:
                self.run("checkout", "-q", "HEAD", "--", *dirs)
            except GitCommandError:
                pass  # a folder with nothing tracked yet
        self.run("clean", "-fdq", "--", *dirs)

    def restore_paths(self, rel_paths: list[str]) -> None:
        """Make exactly these files as they are in HEAD: restored, or removed when HEAD does
        not have them. Nothing else in the working tree is touched."""
        if not rel_paths:
            return
        in_head: set[str] = set()
        if self.head():
            out = self.run("ls-tree", "-r", "--name-only", "HEAD", "--", *rel_paths)
            in_head = {p for p in out.splitlines() if p.strip()}
            self.run("reset", "-q", "HEAD", "--", *rel_paths)
        if in_head:
            self.run("checkout", "-q", "HEAD", "--", *sorted(in_head))
        for rel in rel_paths:
            if rel not in in_head:
                (self.root / rel).unlink(missing_ok=True)

    def texts_at(self, commit: str, rel_paths: Iterable[str]) -> dict[str, str]:
        """The contents of these files (or of every file under these folders) in `commit`
        (a file it does not hold is left out), read from git's objects, which no git command
        of the person's can be rewriting. One `cat-file --batch` reads them all."""
        rel_paths = list(rel_paths)
        if not rel_paths:
            return {}
        out = self.run("ls-tree", "-r", "-z", commit, "--", *rel_paths)
        entries = []
        for entry in out.split("\0"):
            meta, _, path = entry.partition("\t")
            if path and meta.split()[1] == "blob":
                entries.append((path, meta.split()[2]))
        if not entries:
            return {}
        proc = subprocess.run(
            ["git", "cat-file", "--batch"],
            cwd=self.root,
            input="".join(f"{sha}\n" for _p, sha in entries).encode(),
            capture_output=True,
            check=True,
        )
        data, pos, texts = proc.stdout, 0, {}
        for path, _sha in entries:
            header_end = data.index(b"\n", pos)
            size = int(data[pos:header_end].split()[2])
            start = header_end + 1
            texts[path] = data[start : start + size].decode("utf-8", errors="replace")
            pos = start + size + 1
        return texts

    def staged_paths(self, dirs: Iterable[str]) -> list[str]:
        """Paths under `dirs` whose index entry differs from HEAD."""
        if not self.head():
            return []
        out = self.run("diff", "--cached", "--no-renames", "--name-only", "-z", "HEAD", "--", *dirs)
        return [p for p in out.split("\0") if p]

    def dirty_paths(self, dirs: Iterable[str]) -> list[str]:
        out = self.run(
            "status", "--porcelain=v1", "-z", "--no-renames", "--untracked-files=all", "--", *dirs
        )
        paths = []
        for entry in out.split("\0"):
            if len(entry) > 3:
                paths.append(entry[3:])
        return paths

    # -- commits ----------------------------------------------------------------
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

        With `flush`, `git add` writes its objects without an fsync each (core.fsync=none)
        and `flush()` is called after it, before the commit is made: it must make them
        durable (the writer's one syncfs per commit), so that no commit refers to an object
        that a power loss could take. The commit object, trees and ref keep git's own fsync.

        `expected`: the blob each path must have in the commit (None: absent). When a git
        command of the person's (stash, reset, checkout of a file) changed a file between
        the daemon's write and this commit, HeadMoved: the change is written again.

        Returns the new commit, or None when nothing changed."""
        paths = sorted(set(paths))
        self.check_not_paused()
        if paths:
            if flush is not None:
                self._mark_unsynced()
            self._stage(paths, fsync=flush is None)
        if flush is not None:
            flush()
            # syncfs (or sync) flushed every object written since the mark, a failed add's too
            (self.root / ".git" / UNSYNCED).unlink(missing_ok=True)
        parent = self.base
        tree = self._tree_with(parent, paths)
        if expected:
            self._check_tree(tree, expected)
        if not allow_empty and parent is not None and tree == self._tree_of(parent):
            return None
        return self._commit_tree(tree, parent, format_message(subject, body, trailers))

    def _check_tree(self, tree: str, expected: dict[str, str | None]) -> None:
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

    def _tree_of(self, commit: str) -> str:
        return self.run("rev-parse", f"{commit}^{{tree}}").strip()

    def _tree_with(self, parent: str | None, paths: list[str]) -> str:
        """`parent`'s tree with `paths` as the index holds them (absent there: removed)."""
        build = self.gitdir / BUILD_INDEX
        build.unlink(missing_ok=True)
        env = {"GIT_INDEX_FILE": str(build)}
        try:
            if parent is not None:
                self.run("read-tree", parent, env=env)
            else:
                self.run("read-tree", "--empty", env=env)
            if paths:
                staged = self.run("ls-files", "-s", "-z", "--", *paths)
                entries = [e for e in staged.split("\0") if e]
                present = {e.split("\t", 1)[1] for e in entries}
                entries += [
                    f"0 {ZERO}\t{p}"
                    for p in paths
                    if p not in present and not (self.root / p).is_dir()
                ]
                self.run(
                    "update-index",
                    "-z",
                    "--index-info",
                    env=env,
                    istream=_Stdin("\0".join(entries) + "\0"),
                )
            return self.run("write-tree", env=env).strip()
        finally:
            build.unlink(missing_ok=True)

    def _stage(self, paths: list[str], fsync: bool) -> None:
        """`git add -A` of exactly these paths (a deleted file is staged as deleted). A file
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
        fs = ("-c", "core.looseCompression=0") + (() if fsync else ("-c", "core.fsync=none"))
        self.run(*fs, "add", "-A", "--", *paths)

    def check_not_paused(self) -> None:
        """Raise Paused when the person's git holds the store (checked again right before
        the branch is moved: a merge started while the daemon was writing wins)."""
        reason = self.pause_reason()
        if reason:
            raise Paused(reason)

    def _commit_tree(self, tree: str, parent: str | None, msg: str) -> str:
        self.check_not_paused()
        args = ["commit-tree", tree] + (["-p", parent] if parent else [])
        new = self.run(*args, istream=_Stdin(msg)).strip()
        self.update_branch(new, parent, msg.splitlines()[0])
        return new

    def update_branch(self, new: str, expected: str | None, why: str) -> None:
        """Move the daemon's branch from `expected` to `new`, atomically, or raise: HeadMoved
        when the branch is no longer at `expected`, Paused when the person's git took the
        store meanwhile, StoreError when git could not write.

        Moving the branch HEAD points to also locks HEAD (for its reflog): a person's
        checkout or commit holding that lock for an instant fails the update with "cannot
        lock ref" while the branch has not moved. That is retried (the update is a
        compare-and-swap, so a retry can never land twice) for up to LOCK_WAIT seconds,
        and ends as a pause when the person's command leaves the store on another branch."""
        ref = f"refs/heads/{self.branch}"
        deadline = time.monotonic() + LOCK_WAIT
        while True:
            try:
                self.run("update-ref", "-m", f"clagd: {why}"[:200], ref, new, expected or "")
                break
            except GitCommandError as exc:
                now = self.branch_head()
                if now != expected:
                    raise HeadMoved(
                        f"branch {self.branch!r} moved to {str(now)[:10]} while clagd "
                        f"committed on {str(expected)[:10]}"
                    ) from None
                retry = "cannot lock ref" in str(exc.stderr) and time.monotonic() < deadline
                if retry:
                    time.sleep(0.05)  # the person's command ends, or moves HEAD meanwhile
                reason = self.pause_reason()
                if reason:
                    raise Paused(reason) from None
                if not retry:
                    raise StoreError(f"cannot update {ref}: {_first_line(exc.stderr)}") from None
        self.base = new

    def revert(self, sha: str, subject: str, trailers: dict[str, Any]) -> str:
        """`git revert` one commit, with our own message and trailers; a conflict is refused
        and leaves the store exactly as it was."""
        full = self.revert_apply(sha)
        return self.revert_commit(full, subject, trailers)

    def revert_apply(self, sha: str) -> str:
        """Stage the revert of one commit without committing it (so the caller can check
        the result first); a conflict is refused and leaves the store as it was."""
        full = self.resolve(sha)
        try:
            self.run("revert", "--no-commit", "--no-edit", full)
        except GitCommandError as exc:
            self.revert_abort()
            raise Conflict(f"cannot revert {full[:10]}: {_first_line(exc.stderr)}") from None
        return full

    def revert_abort(self) -> None:
        for cmd in (("revert", "--abort"), ("reset", "-q", "--merge")):
            try:
                self.run(*cmd)
            except GitCommandError:
                pass

    def revert_commit(
        self, full: str, subject: str, trailers: dict[str, Any], paths: list[str] | None = None
    ) -> str:
        """Commit the staged revert on top of `base` (compare-and-swap, as `commit`).
        `paths`: the files the revert staged; git follows renames, so a change to a cluster
        that was archived since lands in `archive/`, a path the reverted commit never had."""
        msg = format_message(subject, f"This reverts commit {full}.", trailers)
        try:
            # drops REVERT_HEAD (our own operation, staged and checked): index and files stay
            self.run("revert", "--quit")
        except GitCommandError:
            pass
        # only the revert's files (a person's staged changes stay theirs)
        files = sorted(set(self.changed_files(full)) | set(paths or []))
        tree = self._tree_with(self.base, files)
        return self._commit_tree(tree, self.base, msg)

    def staged_files(self) -> list[str]:
        out = self.run("diff", "--cached", "--no-renames", "--name-only", "-z", "HEAD")
        return [p for p in out.split("\0") if p]

    def resolve(self, ref: str) -> str:
        if not ref or ref.startswith("-"):
            raise NotFound(f"no commit {ref!r}")
        try:
            return self.run("rev-parse", "--verify", "-q", f"{ref}^{{commit}}").strip()
        except GitCommandError:
            raise NotFound(f"no commit {ref!r} in the store") from None

    def find_by_trailer(self, key: str, value: str, limit: int = 2000) -> list[str]:
        return [e.commit for e in self.log(limit) if e.trailers.get(key.lower(), "") == value]

    def log(self, n: int = 20, rev: str = "HEAD") -> list[CommitInfo]:
        if not self.head():
            return []
        fmt = _FIELD.join(["%H", "%aI", "%s", "%(trailers:only,unfold)", "%P"]) + _RECORD
        out = self.run("log", f"-n{int(n)}", f"--format={fmt}", rev)
        entries = []
        for rec in out.split(_RECORD):
            rec = rec.strip("\n")
            if not rec:
                continue
            sha, date, subject, trailer_text, parents = (rec.split(_FIELD) + [""] * 5)[:5]
            trailers: dict[str, str] = {}
            for line in trailer_text.splitlines():
                k, sep, v = line.partition(":")
                if sep and k.startswith(TRAILER_PREFIX):
                    trailers[k[len(TRAILER_PREFIX) :].lower()] = v.strip()
            kind = trailers.get("kind", "outside")
            entries.append(CommitInfo(sha, date, subject, kind, trailers, tuple(parents.split())))
        return entries

    def changed_between(self, old: str, new: str, dirs: Iterable[str]) -> list[str]:
        """Files under `dirs` that differ between two commits (renames as delete + add, so a
        moved memory's old file is listed too)."""
        out = self.run("diff", "--name-only", "--no-renames", old, new, "--", *dirs)
        return [p for p in out.splitlines() if p.strip()]

    def changed_files(self, sha: str) -> list[str]:
        out = self.run("show", "--name-only", "--no-renames", "--format=", sha)
        return [line for line in out.splitlines() if line.strip()]

    def fsck(self) -> str:
        return self.run("fsck", "--no-progress", "--full", with_extended_output=False)

    def push(self, remote: str, branch: str) -> None:
        self.run("push", "-q", remote, f"HEAD:refs/heads/{branch}")


class _Stdin:
    """A tiny file-like object for `istream=`: GitPython hands it to subprocess as stdin."""

    def __init__(self, text: str) -> None:
        import tempfile

        self._f = tempfile.TemporaryFile()
        self._f.write(text.encode("utf-8"))
        self._f.seek(0)

    def fileno(self) -> int:
        return self._f.fileno()

    def __del__(self) -> None:
        try:
            self._f.close()
        except Exception:
            pass


def _first_line(text: Any) -> str:
    for line in str(text or "").splitlines():
        line = line.strip().removeprefix("stderr:").strip().strip("'").strip()
        if line:
            return line
    return str(text).strip()


def blob_id(data: bytes, algo: str = "sha1") -> str:
    """The object id git gives a file with these bytes."""
    h = hashlib.new(algo)
    h.update(b"blob %d\0" % len(data))
    h.update(data)
    return h.hexdigest()


def drop_broken_objects(objects: Path, since: float) -> list[str]:
    """Remove the loose objects changed since `since` (a wall-clock time) that do not
    inflate to their own hash: what a power loss can leave of an object never flushed."""
    dropped = []
    for fan in os.scandir(objects):
        if len(fan.name) != 2 or not fan.is_dir() or fan.stat().st_mtime < since:
            continue  # no entry was added to a folder older than `since`
        for entry in os.scandir(fan.path):
            name = fan.name + entry.name
            if len(name) not in (40, 64) or entry.stat().st_mtime < since:
                continue
            try:
                raw = zlib.decompress(Path(entry.path).read_bytes())
                algo = hashlib.sha1 if len(name) == 40 else hashlib.sha256
                ok = algo(raw).hexdigest() == name
            except (OSError, zlib.error):
                ok = False
            if not ok:
                Path(entry.path).unlink(missing_ok=True)
                dropped.append(name)
    return dropped


__all__ = ["GitStore", "format_message"]
