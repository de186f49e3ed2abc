"""`GitStore`: the store's repository, as the rest of clagd sees it.

Git runs through GitPython's command wrapper, never its object layer; every change of memory
content or organization is one commit with trailers that say what kind of change it was. The
parts, cut the way dulwich cuts git:

- `gitcmd`: running git, the one place GitPython's errors become clagd's (`GitFailed`);
- `gitstate`: what git is in the middle of (the person's operations, locks, crash leftovers);
- `gitrefs`: the daemon's branch and base, moved only by compare-and-swap;
- `gitcommit`: commits built in a scratch index (`commit-tree`, then the compare-and-swap);
- `gitlog`: commit messages with trailers, written and read back;
- here: set-up, crash recovery, the working tree, reverts, diffs, fsck and push.
"""

from __future__ import annotations

import hashlib
import logging
import subprocess
from collections.abc import Iterable
from typing import Any

from clagd.errors import Conflict, GitFailed
from clagd.store import gitstate
from clagd.store.gitcmd import first_line, git_env
from clagd.store.gitcommit import Commits
from clagd.store.gitlog import CommitInfo, format_message, read_log
from clagd.store.gitrefs import BRANCH_KEY

REGULAR_MODES = ("100644", "100755")  # git's modes of a regular file

log = logging.getLogger("clagd.git")


class GitStore(Commits):
    """The store's repository. `branch` is the daemon's own branch: it commits nowhere else.
    `base` is the commit the daemon's view was loaded from: a commit of its own is made on
    top of exactly that commit, or not at all (`commit` raises HeadMoved)."""

    def init(self) -> None:
        if not self.gitdir.exists():
            self.run("init", "-q", "-b", "main")
            self.run("config", BRANCH_KEY, "main")
        self.make_private()
        for key, value in (("core.fsync", "all"), ("core.fsyncMethod", "fsync")):
            if not self.succeeds("config", key, value):  # an old git without core.fsync
                log.warning("git does not support %s; commits rely on the OS to flush", key)
        self.run("config", "gc.auto", "0")  # no gc in the daemon's write path

    def make_private(self) -> None:
        """Objects, refs and logs git creates are 0600/0700 whatever the umask (the
        daemon's umask is 077 too; a person's git commands in the store obey this). A
        sharing the person set up themselves is left alone."""
        if not self.succeeds("config", "--get", "core.sharedRepository"):
            self.run("config", "core.sharedRepository", "0600")

    def recover(self, own_operation: bool = False) -> list[str]:
        """Undo what a killed daemon (or a crashed git) left behind. Called at start-up,
        with the store lock held, so a stale lock file is not ours to keep. A revert or
        cherry-pick in progress is abandoned only when `own_operation` (the daemon's
        transaction marker says it was its own revert): a person's merge, rebase or
        revert is theirs to finish, and the daemon waits for it (`pause_reason`)."""
        notes = gitstate.remove_stale_locks(self.gitdir, self.commondir)
        for marker in ("REVERT_HEAD", "CHERRY_PICK_HEAD") if own_operation else ():
            if (self.gitdir / marker).exists():
                self.succeeds("revert", "--quit")
                self.succeeds("cherry-pick", "--quit")
                notes.append(f"abandoned an unfinished git operation ({marker})")
        notes += gitstate.drop_unsynced(self.gitdir, self.commondir)
        # Refresh the stat data in git's index once: after a clone, a copy, or a commit made
        # in the same second as a file's last write, every `git status` (run with
        # GIT_OPTIONAL_LOCKS=0, so it never saves a refresh) would re-read and hash those
        # files again (~0.1 s per status at 2,000 cluster files). A failure lists changed
        # files as such, which are none of this step's business.
        self.succeeds("update-index", "-q", "--refresh")
        return notes

    # -- the working tree -------------------------------------------------------------------
    def reset_paths_to_head(self, dirs: Iterable[str]) -> None:
        """Drop uncommitted changes under the given folders (a half-applied operation)."""
        dirs = [d for d in dirs]
        if self.head():
            self.run("reset", "-q", "HEAD", "--", *dirs)
            self.succeeds("checkout", "-q", "HEAD", "--", *dirs)  # fails where nothing is tracked
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
            # regular files only: a symlink committed in place of a memory file (mode
            # 120000) holds its target's name, not memories (store/special.py)
            if path and meta.split()[1] == "blob" and meta.split()[0] in REGULAR_MODES:
                entries.append((path, meta.split()[2]))
        if not entries:
            return {}
        proc = subprocess.run(
            ["git", "cat-file", "--batch"],
            cwd=self.root,
            input="".join(f"{sha}\n" for _p, sha in entries).encode(),
            capture_output=True,
            check=False,
            env=git_env(),
        )
        if proc.returncode != 0:
            err = proc.stderr.decode(errors="replace")
            why = first_line(err) or f"exited with {proc.returncode}"
            raise GitFailed(f"git cat-file: {why}", err, proc.returncode)
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
        return self.dirty_and_staged(dirs)[0]

    def dirty_and_staged(self, dirs: Iterable[str]) -> tuple[list[str], list[str]]:
        """Paths under `dirs` that differ from HEAD (working tree or index), and those of
        them whose index entry differs (staged), from one `git status`."""
        # --no-optional-locks: git's index is never rewritten by the check (`ChangeWatch`
        # knows the index the daemon last saw: a rewrite would read as a person's staging)
        out = self.run(
            "--no-optional-locks", "status", "--porcelain=v1", "-z", "--no-renames",
            "--untracked-files=all", "--", *dirs,
        )  # fmt: skip
        paths, staged = [], []
        for entry in out.split("\0"):
            if len(entry) > 3:
                paths.append(entry[3:])
                if entry[0] not in " ?":
                    staged.append(entry[3:])
        return paths, staged

    # -- reverts and history ---------------------------------------------------------------
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
        except GitFailed as exc:
            self.revert_abort()
            raise Conflict(
                f"cannot revert {full[:10]}: {first_line(exc.stderr)}{self._later(full)}"
            ) from None
        return full

    def _later(self, full: str) -> str:
        """Why a revert conflicts, in words: the later commits that changed its files."""
        files = self.changed_files(full)
        if not files:
            return ""
        out = self.run("log", "--format=%H %s", f"{full}..HEAD", "--", *files)
        later = [line[:10] + line[40:] for line in out.splitlines() if line.strip()]
        if not later:
            return ""
        names = "; ".join(later[:3]) + (f"; and {len(later) - 3} more" if len(later) > 3 else "")
        return f" (later commits changed the same files: {names})"

    def revert_abort(self) -> None:
        self.succeeds("revert", "--abort")
        self.succeeds("reset", "-q", "--merge")

    def revert_commit(
        self, full: str, subject: str, trailers: dict[str, Any], paths: list[str] | None = None
    ) -> str:
        """Commit the staged revert on top of `base` (compare-and-swap, as `commit`).
        `paths`: the files the revert staged; git follows renames, so a change to a cluster
        that was archived since lands in `archive/`, a path the reverted commit never had."""
        msg = format_message(subject, f"This reverts commit {full}.", trailers)
        # drops REVERT_HEAD (our own operation, staged and checked): index and files stay
        self.succeeds("revert", "--quit")
        # only the revert's files (a person's staged changes stay theirs)
        files = sorted(set(self.changed_files(full)) | set(paths or []))
        tree = self.build_tree(self.base, files)
        return self.commit_tree(tree, self.base, msg)

    def staged_differ(self, rel_paths: list[str]) -> bool:
        """Whether the index holds a change to any of these paths against HEAD."""
        out = self.run("diff", "--cached", "--no-renames", "--name-only", "HEAD", "--", *rel_paths)
        return bool(out.strip())

    def staged_files(self) -> list[str]:
        out = self.run("diff", "--cached", "--no-renames", "--name-only", "-z", "HEAD")
        return [p for p in out.split("\0") if p]

    def find_by_trailer(self, key: str, value: str, limit: int = 2000) -> list[str]:
        return [e.commit for e in self.log(limit) if e.trailers.get(key.lower(), "") == value]

    def log(self, n: int = 20, rev: str = "HEAD") -> list[CommitInfo]:
        if not self.head():
            return []
        return read_log(self.run, n, rev)

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
        # after `--`: a remote is never read as an option (config_checks validates it too)
        self.run("push", "-q", "--", remote, f"HEAD:refs/heads/{branch}")


def blob_id(data: bytes, algo: str = "sha1") -> str:
    """The object id git gives a file with these bytes."""
    h = hashlib.new(algo)
    h.update(b"blob %d\0" % len(data))
    h.update(data)
    return h.hexdigest()


__all__ = ["CommitInfo", "GitStore", "blob_id", "format_message"]
