"""The writer: a failed operation leaves nothing half-done and touches nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from helpers import git, make_store

import clagd.store.writer as writer_mod
from clagd.engine.core import Engine
from clagd.ingest.inbox import Item
from clagd.model import Memory
from clagd.store.files import load_state


class Boom(RuntimeError):
    pass


def test_failed_operation_restores_only_what_it_touched(tmp_path: Path) -> None:
    root = make_store(tmp_path / "m")
    eng = Engine(root)
    try:
        eng.ingest([Item(f"memory {i} about apples", None, {}) for i in range(4)], "test")
        eng.recluster("test")
        cids = sorted(eng.state.clusters)
        assert cids
        # a hand edit in progress in another file must survive the failure
        other = root / "unsorted" / "u-20260101T000000-aaaaaa.yaml"
        other.write_text(yaml.safe_dump({"memories": [Memory.new("hand-added note").to_dict()]}))
        head = git(root, "rev-parse", "HEAD")

        def bad_op(ctx, cid: str) -> None:
            ctx.touch_cluster(cid)
            ctx.state.clusters[cid].memories.append(Memory.new("half-applied memory"))
            ctx.state.clusters[cid].name = "Half applied"
            from clagd.store.files import write_cluster

            write_cluster(ctx.paths, ctx.state.clusters[cid])  # on disk, then a failure
            raise Boom("disk trouble")

        with pytest.raises(Boom):
            eng.writer.call(bad_op, cids[0])
        assert git(root, "rev-parse", "HEAD") == head
        assert "half-applied" not in (root / "clusters" / f"{cids[0]}.yaml").read_text()
        assert other.exists()  # untouched
        assert eng.state.clusters[cids[0]].name != "Half applied"
        assert all(m.content != "half-applied memory" for m, _a, _k in eng.state.all_memories())
        assert "half-applied memory" not in [
            h.content for h in eng.query("half applied memory", count_round=False).memories
        ]
        files = load_state(root)
        files.unsorted.pop("u-20260101T000000-aaaaaa")
        assert files.memory_ids() == eng.state.memory_ids()
        assert eng.writer.failures == 1 and "disk trouble" in eng.writer.last_error
    finally:
        eng.close()


def test_start_after_a_kill_mid_write_restores_only_the_files_of_that_change(
    tmp_path: Path,
) -> None:
    root = make_store(tmp_path / "m")
    eng = Engine(root)
    eng.ingest([Item("a committed memory", None, {})], "test")
    eng.close()
    shard = next((root / "unsorted").glob("u-*.yaml"))
    committed = shard.read_text()
    # the killed change: it was rewriting `shard` and adding a new shard
    half = root / "unsorted" / "u-20260101T000000-bbbbbb.yaml"
    half.write_text(yaml.safe_dump({"memories": [Memory.new("half-written").to_dict()]}))
    shard.write_text(committed + "- {id: m-0000000000000001, content: torn}\n")
    # and a hand edit of the user's, elsewhere, at the same time
    mine = root / "unsorted" / "u-20260101T000000-cccccc.yaml"
    mine.write_text(yaml.safe_dump({"memories": [Memory.new("the user's own note").to_dict()]}))
    # the temporary file of a write the kill cut (after the exchange: the old version)
    tmp = root / "unsorted" / f".{shard.name}.k3_x9abc.tmp"
    tmp.write_text(committed)
    other = root / "unsorted" / ".notes.txt.tmp"  # not the writer's: left alone
    other.write_text("the user's")
    rel = [str(p.relative_to(root)) for p in (shard, half)]
    (root / ".git" / "clagd-txn").write_text("ingest: 1 memory\n" + "\n".join(rel) + "\n")
    eng = Engine(root)
    try:
        assert shard.read_text() == committed and not half.exists() and mine.exists()
        assert not tmp.exists() and other.exists()
        contents = sorted(m.content for m, _a, _k in eng.state.all_memories())
        assert contents == ["a committed memory", "the user's own note"]
        assert not (root / ".git" / "clagd-txn").exists()
    finally:
        eng.close()


def _git_argvs(trace: Path, sub: str) -> list[list[str]]:
    """argv of every git process of subcommand `sub` in a GIT_TRACE2_EVENT file."""
    starts = [e for e in map(json.loads, trace.read_text().splitlines()) if e["event"] == "start"]
    out = []
    for e in starts:
        argv = e["argv"]
        words = [a for i, a in enumerate(argv[1:], 1) if a != "-c" and argv[i - 1] != "-c"]
        if words and words[0] == sub:
            out.append(argv)
    return out


def _staging(trace: Path) -> list[list[str]]:
    """The argv of each git command that staged the daemon's files (`update-index --add`;
    the scratch index's `update-index --index-info` is not one)."""
    return [argv for argv in _git_argvs(trace, "update-index") if "--add" in argv]


def test_one_syncfs_after_the_objects_and_before_the_branch_moves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Staging (`update-index --add`), `write-tree` and `commit-tree` write their objects
    without an fsync each;
    the writer's one syncfs runs after them, when the new blobs, trees and commit exist and
    no ref names them yet; the compare-and-swap `update-ref` keeps git's own fsync. Without
    syncfs, git fsyncs its objects itself."""
    root = make_store(tmp_path / "m")
    trace = tmp_path / "trace2.jsonl"
    monkeypatch.setenv("GIT_TRACE2_EVENT", str(trace))
    real_syncfs = writer_mod.syncfs
    at_syncfs: list[tuple[str, list[str]]] = []

    loose_at_syncfs: set[str] = set()

    def syncfs_seeing_the_store(path: Path) -> bool:
        staged = git(root, "ls-files", "-s", "--", "unsorted").split()
        blobs = [w for w in staged if len(w) == 40]
        for blob in blobs:  # raises if git add had not written it
            git(root, "cat-file", "-e", blob)
        at_syncfs.append((git(root, "rev-parse", "HEAD").strip(), blobs))
        objects = root / ".git" / "objects"
        loose_at_syncfs.update(
            f.parent.name + f.name for f in objects.glob("??/*") if len(f.parent.name) == 2
        )
        return real_syncfs(path)

    monkeypatch.setattr(writer_mod, "syncfs", syncfs_seeing_the_store)
    eng = Engine(root)
    try:
        head = git(root, "rev-parse", "HEAD").strip()
        trace.unlink(missing_ok=True)
        at_syncfs.clear()
        eng.ingest([Item("flushed once, after git add", None, {})], "test")
        assert len(at_syncfs) == 1
        head_then, blobs = at_syncfs[0]
        assert head_then == head  # the commit came after the syncfs
        shard = git(root, "ls-tree", "-r", "HEAD", "--", "unsorted").split()
        assert [w for w in shard if len(w) == 40] == blobs  # what was flushed is committed
        new = git(root, "rev-parse", "HEAD", "HEAD^{tree}").split()
        assert set(new) <= loose_at_syncfs  # the commit and its tree were there to flush
        adds, commits = _staging(trace), _git_argvs(trace, "commit-tree")
        trees, refs = _git_argvs(trace, "write-tree"), _git_argvs(trace, "update-ref")
        assert len(adds) == 1 and "core.fsync=none" in adds[0]
        assert len(trees) == 1 and "core.fsync=none" in trees[0]
        assert len(commits) == 1 and "core.fsync=none" in commits[0]
        assert len(refs) == 1 and "core.fsync=none" not in refs[0]
        assert git(root, "config", "core.fsync").strip() == "all"

        eng.writer.can_syncfs = False  # e.g. a libc without syncfs
        trace.unlink()
        eng.ingest([Item("flushed file by file", None, {})], "test")
        assert len(at_syncfs) == 1
        adds = _staging(trace)
        assert len(adds) == 1 and "core.fsync=none" not in adds[0]
        for cmd in ("write-tree", "commit-tree"):  # git's own fsync for what a ref names
            assert all("core.fsync=none" not in argv for argv in _git_argvs(trace, cmd))
        assert "flushed file by file" in [
            m.content for m, _a, _k in load_state(root).all_memories()
        ]
    finally:
        eng.close()


def test_the_index_snapshot_is_made_while_git_commits_and_served_only_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer makes the readers' next snapshot (its publisher's `prepare`) while the
    commit's files are written and git builds the commit (on a thread of its own): the
    engine serves it once the commit exists; a failed commit drops it
    (nothing is served that no commit holds); a failed preparation is logged and the
    snapshot made after the commit instead."""
    import threading

    root = make_store(tmp_path / "m")
    eng = Engine(root)
    try:
        real_commit, real_prepare = eng.git.commit, eng.prepare
        seen: dict[str, object] = {}

        def commit(*a, **kw):  # type: ignore[no-untyped-def]
            seen["git thread"] = threading.current_thread().name
            seen["index while git commits"] = eng.index
            return real_commit(*a, **kw)

        def prepare(change):  # type: ignore[no-untyped-def]
            seen["prepare thread"] = threading.current_thread().name
            seen["prepared"] = real_prepare(change)
            return seen["prepared"]

        monkeypatch.setattr(eng.git, "commit", commit)
        monkeypatch.setattr(eng, "prepare", prepare)
        before = eng.index
        eng.ingest([Item("the first memory about kites", None, {})], "test")
        assert seen["git thread"].startswith("clagd-writer-git")
        assert seen["prepare thread"] == "clagd-writer"
        assert seen["index while git commits"] is before  # not served before the commit
        assert eng.index is seen["prepared"].index  # type: ignore[attr-defined]
        assert eng.query("kites", count_round=False).memories[0].content.endswith("kites")

        # a commit that fails: the prepared snapshot is dropped
        def failing(*a, **kw):  # type: ignore[no-untyped-def]
            raise Boom("git could not write")

        monkeypatch.setattr(eng.git, "commit", failing)
        with pytest.raises(Boom):
            eng.ingest([Item("a memory about boats that never lands", None, {})], "test")
        assert seen["prepared"].index is not eng.index  # type: ignore[attr-defined]
        assert "boats" in " ".join(
            h.memory.content
            for h in seen["prepared"].index.search("boats never lands").memories  # type: ignore[attr-defined]
        )
        assert not eng.query("boats never lands", count_round=False).memories

        # a preparation that fails: logged, the snapshot is made after the commit
        monkeypatch.setattr(eng.git, "commit", real_commit)

        def broken(change):  # type: ignore[no-untyped-def]
            raise Boom("no snapshot")

        monkeypatch.setattr(eng, "prepare", broken)
        eng.ingest([Item("a memory about trains", None, {})], "test")
        assert eng.query("trains", count_round=False).memories[0].content.endswith("trains")
        files = load_state(root)
        assert files.memory_ids() == eng.state.memory_ids() == eng.index.memory_ids()
    finally:
        eng.close()
