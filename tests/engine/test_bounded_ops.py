"""Issue 26: the writer operations of the archive job and of a session read what they
change, not the store: the archive moves its clusters in slices, the session's snapshot
comes from the committed copies of the clusters, and memories are found where they were
last seen."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
from helpers import InProcessDaemon, assert_same_as_files, git, make_store, wait_for

from clagd.client import Client
from clagd.engine import archive as archive_mod
from clagd.engine import summary
from clagd.engine.core import Engine
from clagd.errors import ClagdError
from clagd.model import Cluster, Memory
from clagd.store.files import Paths, StoreState, write_cluster
from clagd.store.frozen import ClusterNames


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


def _names_now(eng: Engine) -> dict[str, set[str]]:
    """The writer's table of names, asked for every hot cluster's name; and its shared keys."""
    names = eng.writer.call(lambda ctx: ctx.cluster_names())
    table = {f"{c.scope}/{c.name}": names.bearing(c.scope, c.name) for c in _hot(eng)}
    table |= {f"shared {k}": ids for k, ids in names.shared().items()}
    assert len(names) == len(eng.state.clusters)
    return table


def _hot(eng: Engine) -> list[Cluster]:
    return list(eng.state.clusters.values())


def test_cluster_names_are_kept_in_step_with_every_change(tmp_path: Path) -> None:
    # a session's plan is checked against every other cluster's name from a table the
    # writer keeps (issue 26: three passes over 11k clusters in one apply); the table must
    # be what the state holds after every kind of change, a hand edit's included
    root = _store(tmp_path, 5)
    eng = Engine(root)
    try:

        def fresh() -> dict[str, set[str]]:
            names = ClusterNames(eng.state.clusters)
            table = {f"{c.scope}/{c.name}": names.bearing(c.scope, c.name) for c in _hot(eng)}
            return table | {f"shared {k}": ids for k, ids in names.shared().items()}

        assert _names_now(eng) == fresh()
        eng.add([{"content": "topic1 note again about the thing number 1"}])
        assert _names_now(eng) == fresh()
        # a hand edit gives cluster 0 the name of cluster 1 (same count of clusters)
        path = Paths(root).cluster_file("c-000000000000")
        path.write_text(path.read_text().replace("topic 0 notes", "Topic 1 Notes "))
        git(root, "commit", "-qam", "a person renames a cluster")
        eng.check_outside()  # (the person's commit moved the branch: taken in)
        assert eng.state.clusters["c-000000000000"].name.strip() == "Topic 1 Notes"
        now = _names_now(eng)
        assert now == fresh()
        one = eng.state.clusters["c-000000000001"]
        assert now[f"{one.scope}/{one.name}"] == {"c-000000000000", "c-000000000001"}
        # the plan's check sees the shared name: no plan is applied over it, and says why
        out = eng.recluster(backend="none")
        assert out.status == "failed"
        assert "duplicate cluster name 'topic 1 notes'" in out.reasons[0]
        assert _names_now(eng) == fresh()
        path.write_text(path.read_text().replace("Topic 1 Notes ", "topic zero notes"))
        git(root, "commit", "-qam", "and back")
        eng.check_outside()
        assert _names_now(eng) == fresh() and not ClusterNames(eng.state.clusters).shared()
        out = eng.recluster(backend="none")
        assert out.status in ("accepted", "noop"), out.reasons
        assert _names_now(eng) == fresh()
        eng.stats.since = 0.0
        eng.archive()
        assert _names_now(eng) == fresh() == {}
    finally:
        eng.close()


def test_a_plan_name_taken_by_a_hand_edit_is_refused() -> None:
    # validate_plan and check_touched answer from the writer's table: a name another
    # cluster bears (any case, outer spaces) in the same scope is refused, in another
    # scope it is not
    from clagd.organize.organizers import _LexicalPlan
    from clagd.organize.plan import Plan, PlanCluster
    from clagd.organize.plan_checks import validate_plan
    from clagd.organize.plan_invariants import Before, check_touched

    m = Memory.new("a memory about apples", "2024-01-01T00:00:00Z")
    other = Memory.new("another about pears", "2024-01-01T00:00:00Z")
    state = StoreState(
        {
            "c-000000000001": Cluster("c-000000000001", "fruit notes here", memories=[other]),
            "c-000000000002": Cluster("c-000000000002", "apple notes", memories=[], scope="alice"),
        }
    )
    state.unsorted["u-1"] = [m]
    names = ClusterNames(state.clusters)
    plan = Plan(
        clusters=[PlanCluster("new:1", " Fruit Notes Here", "about fruit", ["fruit"])],
        assign={m.id: "new:1"},
    )
    assert any("duplicate cluster name" in p for p in validate_plan(plan, [m.id], state, names))
    plan.clusters[0].name = "apple notes"  # taken in alice's scope only
    assert validate_plan(plan, [m.id], state, names) == []
    # a plan made off the writer no longer holds once a cluster it did not read took one
    # of its new names (any scope: it is made again rather than refused)
    made = _LexicalPlan(plan, [m.id], read={}, home={})
    plan.clusters[0].name = "vegetable notes"
    assert made.still_holds(state, names)
    plan.clusters[0].name = "Fruit notes here "
    assert not made.still_holds(state, names)
    # after a plan: a changed cluster named as one it did not change is an invariant broken
    before = Before(state)
    before.touch_cluster("c-000000000001")
    assert check_touched(before, state, names=names) == []
    state.clusters["c-000000000001"].scope = "alice"
    state.clusters["c-000000000001"].name = "Apple Notes"
    names.changed([], [state.clusters["c-000000000001"]])  # as the commit's publish does
    problems = check_touched(before, state, names=names)
    assert "two clusters are named 'apple notes'" in problems


def test_the_writers_copies_are_made_after_the_start_in_short_operations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cluster copies a session's snapshot takes, the clusters' names and the
    memories' places are made once the engine has started, by writer operations of at
    most PRIME_SLICE copies queued behind the writes (made before the first answer they
    were 0.3-0.4 s of a start at 100k); each cluster is copied once, and a write that
    changes a cluster meanwhile leaves its copy as it is now."""
    from clagd.engine import core
    from clagd.store import frozen as frozen_mod

    NEW = "topic0 note 7 about the thing number 0, topic0 again"  # goes into c-0...0
    monkeypatch.setattr(core, "PRIME_SLICE", 3)
    copied: list[str] = []
    real = frozen_mod.frozen_copy

    def counting(c: Cluster) -> Cluster:
        copied.append(c.id)
        return real(c)

    monkeypatch.setattr(frozen_mod, "frozen_copy", counting)
    root = _store(tmp_path, 10)
    started: list[str] = []
    real_prime = core.Engine._prime_op

    def _prime_op(self: core.Engine, ctx: object, step: int) -> None:
        if not started:  # an add queued before the second slice: it runs between them
            started.append("prime")
            self.writer.submit(lambda c: self.add([{"content": NEW}]))
        real_prime(self, ctx, step)  # type: ignore[arg-type]

    monkeypatch.setattr(core.Engine, "_prime_op", _prime_op)
    eng = Engine(root)
    try:
        state = eng.state
        n = sum(len(c.memories) for c in state.clusters.values()) + 1

        def done() -> bool:
            return eng.writer.idle.idle() and len(state.places) >= n

        assert wait_for(done, 20, "the writer's copies, names and places")
        assert eng.writer.holds.by_op["_prime_op"] >= 0
        assert NEW in {m.content for m in state.clusters["c-000000000000"].memories}
        # one copy each, made again for the cluster the add changed (copied in the first
        # slice, before the add ran); the view makes none
        assert sorted(copied) == sorted([*state.clusters, "c-000000000000"])
        assert copied[3] == "c-000000000000"  # the add ran after the first slice of 3
        view = eng.writer.frozen.view(state)
        assert len(copied) == 11
        assert set(view) == set(state.clusters)
        for cid, c in state.clusters.items():
            assert view[cid] is not c and view[cid].memories == c.memories
        assert eng.writer.frozen.names(state).bearing("default", "topic 3 notes")
    finally:
        eng.close()


def test_the_daemon_primes_once_it_serves_and_starts_without_a_gc_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer's copies are queued once the socket answers (made during the start, they
    shared the two cores with it), and no cyclic GC pass runs before the loaded heap is
    frozen (the first one would scan every object the load made)."""
    from clagd.engine import core
    from clagd.serve.daemon import Daemon

    root = _store(tmp_path, 10)
    sock = tmp_path / "d.sock"
    seen: dict[str, object] = {}
    real_prime, real_settle = core.Engine.prime, Daemon._settle_heap

    def prime(self: core.Engine) -> None:
        try:
            with Client(sock, timeout=5) as c:
                seen["ping"] = c.ping()
        except ClagdError as exc:
            seen["ping"] = str(exc)
        real_prime(self)

    def settle() -> None:
        seen["gc"] = gc.isenabled()
        real_settle()

    monkeypatch.setattr(core.Engine, "prime", prime)
    monkeypatch.setattr(Daemon, "_settle_heap", staticmethod(settle))
    assert gc.isenabled()
    d = InProcessDaemon(root, sock)
    try:
        assert seen["gc"] is False and gc.isenabled()
        assert getattr(seen["ping"], "pong", False), seen["ping"]
        state = d.engine.state
        n = sum(len(c.memories) for c in state.clusters.values())
        assert wait_for(lambda: len(state.places) >= n, 20, "the memories' places")
    finally:
        d.stop()
