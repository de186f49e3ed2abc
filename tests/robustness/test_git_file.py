"""A store whose `.git` is a file (`gitdir: <path>`: a linked worktree, a submodule, a
separate git dir) starts and works: the lock, the transaction marker and the daemon's other
files go to the folder it names. Before: `Not a directory: .../.git/clagd.lock`."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers import InProcessDaemon, git, head_contents, make_store

from clagd.errors import StoreLocked
from clagd.store.lock import StoreLock


def _worktree(tmp_path: Path) -> tuple[Path, Path]:
    main = make_store(tmp_path / "memory")
    git(main, "add", "-A")
    git(main, "commit", "-q", "--allow-empty", "-m", "test settings")
    git(main, "checkout", "-q", "-b", "elsewhere")  # frees main for the linked worktree
    wt = tmp_path / "linked"
    git(main, "worktree", "add", "-q", str(wt), "main")
    return wt, main / ".git" / "worktrees" / "linked"


def _separate(tmp_path: Path) -> tuple[Path, Path]:
    store = make_store(tmp_path / "memory")
    git(store, "add", "-A")
    git(store, "commit", "-q", "--allow-empty", "-m", "test settings")
    gitdir = tmp_path / "modules" / "memory"
    gitdir.parent.mkdir()
    shutil.move(str(store / ".git"), gitdir)
    (store / ".git").write_text("gitdir: ../modules/memory\n")  # as a submodule's reads
    git(store, "config", "core.worktree", str(store))
    return store, gitdir


@pytest.mark.parametrize("make", [_worktree, _separate], ids=["worktree", "separate-gitdir"])
def test_a_store_whose_git_is_a_file_starts(tmp_path: Path, short_tmp: Path, make) -> None:
    store, gitdir = make(tmp_path)
    assert (store / ".git").is_file()
    d = InProcessDaemon(store, short_tmp / "s.sock")
    try:
        assert (gitdir / "clagd.lock").is_file()
        with pytest.raises(StoreLocked):
            StoreLock(store).acquire()  # one daemon per store, there too
        with d.client() as c:
            assert c.add("a memory in a linked worktree")["added"] == 1
            assert c.recluster()["status"] in ("noop", "accepted", "fallback")
            assert c.status()["paused"] == ""
        assert "a memory in a linked worktree" in head_contents(store)
        assert git(store, "status", "--porcelain", "--", "clusters", "unsorted") == ""
    finally:
        d.stop()


@pytest.mark.parametrize("make", [_worktree, _separate], ids=["worktree", "separate-gitdir"])
def test_a_purge_there_reports_the_commits_it_rewrote(
    tmp_path: Path, short_tmp: Path, make
) -> None:
    """`forget --purge` rewrote history there but reported no commit changed (it read
    git-filter-repo's commit map from `<store>/.git/`, a file): the report, and the commit
    map a later `--force-remote` leases on, come from the git dir git names."""
    import subprocess

    store, gitdir = make(tmp_path)
    d = InProcessDaemon(store, short_tmp / "s.sock")
    try:
        with d.client() as c:
            c.add("The PIN is 8765-SECRET")
            c.add("The user likes green tea")
            res = c.forget(match="8765-secret", purge=True)
        rewritten = res["purge"]["rewritten"]
        assert len(rewritten) >= 2, rewritten  # the PIN's ingest and every commit after it
        heads = git(store, "rev-list", "--all").split()
        assert {r["new"] for r in rewritten} <= set(heads)
        assert not {r["old"] for r in rewritten} & set(heads)
        objects = subprocess.run(
            ["git", "-C", str(store), "cat-file", "--batch-all-objects", "--batch"],
            capture_output=True,
            check=True,
        ).stdout
        assert b"8765-SECRET" not in objects
        assert not (gitdir / "filter-repo").exists()  # its map read and removed
    finally:
        d.stop()
