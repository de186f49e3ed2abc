"""The one index change type: what `Index.apply` takes and every query process receives."""

from __future__ import annotations

import pickle

from clagd.change import IndexChange
from clagd.model import Cluster, Memory
from clagd.retrieval.index import Index


def _results(ix: Index, queries: list[str]) -> list[list[tuple[str, float]]]:
    return [[(h.memory.id, h.score) for h in ix.search(q).memories] for q in queries]


def test_a_change_keeps_tuples_and_says_when_it_is_empty() -> None:
    m = Memory.new("a note")
    change = IndexChange(add_unsorted=[m], remove_clusters=iter(["c-1"]))
    assert change.add_unsorted == (m,) and change.remove_clusters == ("c-1",)
    assert IndexChange().empty and not change.empty
    assert not IndexChange.whole([], []).empty  # a build replaces the snapshot
    assert pickle.loads(pickle.dumps(change)) == change


def test_a_build_change_makes_the_snapshot_index_build_makes() -> None:
    tea = Cluster("c-1", "Tea", memories=[Memory.new("green tea in the morning")])
    bikes = Cluster("c-2", "Bikes", memories=[Memory.new("fixed the bike chain")])
    loose = [Memory.new("a walk in the park with tea")]
    old = Index.build([tea], [Memory.new("something else entirely")])
    rebuilt = old.apply(IndexChange.whole([tea, bikes], loose))
    want = Index.build([tea, bikes], loose)
    assert rebuilt.memory_ids() == want.memory_ids() and rebuilt.n_clusters == 2
    queries = ["tea", "bike chain", "park walk", "something"]
    assert _results(rebuilt, queries) == _results(want, queries)
    assert old.apply(IndexChange()) is old  # nothing changes: the same snapshot


def test_the_scopes_a_snapshot_holds_follow_its_changes_without_a_pass() -> None:
    """A snapshot made by a change takes the scopes its parent held, plus what the change
    adds, without a pass over every cluster; whatever the changes, they are the scopes a
    pass over the new snapshot finds (a scope whose last cluster or memory leaves, leaves)."""
    import random

    from clagd.retrieval.scoping import scopes_held

    rnd = random.Random(7)
    scopes = ["default", "alice", "bob"]
    clusters: dict[str, Cluster] = {}
    loose: dict[str, Memory] = {}
    ix = Index.build([], [])
    scopes_held(ix)
    carried = 0
    for step in range(300):
        up: list[Cluster] = []
        gone: list[str] = []
        add: list[Memory] = []
        rm: list[str] = []
        for _ in range(rnd.randint(1, 3)):
            what = rnd.random()
            sc = rnd.choice(scopes) if rnd.random() < 0.3 else "default"
            if what < 0.35:
                cid = rnd.choice([*clusters, f"c-{step:04d}{rnd.randint(0, 9):04d}"])
                mem = Memory.new(f"note {step} {rnd.random()}", scope=sc)
                up.append(Cluster(cid, f"C {cid}", memories=[mem], scope=sc))
            elif what < 0.55 and clusters:
                gone.append(rnd.choice(sorted(clusters)))
            elif what < 0.8:
                add.append(Memory.new(f"loose {step} {rnd.random()}", scope=sc))
            elif loose:
                rm.append(rnd.choice(sorted(loose)))
        ix = ix.apply(
            IndexChange(
                upsert_clusters=up, remove_clusters=gone, add_unsorted=add, remove_unsorted=rm
            )
        )
        for cid in gone:
            clusters.pop(cid, None)
        clusters.update((c.id, c) for c in up)
        for mid in rm:
            loose.pop(mid, None)
        loose.update((m.id, m) for m in add)
        carried += "held" in ix.scope_cache
        want = {c.scope for c in clusters.values()} | {m.scope for m in loose.values()}
        assert scopes_held(ix) == want, step
    assert carried > 150  # most changes carry them forward
