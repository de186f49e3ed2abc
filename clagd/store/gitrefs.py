"""The daemon's branch and the commit its view is on, moved only by compare-and-swap.

`branch` is the daemon's own branch: it commits nowhere else. `base` is the commit the
daemon's view was loaded from: `update_branch` moves the branch from exactly that commit
(`git update-ref REF NEW OLD`, as dulwich's `set_if_equals`), or raises HeadMoved.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from clagd.errors import GitFailed, HeadMoved, NotFound, Paused, StoreError
from clagd.store import gitstate
from clagd.store.gitcmd import LOCK_WAIT, GitRunner, first_line

# in .git/: the commit the daemon's view was last on (survives `git clean -fdx`)
BASE_FILE = "clagd-base"
# git config key recording the branch the store was created with (the daemon's own branch)
BRANCH_KEY = "clagd.branch"


class Refs(GitRunner):
    """HEAD, the daemon's branch and its base; whether the person's git holds the store."""

    def __init__(self, root: Path, branch: str = "") -> None:
        super().__init__(root)
        self._branch = branch
        self._base: str | None = None
        self._base_known = False

    def head(self) -> str | None:
        try:
            return gitstate.read_head(self.gitdir, self.commondir)
        except gitstate.RefNotRead:
            pass
        try:
            return self.run("rev-parse", "--verify", "-q", "HEAD").strip() or None
        except GitFailed:
            return None

    def resolve(self, ref: str) -> str:
        if not ref or ref.startswith("-"):
            raise NotFound(f"no commit {ref!r}")
        try:
            return self.run("rev-parse", "--verify", "-q", f"{ref}^{{commit}}").strip()
        except GitFailed:
            raise NotFound(f"no commit {ref!r} in the store") from None

    def is_ancestor(self, old: str, new: str) -> bool:
        return self.succeeds("merge-base", "--is-ancestor", old, new)

    # -- the daemon's own branch ----------------------------------------------------------
    @property
    def branch(self) -> str:
        if not self._branch:
            self._branch = self.own_branch()
        return self._branch

    @branch.setter
    def branch(self, name: str) -> None:
        self._branch = name

    def own_branch(self, configured: str = "") -> str:
        """The branch the daemon commits on: configured, else the one the store was created
        with (recorded by `init`), else the one checked out, else main."""
        if configured:
            return configured
        try:
            recorded = self.run("config", "--get", BRANCH_KEY).strip()
        except GitFailed:
            recorded = ""
        if recorded:
            return recorded
        current = self.current_branch()
        return current or "main"

    def current_branch(self) -> str | None:
        """The branch HEAD points to; None when HEAD is detached."""
        return gitstate.current_branch(self.gitdir)

    def branch_head(self) -> str | None:
        """The commit the daemon's branch points to (None: the branch does not exist)."""
        try:
            return gitstate.read_branch(self.commondir, self.branch)
        except gitstate.RefNotRead:
            pass
        try:
            out = self.run("rev-parse", "--verify", "-q", f"refs/heads/{self.branch}^{{commit}}")
            return out.strip() or None
        except GitFailed:
            return None

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

    # -- the person's git ------------------------------------------------------------------
    def pause_reason(self, wait: bool = False, locks: bool = True) -> str | None:
        """Why the daemon must not write now (None: it may); see `gitstate.pause_reason`."""
        return gitstate.pause_reason(self.gitdir, self.branch, wait, locks, self.commondir)

    def check_not_paused(self) -> None:
        """Raise Paused when the person's git holds the store (checked again right before
        the branch is moved: a merge started while the daemon was writing wins)."""
        reason = self.pause_reason()
        if reason:
            raise Paused(reason)

    # -- compare-and-swap -----------------------------------------------------------------
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
            except GitFailed as exc:
                now = self.branch_head()
                if now != expected:
                    raise HeadMoved(
                        f"branch {self.branch!r} moved to {str(now)[:10]} while clagd "
                        f"committed on {str(expected)[:10]}"
                    ) from None
                retry = "cannot lock ref" in exc.stderr and time.monotonic() < deadline
                if retry:
                    time.sleep(0.05)  # the person's command ends, or moves HEAD meanwhile
                reason = self.pause_reason()
                if reason:
                    raise Paused(reason) from None
                if not retry:
                    raise StoreError(f"cannot update {ref}: {first_line(exc.stderr)}") from None
        self.base = new
