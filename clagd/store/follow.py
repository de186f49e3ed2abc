"""A follower's side of git: the clone of a primary's remote, its fetches, the move of the
working copy to the fetched commit, and the prune that drops what a rewrite removed.

A follower is a read-only store: `.git/config` records the remote it follows
(`clagd.follow`), so that `clagd run` on it refuses to start a second writer of that history.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from clagd.errors import GitFailed, StoreError
from clagd.store import gitcmd
from clagd.store.gitrepo import BRANCH_KEY, GitStore

FOLLOW_KEY = "clagd.follow"  # git config: the remote this store follows (a follower)
TRACKING = "refs/remotes/origin"  # + "/<branch>": the fetched branch of the primary
GIT_ENV = {**gitcmd.GIT_ENV, "GIT_ASKPASS": "true", "SSH_ASKPASS": "true"}


class FollowError(StoreError):
    """The remote cannot be followed: unreachable, refused, not a clagd store, or a history
    that no longer contains the follower's (the message says which, in git's words)."""

    code = "follow"


def _git_error(exc: GitFailed | subprocess.CalledProcessError) -> str:
    err = exc.stderr if exc.stderr else str(exc)
    if isinstance(err, bytes):
        err = err.decode("utf-8", "replace")
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    lines = [ln.removeprefix("stderr:").strip().strip("'") for ln in lines]
    return " ".join(ln for ln in lines if ln)[:400] or "git failed"


def check_remote(remote: str) -> str:
    """A remote is a URL or a path; never something git would take for an option."""
    if not remote or remote.startswith("-") or any(c in remote for c in "\n\r\0"):
        raise FollowError(f"{remote!r} is not a git remote (a URL or a path)")
    return remote


def following(root: Path) -> str | None:
    """The remote the store at `root` follows, or None when it is a primary (or no store)."""
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "config", "--get", FOLLOW_KEY],
            capture_output=True,
            text=True,
            env={**os.environ, **GIT_ENV},
            check=False,
        )
    except OSError:
        return None
    return out.stdout.strip() or None


def clone(remote: str, dest: Path, branch: str) -> None:
    """Clone `branch` of `remote` into `dest` (which must not exist or be empty) and mark
    it a follower. A repository that is not a clagd store is refused and removed again."""
    check_remote(remote)
    cmd = ["git", "clone", "-q", "--no-tags", "--single-branch", "--branch", branch]
    try:
        subprocess.run(
            [*cmd, "--", remote, str(dest)],
            capture_output=True,
            text=True,
            env={**os.environ, **GIT_ENV},
            check=True,
            timeout=600,
        )
    except subprocess.CalledProcessError as exc:
        raise FollowError(f"cannot clone {remote} (branch {branch}): {_git_error(exc)}") from None
    if not (dest / "clagd.yaml").is_file():
        _remove_tree(dest)
        raise FollowError(
            f"{remote} is not a clagd store (its branch {branch} has no clagd.yaml at the top); "
            "a follower serves the repository a clagd daemon pushes to (replication.remote)"
        )
    git = GitStore(dest, branch)
    git.run("config", FOLLOW_KEY, remote)
    git.run("config", BRANCH_KEY, branch)
    git.run("config", "gc.auto", "0")
    git.make_private()


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


@dataclass(frozen=True)
class Fetched:
    """One successful fetch: the primary's commit, and whether it contains ours."""

    commit: str
    contains_ours: bool
    behind: int


class RemoteBranch:
    """The primary's branch as the follower sees it (every call runs git in `git.root`)."""

    def __init__(self, git: GitStore, remote: str, branch: str) -> None:
        self.git = git
        self.remote = check_remote(remote)
        self.branch = branch

    def fetch(self, timeout: float = 60.0) -> Fetched:
        """Fetch the branch (forced: a rewrite on the primary is taken as it is)."""
        tracking = f"{TRACKING}/{self.branch}"
        refspec = f"+refs/heads/{self.branch}:{tracking}"
        try:
            self.git.run(
                "fetch",
                "-q",
                "--no-tags",
                "--no-write-fetch-head",
                "--",
                self.remote,
                refspec,
                kill_after_timeout=timeout,
            )
            commit = self.git.run("rev-parse", "--verify", "-q", f"{tracking}^{{commit}}").strip()
        except GitFailed as exc:
            raise FollowError(f"fetch from {self.remote} failed: {_git_error(exc)}") from None
        ours = self.git.head()
        contains = ours is None or ours == commit or self.git.is_ancestor(ours, commit)
        return Fetched(commit, contains, self._count(ours, commit) if contains else 0)

    def _count(self, ours: str | None, theirs: str) -> int:
        rng = theirs if ours is None else f"{ours}..{theirs}"
        try:
            return int(self.git.run("rev-list", "--count", rng).strip() or 0)
        except (GitFailed, ValueError):
            return 0

    def check_store(self, commit: str) -> None:
        """Refuse a fetched commit that is not a clagd store (no clagd.yaml at its top)."""
        try:
            self.git.run("cat-file", "-e", f"{commit}:clagd.yaml")
        except GitFailed:
            raise FollowError(
                f"{self.remote} branch {self.branch} is no longer a clagd store "
                f"(commit {commit[:10]} has no clagd.yaml); still serving the last good state"
            ) from None

    @staticmethod
    def discard_local(root: Path) -> None:
        """The working copy and index to HEAD (a follower's, before its engine loads)."""
        try:
            GitStore(root).run("reset", "-q", "--hard")
        except GitFailed as exc:
            raise FollowError(f"cannot reset {root} to HEAD: {_git_error(exc)}") from None

    def move_to(self, commit: str) -> None:
        """Branch, index and working tree to `commit` (on the writer thread: it owns them).
        Whatever a person changed in a follower's files goes: a follower serves the
        primary's history and nothing else."""
        try:
            self.git.run("reset", "-q", "--hard", commit)
        except GitFailed as exc:
            raise FollowError(f"cannot move to {commit[:10]}: {_git_error(exc)}") from None

    def prune(self) -> None:
        """After a rewrite: drop every object no ref reaches any more (reflogs expired first,
        ORIG_HEAD removed), so that nothing the primary purged stays in this repository."""
        (self.git.gitdir / "ORIG_HEAD").unlink(missing_ok=True)
        try:
            self.git.run("reflog", "expire", "--expire=now", "--expire-unreachable=now", "--all")
            self.git.run("gc", "-q", "--prune=now", kill_after_timeout=600)
        except GitFailed as exc:
            raise FollowError(f"pruning after a rewrite failed: {_git_error(exc)}") from None
