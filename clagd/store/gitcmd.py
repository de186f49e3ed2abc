"""Running git: GitPython's command wrapper (`git.cmd.Git`), never its object layer.

This is the one place GitPython's `GitCommandError` is caught: a failed git command leaves
the store as `errors.GitFailed` (a `StoreError`, protocol code `store`), whose message is
git's own reason, never its argv.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from git.cmd import Git
from git.exc import GitCommandError

from clagd.errors import GitFailed

IDENTITY = ("-c", "user.name=clagd", "-c", "user.email=clagd@localhost")
LOCK_WAIT = 3.0  # seconds a git call waits for another git process's index.lock
# the environment of every git command the daemon runs. GIT_OPTIONAL_LOCKS=0: our frequent
# `git status` must not take the index lock, or a user's own git command in the store would
# fail with "index.lock: File exists". Replacements (`git replace`) and grafts never shape
# what the daemon reads or commits: `read-tree <base>` through a replacement of the tip
# would build the next commit on an older tree and drop acknowledged memories. A graft file
# under /dev/null cannot exist (git reads none, and warns about none).
GIT_ENV = {
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_EDITOR": "true",
    "GIT_PAGER": "cat",
    "LC_ALL": "C",
    "GIT_OPTIONAL_LOCKS": "0",
    "GIT_NO_REPLACE_OBJECTS": "1",
    "GIT_GRAFT_FILE": "/dev/null/no-grafts",
}


def git_dir(root: Path) -> Path:
    """The store's git directory: `.git`, or the folder a `.git` file names (`gitdir:
    <path>`: a linked worktree, a submodule). Read from the file, no git command."""
    dot = Path(root) / ".git"
    try:
        if not dot.is_file():
            return dot
        text = dot.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return dot
    if not text.startswith("gitdir:"):
        return dot
    target = Path(text[len("gitdir:") :].strip())
    return target if target.is_absolute() else (Path(root) / target).resolve()


def common_dir(gitdir: Path) -> Path:
    """Where a linked worktree's objects and refs are (its `commondir` file); the git
    directory itself otherwise."""
    try:
        text = (gitdir / "commondir").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return gitdir
    target = Path(text)
    return target if target.is_absolute() else (gitdir / target).resolve()


def git_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The process environment with `GIT_ENV` (and `extra`): for a git run as a subprocess
    outside `GitRunner`."""
    return {**os.environ, **GIT_ENV, **(extra or {})}


class GitRunner:
    """git in one store, in a fixed environment: no pager, no editor, no prompts, a commit
    identity of its own."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.gitdir = git_dir(self.root)  # a `.git` file (linked worktree) is followed
        self.commondir = common_dir(self.gitdir)
        self.git = Git(str(self.root))
        self._lock_stuck_until = 0.0
        self.git.update_environment(**GIT_ENV)

    def run(self, *args: str, **kw: Any) -> str:
        """Run git, retrying briefly (LOCK_WAIT) while another git process holds the index
        lock. After one such wait ran out, calls fail at once for a while: a stale lock
        left by a crashed git must not make every request wait past the client's timeout.
        Raises GitFailed."""
        now = time.monotonic()
        deadline = now + (LOCK_WAIT if now >= self._lock_stuck_until else 0.0)
        while True:
            try:
                return str(self.git.execute(["git", *IDENTITY, *args], **kw))
            except GitCommandError as exc:
                # only a lock held by another git process is worth waiting for; a failed
                # write of our own lock (ENOSPC, a read-only store) also names index.lock
                err = str(exc.stderr)
                if "index.lock" not in err or "File exists" not in err:
                    raise _failed(args, exc) from None
                if time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                self._lock_stuck_until = time.monotonic() + LOCK_WAIT
                why = (
                    f"{self.gitdir / 'index.lock'} exists: another git command is running "
                    "in the store, or one crashed and left it (remove it if none runs); "
                    "clagd retries"
                )
                raise _failed(args, exc, why) from None

    def succeeds(self, *args: str) -> bool:
        """Whether a git command succeeds (its failure is an answer, not an error)."""
        try:
            self.run(*args)
            return True
        except GitFailed:
            return False


def _failed(args: tuple[str, ...], exc: GitCommandError, why: str = "") -> GitFailed:
    """The domain error of a failed git command: `why`, else git's first line of stderr,
    else its exit status, after the subcommand's name."""
    stderr = str(exc.stderr or "")
    status = exc.status if isinstance(exc.status, int) else None
    cmd = next((a for a in args if not a.startswith("-") and "=" not in a), "")
    why = why or first_line(stderr) or f"exited with {exc.status}"
    return GitFailed(f"git {cmd}: {why}" if cmd else f"git: {why}", stderr, status)


class Stdin:
    """A tiny file-like object for `istream=`: GitPython hands it to subprocess as stdin."""

    def __init__(self, text: str) -> None:
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


def first_line(text: Any) -> str:
    """The first line of git's stderr as GitPython quotes it ("stderr: 'fatal: ...'")."""
    for line in str(text or "").splitlines():
        line = line.strip().removeprefix("stderr:").strip().strip("'").strip()
        if line:
            return line[:500]
    return str(text or "").strip()[:500]
