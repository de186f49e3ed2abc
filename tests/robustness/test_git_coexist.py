"""Git is the person's tool too: a real daemon on a real store while a person runs ordinary
git commands in it (checkout, branches, merges, reset, rebase, amend). The daemon commits
only on its own branch, pauses while the person's git holds the store, takes in every move
of its branch before its next write, and reports the memories a rewrite took out of HEAD."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest
from helpers import InProcessDaemon, git, head_contents, wait_for

from clagd.client import ClientError
from clagd.engine.core import Engine
from clagd.errors import HeadMoved, Paused, StoreError
from clagd.ingest.inbox import Item
from clagd.model import memory_id
from clagd.store.files import load_state
from clagd.store.gitrepo import GitStore
from clagd.store.writer import WriteContext


def _drop(root: Path, name: str, text: str) -> Path:
    tmp = root / "inbox" / ".tmp" / name
    tmp.write_text(text, encoding="utf-8")
    os.rename(tmp, root / "inbox" / name)
    return root / "inbox" / name


def _served_equals_head(d: InProcessDaemon) -> None:
    """After quiescence: what the daemon serves is a fresh load of HEAD, every memory once."""
    root = d.root
    eng = d.engine
    assert not git(root, "status", "--porcelain", "--", "clusters", "archive", "unsorted")
    in_head = head_contents(root)
    assert len(in_head) == len(set(in_head))
    fresh = load_state(root)
    wait_for(lambda: eng.index.memory_ids() == fresh.memory_ids(), 10, "served == HEAD")
    assert eng.state.memory_ids() == fresh.memory_ids()
    assert eng.head == git(root, "rev-parse", "HEAD").strip()


def _paused_add(c, text: str) -> str:
    with pytest.raises(ClientError) as err:
        c.add(text)
    assert err.value.code == "paused"
    return str(err.value)


@pytest.mark.parametrize("how", ["detached", "branch"])
def test_another_checkout_pauses_writes_and_they_resume(daemon: InProcessDaemon, how: str) -> None:
    root = daemon.root
    with daemon.client() as c:
        c.add("first memory on main")
        c.add("second memory on main")
        if how == "detached":
            git(root, "checkout", "-q", "HEAD~1")
        else:
            git(root, "checkout", "-q", "-b", "side")
        msg = _paused_add(c, "added while the person looks elsewhere")
        assert "git checkout main" in msg
        f = _drop(root, "waits.txt", "inbox memory that waits for main")
        st = wait_for(
            lambda: (s := c.status())["inbox"]["last_error"] and s, 10, "the inbox to pause"
        )
        assert "git checkout main" in st["paused"] and "git checkout main" in st["inbox"]["paused"]
        assert f.exists()  # the file waits in the inbox
        hits = c.query("second memory on main").memories  # queries go on: last good state
        assert any(h.content == "second memory on main" for h in hits)
        git(root, "checkout", "-q", "main")
        wait_for(lambda: not f.exists(), 15, "the inbox to resume by itself")
        assert c.add("added when main is back")["added"] == 1
        assert c.status()["paused"] == ""
    assert git(root, "rev-parse", "--abbrev-ref", "HEAD").strip() == "main"
    contents = head_contents(root)
    for text in ("inbox memory that waits for main", "added when main is back"):
        assert contents.count(text) == 1
    if how == "branch":  # nothing was committed on the person's branch
        assert git(root, "rev-list", "main..side").strip() == ""
    _served_equals_head(daemon)


def test_a_conflicted_merge_pauses_until_aborted(daemon: InProcessDaemon) -> None:
    root = daemon.root
    with daemon.client() as c:
        c.add("before the merge")
        (root / "notes.txt").write_text("base\n")
        git(root, "add", "notes.txt")
        git(root, "commit", "-qm", "notes")
        git(root, "checkout", "-q", "-b", "other")
        (root / "notes.txt").write_text("theirs\n")
        git(root, "commit", "-qam", "theirs")
        git(root, "checkout", "-q", "main")
        (root / "notes.txt").write_text("ours\n")
        git(root, "commit", "-qam", "ours")
        r = subprocess.run(["git", "merge", "other"], cwd=root, capture_output=True, text=True)
        assert r.returncode != 0 and (root / ".git" / "MERGE_HEAD").exists()
        msg = _paused_add(c, "during the merge")
        assert "merge is in progress" in msg and "git merge --abort" in msg
        f = _drop(root, "merge.txt", "dropped during the merge")
        wait_for(lambda: c.status()["inbox"]["paused"], 10, "the inbox to pause")
        assert f.exists()
        git(root, "merge", "--abort")
        wait_for(lambda: not f.exists(), 15, "the inbox to resume")
        assert c.add("after the merge")["added"] == 1
    assert head_contents(root).count("dropped during the merge") == 1
    _served_equals_head(daemon)


def test_a_reset_is_taken_in_and_its_removed_memories_reported(daemon: InProcessDaemon) -> None:
    root = daemon.root
    with daemon.client() as c:
        for i in range(4):
            c.add(f"memory number {i} before the reset")
        old = git(root, "rev-parse", "HEAD").strip()
        git(root, "reset", "-q", "--hard", "HEAD~2")
        # the next write loads the new HEAD first, then commits on top of it
        assert c.add("after the reset")["added"] == 1
        st = c.status()
        assert st["history"]["memories_removed"] == 2
        event = st["history"]["last"][-1]
        assert event["from"] == old and event["kind"] == "rewrite" and event["removed"] == 2
        assert old[:12] in event["where"]
        log = c.log(5)
        assert log["history"][-1]["removed"] == 2
        # the removed memories are not "already stored": adding one again stores it
        res = c.add("memory number 3 before the reset")
        assert res["added"] == 1
    for cmd, line in (
        ("status", "HISTORY    2 memories left HEAD"),
        ("log", "2 memories left HEAD"),
    ):
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "clagd",
                "--store",
                str(root),
                "--socket",
                str(daemon.socket),
                cmd,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
        assert line in out and old[:12] in out
    assert git(root, "rev-parse", "HEAD~2").strip() != old
    contents = head_contents(root)
    assert contents.count("memory number 2 before the reset") == 0
    assert contents.count("memory number 3 before the reset") == 1
    _served_equals_head(daemon)


def test_a_soft_reset_pauses_writes_until_its_staged_changes_are_settled(
    daemon: InProcessDaemon,
) -> None:
    """`git reset --soft HEAD~1` moves the branch and leaves the undone commit's files
    staged (git's index untouched): no write may commit on top of them, as after a
    `git add` (before, the watch of the index saw nothing and the next add went through)."""
    root = daemon.root
    with daemon.client() as c:
        for i in range(3):
            c.add(f"memory number {i} before the soft reset")
        git(root, "reset", "-q", "--soft", "HEAD~1")
        head = git(root, "rev-parse", "HEAD").strip()
        assert "staged" in _paused_add(c, "while the undone commit is staged")
        assert git(root, "rev-parse", "HEAD").strip() == head  # nothing committed on top
        git(root, "commit", "-q", "-m", "the person commits what the reset staged")
        assert c.add("after the person's commit")["added"] == 1
    contents = head_contents(root)
    for i in range(3):
        assert contents.count(f"memory number {i} before the soft reset") == 1
    assert contents.count("after the person's commit") == 1
    _served_equals_head(daemon)


def test_rebase_and_amend_are_taken_in(daemon: InProcessDaemon) -> None:
    root = daemon.root
    git(root, "commit", "-qm", "test settings", "--", "clagd.yaml")  # a clean tree to rebase
    with daemon.client() as c:
        for i in range(3):
            c.add(f"rebased memory {i}")
        # the person rewrites the last commit's message and drops the one before it
        git(root, "commit", "-q", "--amend", "-m", "amended by the person")
        base = git(root, "rev-parse", "HEAD~2").strip()
        git(root, "rebase", "-q", "--onto", base, "HEAD~1")
        assert c.add("after the rebase")["added"] == 1
        st = c.status()
        assert st["history"]["memories_removed"] >= 1
    contents = head_contents(root)
    assert contents.count("rebased memory 1") == 0
    assert contents.count("rebased memory 2") == 1
    _served_equals_head(daemon)


def test_a_commit_never_lands_on_a_head_it_has_not_loaded(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A person's commit lands between the daemon's `git add` and its commit: the
    compare-and-swap fails, the daemon loads the person's commit and commits on top."""
    eng = Engine(store)
    try:
        eng.ingest([Item("already there", None, {})], "test")
        real = GitStore.build_tree
        raced: list[str] = []

        def person_commits_first(
            self: GitStore, parent: str | None, paths: list[str], fsync: bool = True
        ) -> str:
            if not raced:
                (store / "person.txt").write_text("a person's file\n")
                git(store, "add", "person.txt")
                git(store, "commit", "-qm", "the person's commit", "--", "person.txt")
                raced.append(git(store, "rev-parse", "HEAD").strip())
            return real(self, parent, paths, fsync)

        monkeypatch.setattr(GitStore, "build_tree", person_commits_first)
        res = eng.ingest([Item("raced with a person", None, {})], "test")
        assert res.commit and raced
        assert git(store, "rev-parse", f"{res.commit}^").strip() == raced[0]
        assert eng.writer.moved_retries == 1
        assert Counter(head_contents(store)) == Counter(["already there", "raced with a person"])
        assert eng.state.memory_ids() == load_state(store).memory_ids()
    finally:
        eng.close()


def test_compare_and_swap_refuses_a_moved_branch(store: Path) -> None:
    g = GitStore(store)
    first = g.branch_head()
    (store / "unsorted" / "u-x.yaml").write_text("memories: []\n")
    g.commit(["unsorted/u-x.yaml"], "one")
    g.base = first  # as if the daemon had not loaded that commit
    (store / "unsorted" / "u-y.yaml").write_text("memories: []\n")
    with pytest.raises(HeadMoved):
        g.commit(["unsorted/u-y.yaml"], "two")
    assert git(store, "log", "--format=%s", "-1").strip() == "one"


def test_a_reset_while_stopped_is_reported_at_start(store: Path, short_tmp: Path) -> None:
    d = InProcessDaemon(store, short_tmp / "s.sock")
    with d.client() as c:
        for i in range(3):
            c.add(f"stopped-daemon memory {i}")
    d.stop()
    git(store, "reset", "-q", "--hard", "HEAD~1")
    d = InProcessDaemon(store, short_tmp / "s.sock")
    try:
        with d.client() as c:
            st = c.status()
        assert st["history"]["memories_removed"] == 1
        assert st["history"]["last"][-1]["noticed"] == "at start-up"
    finally:
        d.stop()


def test_no_commit_is_written_to_commit_editmsg(daemon: InProcessDaemon) -> None:
    """Commits are made with plumbing: no message of ours lingers in .git/COMMIT_EDITMSG."""
    with daemon.client() as c:
        c.add("a private memory that must not sit in COMMIT_EDITMSG")
    editmsg = daemon.root / ".git" / "COMMIT_EDITMSG"
    assert not editmsg.exists() or "private memory" not in editmsg.read_text()


def _served_is_a_fresh_load_of_head(eng: Engine, store: Path) -> None:
    """The served state (the writer's state and the index) equals a fresh load of HEAD."""
    fresh = {m.id for m, _a, _k in load_state_at_head(store).all_memories()}
    assert eng.state.memory_ids() == fresh
    assert len(eng.index) == len(fresh)


def load_state_at_head(store: Path):  # noqa: ANN201 - a StoreState
    """HEAD's store, checked out into a scratch folder (the working tree may differ)."""
    scratch = store.parent / "head-copy"
    subprocess.run(["rm", "-rf", str(scratch)], check=True)
    git(store, "worktree", "add", "-q", "--detach", str(scratch), "HEAD")
    try:
        return load_state(scratch)
    finally:
        git(store, "worktree", "remove", "--force", str(scratch))


def test_a_hand_edit_whose_commit_fails_is_not_served(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hand-added memory file is taken in, but the person's git takes the store between
    the daemon's `git add` and its commit (here `git checkout -b`), and the person then drops
    the file: the memory was never in HEAD and must never be served (it was: daemon 1,555,
    HEAD 1,554 in the person harness)."""
    eng = Engine(store)
    try:
        eng.ingest([Item("a memory in HEAD", None, {})], "test")
        hand = store / "unsorted" / "u-20260101T000000-aaaaaaaaaaaa.yaml"
        hand.write_text("memories:\n- content: a memory the person drops again\n")
        real = GitStore._stage

        def person_checks_out_a_branch(self: GitStore, paths: list[str], fsync: bool) -> None:
            real(self, paths, fsync)
            git(store, "checkout", "-q", "-b", "side")

        monkeypatch.setattr(GitStore, "_stage", person_checks_out_a_branch)
        out = eng.check_outside()
        assert out is not None and out.paused
        monkeypatch.setattr(GitStore, "_stage", real)
        git(store, "checkout", "-q", "main")
        git(store, "reset", "-q", "--hard")  # the person drops the file (staged by the daemon)
        assert not hand.exists()
        assert eng.check_outside() is None
        _served_is_a_fresh_load_of_head(eng, store)
        assert Counter(head_contents(store)) == Counter(["a memory in HEAD"])
    finally:
        eng.close()


def test_a_file_unstaged_by_the_persons_git_while_clagd_commits_is_not_dropped(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shard is deleted in the working tree (a person's git command half-way: the file is
    gone, then its index entry too) while the daemon takes the deletion in: its commit fails
    ("staged as deleted by a git command of the person's"), and once the person restores the
    file the daemon must still serve its memories (it served HEAD minus them, and retried
    the commit until the staged-changes pause took over: harness seed 11)."""
    eng = Engine(store)
    try:
        eng.ingest([Item("shard memory one", None, {}), Item("shard memory two", None, {})], "t")
        shard = next((store / "unsorted").glob("u-*.yaml"))
        rel = str(shard.relative_to(store))
        shard.unlink()
        real = GitStore._stage

        def person_unstages_it(self: GitStore, paths: list[str], fsync: bool) -> None:
            git(store, "rm", "-q", "--cached", rel)
            real(self, paths, fsync)

        monkeypatch.setattr(GitStore, "_stage", person_unstages_it)
        with pytest.raises(StoreError, match="staged as deleted by a git command"):
            eng.writer.call(eng._outside_op)
        monkeypatch.setattr(GitStore, "_stage", real)
        git(store, "reset", "-q", "--hard")  # the person puts it back
        assert shard.exists()
        assert eng.check_outside() is None
        _served_is_a_fresh_load_of_head(eng, store)
        assert len(eng.index) == 2
    finally:
        eng.close()


def test_a_rollback_raced_by_a_persons_commit_does_not_pause_writes(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A person's `git commit` takes git's index as it is when it starts. One that starts
    after the daemon staged a new shard, but lands after the daemon's rollback of that
    write (its commit paused: the person's `git rm` held the index lock) unstaged and
    removed the shard, commits the shard: HEAD has it, the index and the tree do not.
    Every later write then paused on "changes are staged" for good (seen under load in
    tests/robustness/test_missing_folders.py). The daemon puts its own file back as
    HEAD has it and writes on; HEAD keeps every memory once."""
    eng = Engine(store)
    try:
        eng.add([{"content": "a memory before the race"}])
        real_update, real_restore = GitStore.update_branch, GitStore.restore_paths
        paused: list[str] = []

        def paused_once(self: GitStore, new: str, expected: str | None, why: str) -> None:
            if not paused:
                paused.append(why)
                raise Paused("a git command is running in the store (the person's git rm)")
            real_update(self, new, expected, why)

        def racing_restore(self: GitStore, rel_paths: list[str]) -> None:
            taken = git(store, "write-tree").strip()  # the person's commit starts
            real_restore(self, rel_paths)  # the daemon's rollback
            head = git(store, "rev-parse", "HEAD").strip()
            commit = git(store, "commit-tree", taken, "-p", head, "-m", "person").strip()
            git(store, "update-ref", "refs/heads/main", commit, head)  # and lands

        monkeypatch.setattr(GitStore, "update_branch", paused_once)
        monkeypatch.setattr(GitStore, "restore_paths", racing_restore)
        with pytest.raises(Paused):
            eng.add([{"content": "the memory whose write was paused"}])
        monkeypatch.setattr(GitStore, "restore_paths", real_restore)
        status = git(store, "status", "--porcelain", "--", "unsorted")
        assert status.startswith("D  unsorted/"), status  # in HEAD, staged as deleted
        assert eng.add([{"content": "a memory after the race"}]).added == 1
        assert git(store, "status", "--porcelain", "--", "clusters", "unsorted") == ""
        contents = head_contents(store)
        for text in ("before the race", "whose write was paused", "after the race"):
            assert sum(text in c for c in contents) == 1, text
        _served_is_a_fresh_load_of_head(eng, store)
    finally:
        eng.close()


def test_a_persons_staged_deletion_of_a_memory_file_still_pauses_writes(store: Path) -> None:
    """The same index, staged by the person (`git rm --cached` of a committed shard, the
    file removed): not the daemon's doing, so writes pause until the person decides."""
    eng = Engine(store)
    try:
        eng.add([{"content": "a committed memory"}])
        shard = next((store / "unsorted").glob("u-*.yaml"))
        git(store, "rm", "-q", "--cached", str(shard.relative_to(store)))
        shard.unlink()
        with pytest.raises(Paused, match="staged"):
            eng.add([{"content": "a memory while the deletion is staged"}])
    finally:
        eng.close()


def test_a_move_of_the_branch_is_read_from_the_commit_not_a_passing_working_tree(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The person commits a memory file; while the daemon takes the move in, a git command
    of the person's has the file rewritten for an instant (and restored before the daemon
    checks): the daemon must serve what the commit holds, not what it saw in passing (it
    served HEAD - 1, and nothing read the file again)."""
    eng = Engine(store)
    try:
        eng.ingest([Item("the daemon's memory", None, {})], "test")
        theirs = store / "unsorted" / "u-20260101T000000-bbbbbbbbbbbb.yaml"
        text = "the person's committed memory"
        theirs.write_text(
            f"memories:\n- id: {memory_id(text)}\n  content: {text}\n"
            "  created_at: '2026-01-01T00:00:00Z'\n"
        )
        git(store, "add", str(theirs.relative_to(store)))
        git(store, "commit", "-qm", "the person's memory")
        real_changed, real_check = GitStore.changed_between, GitStore.check_not_paused
        passing: list[str] = []

        def a_git_command_rewrites_it(self: GitStore, old: str, new: str, dirs) -> list[str]:  # noqa: ANN001
            if not passing:
                theirs.write_text("memories: []\n")  # half-way through the person's command
                passing.append("rewritten")
            return real_changed(self, old, new, dirs)

        def and_restores_it_before_the_check(self: GitStore) -> None:
            if passing == ["rewritten"]:
                git(store, "checkout", "-q", "--", str(theirs.relative_to(store)))
                passing.append("restored")
            real_check(self)

        monkeypatch.setattr(GitStore, "changed_between", a_git_command_rewrites_it)
        monkeypatch.setattr(GitStore, "check_not_paused", and_restores_it_before_the_check)
        eng.check_outside()
        assert passing == ["rewritten", "restored"]
        monkeypatch.setattr(GitStore, "changed_between", real_changed)
        monkeypatch.setattr(GitStore, "check_not_paused", real_check)
        assert eng.check_outside() is None
        _served_is_a_fresh_load_of_head(eng, store)
        assert len(eng.index) == 2
    finally:
        eng.close()


def test_a_rollback_under_the_persons_checkout_is_read_from_the_daemons_commit(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The person checks out another branch (where a shard of the daemon's holds one more
    memory) just after the daemon's session began: the session's commit is refused (paused)
    and its files go back to HEAD, which is the person's branch then. The daemon's state
    must go back to its own commit, not to the files of the person's checkout: queries are
    served from the last good state while paused, and a state read from the person's files
    may never be read again once the person is back (the person harness ended with the
    daemon serving HEAD + 1)."""
    eng = Engine(store)
    try:
        texts = [f"a memory about gardening tomatoes number {i}" for i in range(6)]
        eng.ingest([Item(t, None, {}) for t in texts], "test")
        shard = next((store / "unsorted").glob("u-*.yaml"))
        rel = str(shard.relative_to(store))
        extra = "a memory that only the side branch holds"
        git(store, "checkout", "-q", "-b", "side")
        shard.write_text(
            shard.read_text()
            + f"- id: {memory_id(extra)}\n  content: {extra}\n  created_at: '2026-01-01T00:00:00Z'\n"
        )
        git(store, "commit", "-qam", "the person's memory on side")
        git(store, "checkout", "-q", "main")
        assert eng.check_outside() is None
        real = WriteContext.commit
        checked_out: list[str] = []

        def person_checks_out_side_first(self: WriteContext, *a, **kw):  # noqa: ANN002, ANN003, ANN202
            if not checked_out:
                git(store, "checkout", "-q", "side")
                checked_out.append(rel)
            return real(self, *a, **kw)

        monkeypatch.setattr(WriteContext, "commit", person_checks_out_side_first)
        with pytest.raises(Paused):
            eng.recluster()
        assert checked_out
        monkeypatch.setattr(WriteContext, "commit", real)
        assert extra in shard.read_text()  # the working tree is the person's branch
        # while paused, the last good state is served: the daemon's commit, not the
        # person's checkout
        assert memory_id(extra) not in eng.state.memory_ids()
        assert len(eng.index) == len(texts)
        git(store, "checkout", "-q", "main")
        eng.check_outside()
        _served_is_a_fresh_load_of_head(eng, store)
        assert len(eng.index) == len(texts)
    finally:
        eng.close()


def test_a_head_lock_held_by_the_persons_git_is_waited_for(store: Path) -> None:
    """Moving the branch HEAD points to also locks HEAD: a person's git command holding
    `.git/HEAD.lock` for an instant made the daemon's commit fail ("cannot lock ref 'HEAD'")
    and an `add` answer `store`. The compare-and-swap is retried until the lock is gone."""
    eng = Engine(store)
    lock = store / ".git" / "HEAD.lock"
    try:
        lock.write_text("ref: refs/heads/main\n")
        released = threading.Event()

        def person_finishes() -> None:
            lock.unlink()
            released.set()

        timer = threading.Timer(0.3, person_finishes)
        timer.start()
        res = eng.ingest([Item("a memory committed once HEAD is free", None, {})], "test")
        assert released.is_set() and res.commit
        assert git(store, "rev-parse", "HEAD").strip() == res.commit
        assert head_contents(store) == ["a memory committed once HEAD is free"]
    finally:
        eng.close()


def test_a_checkout_that_holds_head_while_clagd_commits_pauses_it(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A person's `git checkout side` holds HEAD's lock at the instant the daemon moves its
    branch, then points HEAD at `side`: the operation is paused (nothing acknowledged, the
    branch not moved), not failed, and it goes through once the person is back."""
    eng = Engine(store)
    try:
        eng.ingest([Item("already there", None, {})], "test")
        before = git(store, "rev-parse", "main").strip()
        git(store, "branch", "side")
        gitdir = store / ".git"
        real = GitStore.update_branch

        def checkout_ends() -> None:
            os.rename(gitdir / "HEAD.lock", gitdir / "HEAD")
            (gitdir / "index.lock").unlink()

        def person_checks_out_side(self: GitStore, new: str, expected, why: str) -> None:  # noqa: ANN001
            # git checkout: the index lock for the whole command, HEAD's lock at its end
            (gitdir / "index.lock").write_bytes(b"")
            (gitdir / "HEAD.lock").write_text("ref: refs/heads/side\n")
            threading.Timer(0.2, checkout_ends).start()
            real(self, new, expected, why)

        monkeypatch.setattr(GitStore, "update_branch", person_checks_out_side)
        with pytest.raises(Paused):
            eng.ingest([Item("a memory added during the checkout", None, {})], "test")
        monkeypatch.setattr(GitStore, "update_branch", real)
        assert git(store, "rev-parse", "main").strip() == before
        git(store, "checkout", "-q", "main")
        res = eng.ingest([Item("a memory added during the checkout", None, {})], "test")
        assert res.commit
        assert Counter(head_contents(store)) == Counter(
            ["already there", "a memory added during the checkout"]
        )
        _served_is_a_fresh_load_of_head(eng, store)
    finally:
        eng.close()


@pytest.mark.parametrize("warm", [False, True], ids=["from-files", "warm-start"])
def test_a_start_serves_head_not_the_persons_staged_files(store: Path, warm: bool) -> None:
    """A daemon starts while the person has a memory file staged (a `stash pop` of one of
    the daemon's files whose commit never happened): it serves HEAD, pauses writes until the
    person commits or resets, and after `git reset --hard` serves exactly HEAD (it served
    HEAD + 1: the start read the working tree, and nothing read it again)."""
    eng = Engine(store)
    eng.ingest([Item("a memory in HEAD", None, {})], "test")
    eng.close()  # saves the warm-start file
    if not warm:
        for f in (store / ".clagd").glob("warmstart*"):
            f.unlink()
    text = "a memory the person has staged, never committed"
    staged = store / "unsorted" / "u-20260101T000000-cccccccccccc.yaml"
    staged.write_text(
        f"memories:\n- id: {memory_id(text)}\n  content: {text}\n"
        "  created_at: '2026-01-01T00:00:00Z'\n"
    )
    git(store, "add", str(staged.relative_to(store)))
    eng = Engine(store)
    try:
        assert eng.load_source == ("warmstart" if warm else "files")
        assert memory_id(text) not in eng.state.memory_ids()
        assert len(eng.index) == 1
        out = eng.check_outside()
        assert out is not None and "staged" in out.paused
        git(store, "reset", "-q", "--hard")
        assert eng.check_outside() is None
        _served_is_a_fresh_load_of_head(eng, store)
        assert len(eng.index) == 1
    finally:
        eng.close()
