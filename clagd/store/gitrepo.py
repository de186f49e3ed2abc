"""Git, through GitPython's command wrapper (`git.cmd.Git`), never its object layer.

Every change of memory content or organization is one commit with trailers that say what
kind of change it was; `log()` reads them back for `clagd log`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from git.cmd import Git
from git.exc import GitCommandError

from clagd.errors import Conflict, NotFound
from clagd.store.durable import fsync_dir

log = logging.getLogger("clagd.git")

IDENTITY = ("-c", "user.name=clagd", "-c", "user.email=clagd@localhost")
TRAILER_PREFIX = "Clagd-"
_FIELD = "\x1f"
_RECORD = "\x1e"
# in .git/: present while objects written without fsync may not be flushed yet
UNSYNCED = "clagd-unsynced-objects"


def format_message(subject: str, body: str = "", trailers: dict[str, Any] | None = None) -> str:
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


class GitStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.git = Git(str(self.root))
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
        """Run git, retrying briefly while another git process holds the index lock."""
        deadline = time.monotonic() + 10.0
        while True:
            try:
                return str(self.git.execute(["git", *IDENTITY, *args], **kw))
            except GitCommandError as exc:
                # only a lock held by another git process is worth waiting for; a failed
                # write of our own lock (ENOSPC, a read-only store) also names index.lock
                err = str(exc.stderr)
                if "index.lock" in err and "File exists" in err and time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                raise

    def init(self) -> None:
        self.run("init", "-q", "-b", "main") if not (self.root / ".git").exists() else None
        for key, value in (("core.fsync", "all"), ("core.fsyncMethod", "fsync")):
            try:
                self.run("config", key, value)
            except GitCommandError:  # an old git without core.fsync
                log.warning("git does not support %s; commits rely on the OS to flush", key)
        self.run("config", "gc.auto", "0")  # no gc in the daemon's write path

    def head(self) -> str | None:
        try:
            return self.run("rev-parse", "--verify", "-q", "HEAD").strip() or None
        except GitCommandError:
            return None

    def recover(self) -> list[str]:
        """Undo what a killed daemon (or a crashed git) left behind. Called at start-up,
        with the store lock held, so any lock file or half-done revert is not ours to keep."""
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
        for marker in ("REVERT_HEAD", "CHERRY_PICK_HEAD", "MERGE_HEAD"):
            if (gitdir / marker).exists():
                for cmd in (("revert", "--quit"), ("cherry-pick", "--quit"), ("merge", "--quit")):
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
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
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

    def dirty_paths(self, dirs: Iterable[str]) -> list[str]:
        out = self.run("status", "--porcelain=v1", "-z", "--untracked-files=all", "--", *dirs)
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
    ) -> str | None:
        """Stage exactly `paths` (added, changed or deleted) and commit only them.

        With `flush`, `git add` writes its objects without an fsync each (core.fsync=none)
        and `flush()` is called after it, before `git commit`: it must make them durable
        (the writer's one syncfs per commit), so that no commit refers to an object that a
        power loss could take. The commit object, trees and ref keep git's own fsync.

        Returns the new commit, or None when nothing changed."""
        paths = sorted(set(paths))
        if paths:
            # --ignore-removal is not wanted: a deleted file must be staged as deleted.
            if flush is None:
                self.run("add", "-A", "--", *paths)
            else:
                self._mark_unsynced()
                self.run("-c", "core.fsync=none", "add", "-A", "--", *paths)
        if flush is not None:
            flush()
            # syncfs (or sync) flushed every object written since the mark, a failed add's too
            (self.root / ".git" / UNSYNCED).unlink(missing_ok=True)
        staged = self.run("diff", "--cached", "--name-only", "--", *paths).strip() if paths else ""
        if not staged and not allow_empty:
            return None
        msg = format_message(subject, body, trailers)
        args = ["commit", "-q", "--no-verify", "-F", "-"]
        if allow_empty:
            args.append("--allow-empty")
        if paths and staged:
            args += ["--", *paths]
        self.run(*args, istream=_Stdin(msg))
        head = self.head()
        assert head is not None
        return head

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

    def revert_commit(self, full: str, subject: str, trailers: dict[str, Any]) -> str:
        msg = format_message(subject, f"This reverts commit {full}.", trailers)
        self.run("commit", "-q", "--no-verify", "--allow-empty", "-F", "-", istream=_Stdin(msg))
        head = self.head()
        assert head is not None
        return head

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
        return [
            e["commit"] for e in self.log(limit) if str(e["trailers"].get(key.lower(), "")) == value
        ]

    def log(self, n: int = 20, rev: str = "HEAD") -> list[dict[str, Any]]:
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
            entries.append(
                {
                    "commit": sha,
                    "date": date,
                    "subject": subject,
                    "kind": trailers.get("kind", "outside"),
                    "trailers": trailers,
                    "parents": parents.split(),
                }
            )
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
        line = line.strip().strip("'").strip()
        if line and not line.startswith("stderr:"):
            return line
    return str(text).strip()


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
