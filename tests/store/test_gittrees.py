"""The tree writer (store/gittrees.py): a commit's trees made from its base's trees and the
changed entries, written by one long-running `git hash-object -t tree`. Checked against
git's own `write-tree` of the same entries, in real repositories."""

from __future__ import annotations

import os
import random
import subprocess
from pathlib import Path

import pytest
from helpers import git

from clagd.store.gitcmd import git_env
from clagd.store.gitrepo import GitStore
from clagd.store.gittrees import TreesUnsupported, TreeWriter

ZERO = "0" * 40
# folder names and file names that sort differently as folders ("a.b/" after "a.b.c",
# "a-b/" before it, "a/" after "a.b/"), none both a folder and a file in one folder
DIRS = ["a", "a.b", "a-b", "a0", "sub"]
FILES = ["a.b.c", "a.yaml", "f", "F", "f-x", "f.x", "f0", "é.yaml", "c-0001.yaml"]
MODES = ["100644", "100644", "100644", "100755", "120000"]


def _blob(repo: Path, text: str) -> str:
    return (
        subprocess.run(
            ["git", "hash-object", "-w", "--stdin"],
            cwd=repo,
            input=text.encode(),
            check=True,
            capture_output=True,
        )
        .stdout.decode()
        .strip()
    )


def _git_tree(repo: Path, base: str | None, changes: dict[str, tuple[str, str] | None]) -> str:
    """What git's own `write-tree` makes of `base` with these entries."""
    env = git_env({"GIT_INDEX_FILE": str(repo / ".git" / "test-index")})
    run = {"cwd": repo, "env": env, "check": True, "capture_output": True}
    subprocess.run(["git", "read-tree", *([base] if base else ["--empty"])], **run)  # type: ignore[call-overload]
    info = "".join(
        f"0 {ZERO}\t{p}\0" if c is None else f"{c[0]} {c[1]} 0\t{p}\0" for p, c in changes.items()
    )
    subprocess.run(["git", "update-index", "-z", "--index-info"], input=info.encode(), **run)  # type: ignore[call-overload]
    out = subprocess.run(["git", "write-tree", "--missing-ok"], **run)  # type: ignore[call-overload]
    return str(out.stdout.decode().strip())


def test_the_tree_writer_makes_the_trees_git_makes(tmp_path: Path) -> None:
    """Random changes (added, changed, removed files, down to three folders deep, names that
    sort differently as folders and as files, executable files and symlinks, folders left
    empty): every tree equals git's `write-tree` of the same base and entries, and the
    repository passes `git fsck --strict`."""
    repo = tmp_path / "r"
    repo.mkdir()
    git(repo, "init", "-q")
    writer = TreeWriter(repo, repo / ".git")
    rnd = random.Random(11)
    blobs = [_blob(repo, f"content {i}\n") for i in range(6)]
    have: dict[str, tuple[str, str]] = {}
    base: str | None = None
    try:
        for step in range(60):
            changes: dict[str, tuple[str, str] | None] = {}
            for _ in range(rnd.randint(1, 6)):
                if have and rnd.random() < 0.35:
                    changes[rnd.choice(sorted(have))] = None
                    continue
                depth = rnd.choice([0, 1, 1, 2, 3])
                path = "/".join([*(rnd.choice(DIRS) for _ in range(depth)), rnd.choice(FILES)])
                changes[path] = (rnd.choice(MODES), rnd.choice(blobs))
            want = _git_tree(repo, base, changes)
            got = writer.tree_with(base, changes, ())
            assert got == want, (step, changes)
            for p, c in changes.items():
                if c is None:
                    have.pop(p, None)
                else:
                    have[p] = c
            base = got
            listed = [e for e in git(repo, "ls-tree", "-r", "-z", base).split("\0") if e]
            assert {e.split("\t", 1)[1] for e in listed} == set(have)
        commit = git(repo, "commit-tree", base, "-m", "trees").strip()
        git(repo, "update-ref", "refs/heads/main", commit)
        git(repo, "fsck", "--strict", "--no-dangling")
    finally:
        writer.close()


def test_what_the_tree_writer_does_not_make_is_left_to_git(tmp_path: Path) -> None:
    """A file where the base has a folder (or the other way round), a path git would not
    take, or a repository of SHA-256 ids raises TreesUnsupported (the caller builds that
    tree in its scratch index); a `hash-object` that died is started again for the next
    tree."""
    repo = tmp_path / "r"
    repo.mkdir()
    git(repo, "init", "-q")
    writer = TreeWriter(repo, repo / ".git")
    blob = _blob(repo, "x\n")
    try:
        base = writer.tree_with(None, {"clusters/c-1.yaml": ("100644", blob)}, ())
        with pytest.raises(TreesUnsupported):
            writer.tree_with(base, {"clusters": ("100644", blob)}, ())
        with pytest.raises(TreesUnsupported):
            writer.tree_with(base, {"clusters/c-1.yaml/x": ("100644", blob)}, ())
        for bad in ("/abs", "a//b", "dir/", ".git/x", "a/../b"):
            with pytest.raises(TreesUnsupported):
                writer.tree_with(base, {bad: ("100644", blob)}, ())
        (proc,) = writer._procs.values()  # noqa: SLF001
        proc.kill()
        proc.wait()
        again = writer.tree_with(base, {"unsorted/u-1.yaml": ("100644", blob)}, ())
        assert again == _git_tree(repo, base, {"unsorted/u-1.yaml": ("100644", blob)})
    finally:
        writer.close()
    assert not writer._procs  # noqa: SLF001
    sha256 = tmp_path / "s"
    sha256.mkdir()
    git(sha256, "init", "-q", "--object-format=sha256")
    other = TreeWriter(sha256, sha256 / ".git")
    try:
        with pytest.raises(TreesUnsupported):  # SHA-256 ids: left to git
            other.tree_with(None, {"a.yaml": ("100644", _blob(sha256, "x\n"))}, ())
    finally:
        other.close()


def test_the_tree_writer_ends_with_its_store(store: Path) -> None:
    """The `hash-object` process ends when the store object is closed, and when it is
    dropped without being closed (a command-line run)."""
    gs = GitStore(store)
    (store / "unsorted" / "u-a.yaml").write_text("memories: []\n")
    assert gs.commit(["unsorted/u-a.yaml"], "write u-a")
    (proc,) = gs.tree_writer._procs.values()  # noqa: SLF001
    assert proc.poll() is None
    del gs
    assert proc.wait(timeout=10) == 0
    assert not os.path.exists(f"/proc/{proc.pid}")


def test_a_killed_daemons_tree_file_is_removed_at_start_up(store: Path) -> None:
    """A tree file lives only while its tree is written; one a kill left behind (older than
    a minute) is removed by the start-up's recovery, a fresh one (another process writing
    its tree now) is left alone."""
    gitdir = store / ".git"
    old, fresh = gitdir / "clagd-tree-abc.tmp", gitdir / "clagd-tree-def.tmp"
    for f in (old, fresh):
        f.write_bytes(b"100644 x\0" + bytes(20))
    os.utime(old, (1, 1))
    notes = GitStore(store).recover()
    assert not old.exists() and fresh.exists()
    assert any("tree writer" in n for n in notes), notes
