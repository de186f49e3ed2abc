"""Crash safety: SIGKILL a real daemon at random moments (benchmarks/crash_harness.py, short
run), and the leftovers a kill can leave (git locks, a half-done revert, a half-written
change) never block a restart or survive it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from helpers import (
    REALISTIC,
    REPO,
    InProcessDaemon,
    git,
    head_contents,
    make_store,
    wait_for,
)

from clagd.engine.core import Engine
from clagd.errors import Conflict
from clagd.model import Cluster, memory_id
from clagd.store import gitstate
from clagd.store.files import load_state

ROOT = REPO


def _harness():
    spec = importlib.util.spec_from_file_location(
        "crash_harness", ROOT / "benchmarks" / "crash_harness.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["crash_harness"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_random_sigkills_lose_nothing(tmp_path: Path) -> None:
    report = _harness().run(
        kills=10, seed=7, workdir=tmp_path / "crash", verbose=False, realistic=REALISTIC
    )
    print({k: v for k, v in report.items() if k != "problems"})
    assert report["problems"] == []
    assert report["kills"] == 10 and report["restarts"] == 11
    assert report["realistic_memories"] == REALISTIC  # each in HEAD once, or a problem above
    assert report["files"] > 20 and report["memories_in_head"] >= report["memories_in_files"]
    assert report["requests"].get("recluster", 0) > 0


def _three_clusters(eng: Engine) -> list[str]:
    eng.add([{"content": f"memory number {i} about things"} for i in range(6)])

    def make(ctx):  # type: ignore[no-untyped-def]
        mems = [m for ms in ctx.state.unsorted.values() for m in ms]
        for s in list(ctx.state.unsorted):
            ctx.touch_shard(s)
            ctx.state.unsorted[s] = []
        cids = ["c-aaaaaaaa", "c-bbbbbbbb", "c-cccccccc"]
        for k, cid in enumerate(cids):
            ctx.touch_cluster(cid)
            ctx.state.clusters[cid] = Cluster(cid, f"name {k}", memories=mems[2 * k : 2 * k + 2])
        ctx.commit("cluster: three", "", {"kind": "cluster"})
        return cids

    return eng.writer.call(make)


def _move(ctx, src: str, dst: str, idx: int) -> str:  # type: ignore[no-untyped-def]
    m = ctx.state.clusters[src].memories.pop(idx)
    ctx.state.clusters[dst].memories.append(m)
    ctx.touch_cluster(src)
    ctx.touch_cluster(dst)
    return ctx.commit(f"cluster: move {src} -> {dst}", "", {"kind": "cluster"})


def test_revert_that_would_store_a_memory_twice_is_refused(store: Path) -> None:
    """A moves m to B, then B moves m to C. git reverts the first cleanly (both sides took
    m out of B), which would put m back into A while C still holds it."""
    eng = Engine(store)
    try:
        a, b, c = _three_clusters(eng)
        first = eng.writer.call(lambda ctx: _move(ctx, a, b, 0))
        eng.writer.call(lambda ctx: _move(ctx, b, c, -1))
        head = git(store, "rev-parse", "HEAD")
        with pytest.raises(Conflict, match="twice|also in"):
            eng.revert(first)
        assert git(store, "rev-parse", "HEAD") == head
        assert git(store, "status", "--porcelain", "--", "clusters", "unsorted") == ""
        counts = Counter(head_contents(store))
        assert len(counts) == 6 and set(counts.values()) == {1}
        assert len(eng.query("memory number things", max_memories=10).memories) == 6
    finally:
        eng.close()
    Engine(store).close()  # and the store still loads


def test_a_revert_killed_half_way_is_discarded(store: Path) -> None:
    eng = Engine(store)
    a, b, _c = _three_clusters(eng)
    sha = eng.writer.call(lambda ctx: _move(ctx, a, b, 0))
    eng.close()
    head = git(store, "rev-parse", "HEAD")
    # what a kill between `git revert --no-commit` and the commit leaves behind
    (store / ".clagd" / "warmstart.pickle").unlink(missing_ok=True)
    git(store, "revert", "--no-commit", sha)
    (store / ".git" / "clagd-txn").write_text("revert: killed\n")
    eng = Engine(store)
    try:
        assert any("half-written" in n for n in eng.notes)
        assert git(store, "rev-parse", "HEAD") == head
        assert git(store, "status", "--porcelain", "--", "clusters", "unsorted") == ""
        assert not (store / ".git" / "REVERT_HEAD").exists()
        assert len(eng.state.clusters[b].memories) == 3
    finally:
        eng.close()


@pytest.mark.parametrize(
    "lock", ["index.lock", "HEAD.lock", "refs/heads/main.lock", "ORIG_HEAD.lock"]
)
def test_stale_git_locks_do_not_block_a_restart(store: Path, short_tmp: Path, lock: str) -> None:
    path = store / ".git" / lock
    path.write_text("")
    old = time.time() - 60
    os.utime(path, (old, old))
    d = InProcessDaemon(store, short_tmp / "s.sock")
    try:
        with d.client() as c:
            assert c.add("written after a kill left a git lock")["commit"]
        assert not path.exists()
        assert any(lock.split("/")[-1] in n for n in d.engine.notes)
    finally:
        d.stop()
    assert head_contents(store) == ["written after a kill left a git lock"]


def test_restart_under_a_steady_stream_of_files_serves_promptly(
    tmp_path: Path, short_tmp: Path
) -> None:
    """Files keep arriving: start-up waits for the files that were there, not for silence."""
    store = make_store(tmp_path / "memory")
    inbox = store / "inbox"
    stop = threading.Event()
    written: list[str] = []

    def drop() -> None:
        i = 0
        while not stop.is_set():
            tmp = inbox / ".tmp" / f"f{i}.txt"
            tmp.write_text(f"stream memory {i}")
            os.rename(tmp, inbox / f"f{i}.txt")
            written.append(f"stream memory {i}")
            i += 1
            stop.wait(0.02)

    for i in range(20):
        (inbox / f"pre{i}.txt").write_text(f"memory there before start {i}")
    t = threading.Thread(target=drop, daemon=True)
    t.start()
    try:
        t0 = time.monotonic()
        d = InProcessDaemon(store, short_tmp / "s.sock")
        took = time.monotonic() - t0
    finally:
        stop.set()
        t.join()
    try:
        assert took < 15, f"start-up took {took:.1f}s"
        have = set(head_contents(store))
        assert {f"memory there before start {i}" for i in range(20)} <= have
        wait_for(lambda: set(written) <= set(head_contents(store)), 30, "the stream to land")
    finally:
        d.stop()


def test_git_fsck_clean_after_harness_style_kill(store: Path, short_tmp: Path) -> None:
    """A kill during a burst of ingests leaves a repository that git fsck accepts."""
    from helpers import DaemonProcess

    p = DaemonProcess(store, short_tmp / "s.sock").start()
    for i in range(30):
        (store / "inbox" / f"m{i}.txt").write_text(f"burst memory {i}")
    time.sleep(0.05)  # let a commit get under way: the point is to land mid-write
    p.kill()
    p.start()
    wait_for(lambda: not any((store / "inbox").glob("*.txt")), 30, "the inbox to drain")
    assert p.terminate() == 0
    fsck = subprocess.run(["git", "fsck", "--full"], cwd=store, capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stderr
    assert sorted(head_contents(store)) == sorted(f"burst memory {i}" for i in range(30))


def test_objects_torn_by_a_power_loss_before_the_flush_are_dropped_at_start(store: Path) -> None:
    """`git add` writes objects without fsync and the syncfs comes after it: a power loss in
    between can leave an object file empty. Nothing refers to it, but git would reuse it for
    the same content, so start-up drops it (and only it) when the unsynced mark is there."""
    shard = store / "unsorted" / "u-20260101T000000-dddddd.yaml"
    text = "memories:\n- {id: m-00000000000000d1, content: same bytes again, created_at: x}\n"
    torn = subprocess.run(
        ["git", "hash-object", "-w", "--stdin"],
        cwd=store,
        input=text,
        text=True,
        capture_output=True,
        check=True,
    ).stdout.strip()
    good = subprocess.run(
        ["git", "hash-object", "-w", "--stdin"],
        cwd=store,
        input="a flushed object\n",
        text=True,
        capture_output=True,
        check=True,
    ).stdout.strip()
    obj = store / ".git" / "objects" / torn[:2] / torn[2:]
    obj.chmod(0o644)
    obj.write_bytes(b"")  # what a power loss leaves of an object never flushed
    (store / ".git" / gitstate.UNSYNCED).write_text("")
    eng = Engine(store)
    try:
        assert not obj.exists()
        git(store, "cat-file", "-e", good)  # a readable object stays
        assert any("unreadable loose object" in n for n in eng.notes)
        assert not (store / ".git" / gitstate.UNSYNCED).exists()
        # the same content again is written afresh, not taken from the torn file
        shard.write_text(text)
        eng.git.commit([str(shard.relative_to(store))], "test: same content", flush=lambda: None)
        fsck = subprocess.run(["git", "fsck", "--full"], cwd=store, capture_output=True, text=True)
        assert fsck.returncode == 0, fsck.stderr
        assert git(store, "show", f"HEAD:{shard.relative_to(store)}") == text
    finally:
        eng.close()


def test_revert_of_a_change_to_a_cluster_archived_since(store: Path) -> None:
    """A route pass adds a memory to cluster A, A is archived, then the route is reverted:
    git follows the rename, so the revert changes `archive/A.yaml`, a file the route commit
    never had. The revert commit held only the route's own paths (the shard, not the archive
    file): HEAD stored the memory twice, the reload failed and the next start refused the
    store (crash harness, seed 7)."""
    eng = Engine(store)
    try:
        a, _b, _c = _three_clusters(eng)
        eng.add([{"content": "a zebra quokka memory"}])

        def route(ctx):  # type: ignore[no-untyped-def]
            shard, mems = next(iter(ctx.state.unsorted.items()))
            ctx.touch_shard(shard)
            ctx.state.unsorted[shard] = []
            ctx.touch_cluster(a)
            ctx.state.clusters[a].memories.extend(mems)
            return ctx.commit("route: 1 memory into 1 cluster", "", {"kind": "route"})

        def archive(ctx):  # type: ignore[no-untyped-def]
            ctx.touch_cluster(a)
            ctx.touch_archive(a)
            ctx.state.archived[a] = ctx.state.clusters.pop(a)
            return ctx.commit("archive: 1 cold cluster(s)", "", {"kind": "archive"})

        routed = eng.writer.call(route)
        eng.writer.call(archive)
        eng.revert(routed)
        assert f"archive/{a}.yaml" in git(store, "show", "--name-only", "--format=", "HEAD")
        fresh = load_state(store)  # raises on a memory stored twice
        assert eng.state.memory_ids() == fresh.memory_ids()
        where = fresh.locate(memory_id("a zebra quokka memory"))
        assert where is not None and where[0] == "unsorted"
        assert Counter(head_contents(store))["a zebra quokka memory"] == 1
    finally:
        eng.close()
