"""Issue 26: the writer operations of the archive job and of a session read what they
change, not the store: the archive moves its clusters in slices, the session's snapshot
comes from the committed copies of the clusters, and memories are found where they were
last seen."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import assert_same_as_files, git, make_store

from clagd.engine import archive as archive_mod
from clagd.engine import summary
from clagd.engine.core import Engine
from clagd.model import Cluster, Memory
from clagd.store.files import Paths, StoreState, write_cluster


def _store(tmp_path: Path, clusters: int) -> Path:
    root = make_store(tmp_path / "m", {"archive": {"cold_after_days": 0}})
    paths = Paths(root)
    for k in range(clusters):
        mems = [
            Memory.new(f"topic{k} note {i} about the thing number {k}", "2024-01-01T00:00:00Z")
            for i in range(3)
        ]
        write_cluster(paths, Cluster(f"c-{k:012x}", f"topic {k} notes", memories=mems))
    git(root, "add", "-A", "clusters")
    git(root, "commit", "-qm", "clusters")
    return root


def test_archive_moves_its_clusters_in_slices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(archive_mod, "ARCHIVE_SLICE", 3)
    eng = Engine(_store(tmp_path, 7))
    try:
        eng.stats.since = 0.0  # statistics as old as the store: never read means cold
        eng.writer.holds.reset()
        dry = eng.archive(dry_run=True)
        assert len(dry.clusters) == 7 and dry.commit is None
        out = eng.archive()
        assert len(out.clusters) == 7 and out.commit
        subjects = git(eng.root, "log", "--format=%s").splitlines()
        assert sum(s.startswith("archive:") for s in subjects) == 3  # 3 + 3 + 1
        assert eng.state.clusters == {} and len(eng.state.archived) == 7
        assert eng.writer.holds.by_op["_hot_op"] >= 0  # the scan's copy, off the writer
        assert eng._summaries == summary.summarize(eng.state)  # kept in step, not remade
        assert_same_as_files(eng)
    finally:
        eng.close()


def test_locate_many_finds_memories_where_they_were_last_seen() -> None:
    a = Memory.new("first memory", "2024-01-01T00:00:00Z")
    b = Memory.new("second memory", "2024-01-01T00:00:00Z")
    state = StoreState({"c-000000000001": Cluster("c-000000000001", "one two", memories=[a])})
    state.unsorted["u-1"] = [b]
    assert state.locate(b.id) == ("unsorted", "u-1")  # one pass notes every place
    # moved without a note: the hint is wrong, the answer is not
    state.unsorted["u-1"] = []
    state.clusters["c-000000000001"].memories.append(b)
    assert state.locate_many([a.id, b.id]) == {
        a.id: ("cluster", "c-000000000001", a),
        b.id: ("cluster", "c-000000000001", b),
    }
    state.clusters["c-000000000001"].memories.remove(a)
    assert state.memory(a.id) is None


def test_session_snapshot_is_the_committed_clusters(tmp_path: Path) -> None:
    eng = Engine(_store(tmp_path, 4))
    try:
        eng.add([{"content": "topic1 note again about the thing number 1"}])
        view = eng.writer.call(lambda ctx: ctx.hot_clusters())
        assert set(view) == set(eng.state.clusters)
        for cid, c in eng.state.clusters.items():
            assert [m.id for m in view[cid].memories] == [m.id for m in c.memories]
            assert view[cid] is not c and view[cid].memories is not c.memories
        out = eng.recluster(backend="none")
        assert out.status in ("accepted", "noop"), out.reasons
        after = eng.writer.call(lambda ctx: ctx.hot_clusters())
        assert {cid: [m.id for m in c.memories] for cid, c in after.items()} == {
            cid: [m.id for m in c.memories] for cid, c in eng.state.clusters.items()
        }
        assert eng._summaries == summary.summarize(eng.state)
        assert_same_as_files(eng)
    finally:
        eng.close()
