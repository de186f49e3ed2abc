"""What git is in the middle of in the store, read from `.git/` itself (no git command).

- the branch HEAD is on (`current_branch`), the commit a branch or HEAD names
  (`read_branch`, `read_head`: from the ref files, where git's files backend keeps them),
  and why the daemon must not write now
  (`pause_reason`): HEAD detached or on another branch, a merge, rebase, cherry-pick or
  revert in progress (their marker files, `IN_PROGRESS`), a git command holding the index
  lock;
- what a crash leaves: the lock files of a killed git (`remove_stale_locks`), and loose
  objects written without fsync that a power loss tore (`UNSYNCED` marks the time they may
  be written; `drop_unsynced`).
"""

from __future__ import annotations

import hashlib
import os
import time
import zlib
from pathlib import Path

from clagd.store.durable import fsync_dir
from clagd.store.gitcmd import LOCK_WAIT

# in .git/: present while objects written without fsync may not be flushed yet
UNSYNCED = "clagd-unsynced-objects"
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
# a lock file younger than this may be a live git command's: it is given the time to finish
STALE_LOCK_AGE = 2.0


def current_branch(gitdir: Path) -> str | None:
    """The branch HEAD points to; None when HEAD is detached (read from .git/HEAD, so it
    is cheap enough to check before every write and in every `status`)."""
    try:
        text = (gitdir / "HEAD").read_text(encoding="utf-8").strip()
    except OSError:
        return None
    if text.startswith("ref: refs/heads/"):
        return text[len("ref: refs/heads/") :]
    return None


class RefNotRead(LookupError):
    """The ref files do not say for sure (reftable, a symbolic ref, an odd file): ask git."""


def _object_id(text: str) -> str:
    text = text.strip()
    if len(text) in (40, 64) and all(c in "0123456789abcdef" for c in text):
        return text
    raise RefNotRead(f"not an object id: {text[:50]!r}")


def read_branch(commondir: Path, branch: str) -> str | None:
    """The commit `refs/heads/<branch>` names, read from the ref files as git's files
    backend writes them (a loose ref, else `packed-refs`); None when the branch does not
    exist. Every write asked `git rev-parse` this (two of them an `add`: 4-6 ms each at 11k
    clusters, git reads its index on start). Raises RefNotRead where only git can tell."""
    if (commondir / "reftable").exists():
        raise RefNotRead("the store keeps its refs in a reftable")
    ref = f"refs/heads/{branch}"
    for _ in range(2):  # a `git pack-refs` between the two reads: the loose one again
        try:
            return _object_id((commondir / ref).read_text(encoding="ascii"))
        except FileNotFoundError:
            pass
        except (OSError, UnicodeDecodeError) as exc:
            raise RefNotRead(str(exc)) from None
        try:
            packed = (commondir / "packed-refs").read_text(encoding="utf-8")
        except FileNotFoundError:
            packed = ""
        except (OSError, UnicodeDecodeError) as exc:
            raise RefNotRead(str(exc)) from None
        for line in packed.splitlines():
            oid, _, name = line.partition(" ")
            if name == ref and not line.startswith(("#", "^")):
                return _object_id(oid)
        if not (commondir / ref).exists():
            return None
    raise RefNotRead(f"{ref} moved while read")


def read_head(gitdir: Path, commondir: Path) -> str | None:
    """The commit HEAD names (None: an unborn branch); RefNotRead where only git can tell."""
    try:
        text = (gitdir / "HEAD").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise RefNotRead(str(exc)) from None
    if text.startswith("ref: refs/heads/"):
        return read_branch(commondir, text[len("ref: refs/heads/") :])
    return _object_id(text)


def pause_reason(
    gitdir: Path,
    branch: str,
    wait: bool = False,
    locks: bool = True,
    commondir: Path | None = None,
) -> str | None:
    """Why the daemon must not write on `branch` now (None: it may): HEAD detached or on
    another branch, a merge, rebase, cherry-pick or revert in progress, or a git command of
    the person's running (its `.git/index.lock`: a checkout rewrites the working tree before
    it moves HEAD). Each reason says how the person resumes. `wait`: give a running git
    command up to LOCK_WAIT seconds to finish first. `locks=False`: from another thread than
    the writer's (whose own git commands take the lock)."""
    deadline = time.monotonic() + (LOCK_WAIT if wait else 0.0)
    while locks and (gitdir / "index.lock").exists():
        if time.monotonic() >= deadline:
            return (
                "a git command is running in the store (.git/index.lock exists; if none "
                "runs, a crashed one left it: remove it); writes resume by themselves"
            )
        time.sleep(0.02)
    for marker, what, how in IN_PROGRESS:
        if (gitdir / marker).exists():
            return f"{what} in the store; {how} (ingestion resumes by itself)"
    current = current_branch(gitdir)
    if current == branch:
        return None
    where = (
        "HEAD is detached in the store"
        if current is None
        else f"branch {current!r} is checked out in the store"
    )
    if not branch_exists(commondir or gitdir, branch):
        # renamed (`git branch -m main trunk`) or deleted: a checkout of it cannot resume
        other = current or "<branch>"
        return (
            f"{where}, and clagd's branch {branch!r} does not exist (renamed or deleted?): "
            f"to commit on {other!r}, set git.branch: {other} in clagd.yaml and restart "
            f"clagd (or run git branch -m {other} {branch})"
        )
    return f"{where} (clagd commits only on branch {branch!r}); run git checkout {branch} to resume"


def branch_exists(commondir: Path, branch: str) -> bool:
    """Whether `refs/heads/<branch>` exists, read from the ref files (a loose ref or a line
    of packed-refs); True when they cannot say (a reftable repository)."""
    if (commondir / "reftable").exists():
        return True
    if (commondir / "refs" / "heads" / branch).is_file():
        return True
    try:
        packed = (commondir / "packed-refs").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return any(line.endswith(f" refs/heads/{branch}") for line in packed.splitlines())


def remove_stale_locks(gitdir: Path, commondir: Path | None = None) -> list[str]:
    """Remove the lock files a git command killed with the daemon left behind: the index's,
    but also HEAD's, ORIG_HEAD's and the refs' (git commit locks those while it updates
    them). Only at start-up, with the store lock held. Returns what was removed.
    `commondir`: a linked worktree's shared folder (refs, packed-refs, config)."""
    common = commondir or gitdir
    notes = []
    locks = [gitdir / n for n in ("index.lock", "HEAD.lock", "ORIG_HEAD.lock")]
    locks += [common / n for n in ("packed-refs.lock", "config.lock")]
    locks += sorted((common / "refs").rglob("*.lock")) if (common / "refs").is_dir() else []
    for lock in locks:
        try:
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            continue
        if age < STALE_LOCK_AGE:
            time.sleep(STALE_LOCK_AGE - age)  # maybe a live git command of the user's
        if lock.exists():
            lock.unlink()
            where = lock.relative_to(common if lock.is_relative_to(common) else gitdir)
            notes.append(f"removed a stale .git/{where}")
    return notes


def mark_unsynced(gitdir: Path) -> None:
    """Note, durably, that objects are about to be written without fsync."""
    path = gitdir / UNSYNCED
    if path.exists():
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(path.parent)


def drop_unsynced(gitdir: Path, commondir: Path | None = None) -> list[str]:
    """After a kill (or a power loss) between `git add` and the flush: the objects written
    since the mark may be torn. Nothing refers to them, but git would reuse one for the
    same content, so the unreadable ones go."""
    unsynced = gitdir / UNSYNCED
    if not unsynced.exists():
        return []
    dropped = drop_broken_objects((commondir or gitdir) / "objects", unsynced.stat().st_mtime - 2.0)
    unsynced.unlink()
    return [f"removed {len(dropped)} unreadable loose object(s) after a crash"] if dropped else []


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
