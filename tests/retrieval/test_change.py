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
