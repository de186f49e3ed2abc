"""Routing new memories (`Index.route_many`, `retrieval.routing`): the batch answer equals
scoring one memory at a time, the route key, the kept term ids."""

from __future__ import annotations

import numpy as np
import pytest
from index_stores import COOKING, HIKING, mem, routing_store

from clagd.change import IndexChange
from clagd.config import Config, IngestConfig, RetrievalConfig
from clagd.model import Cluster, Memory
from clagd.retrieval import routing
from clagd.retrieval.index import Index


def test_route_needs_a_clear_winner():
    loose = IngestConfig(route_min_score=2.0, route_margin=1.0)
    ix = Index.build({c.id: c for c in (HIKING, COOKING)}, [], Config().retrieval, loose)
    strong = mem("hiking boots for the mountains hike, more hiking in rain", 9)
    assert ix.route_many([strong]) == [HIKING.id]
    assert ix.route_many([mem("bought a new car", 9)]) == [None]
    strict = Index.build(
        {c.id: c for c in (HIKING, COOKING)},
        [],
        RetrievalConfig(),
        IngestConfig(route_min_score=1000.0),
    )
    assert strict.route_many([strong]) == [None]


def _route_one(ix: Index, memory: Memory) -> str | None:
    """The reference `route_many` must equal: one memory's cluster-profile BM25 vector, its
    best slot by a stable sort, compared as Python floats."""
    if not ix.profiles.slot_of:
        return None
    scores = ix.cluster_bm25.scores(ix.term_ids(memory.content))
    if not len(scores):
        return None
    top = np.argsort(-scores, kind="stable")[:2]
    best = float(scores[top[0]])
    second = float(scores[top[1]]) if len(top) > 1 else 0.0
    if best >= ix.ingest.route_min_score and best - second >= ix.ingest.route_margin:
        return ix.profiles.clusters[int(top[0])].id
    return None


@pytest.mark.parametrize("idf_mode", ["lucene", "okapi"])
def test_route_many_equals_route_one_by_one(idf_mode, monkeypatch):
    clusters, batch = routing_store(11)
    loose = IngestConfig(route_min_score=1.0, route_margin=0.3)
    ix = Index.build(clusters, [], RetrievalConfig(idf=idf_mode), loose)
    one = [_route_one(ix, m) for m in batch]
    assert ix.route_many(batch) == one
    assert any(one) and not all(one)  # some routed, some not
    # several chunks of rows, several blocks in a chunk (memories of unequal term counts)
    monkeypatch.setattr(routing, "ROUTE_CELLS", 7 * len(ix.profiles.alive))
    monkeypatch.setattr(routing, "ROUTE_BLOCK", 2)
    assert len({len(ix.term_ids(m.content)) for m in batch}) > 2
    assert ix.route_many(batch) == one
    # in steps (the scoring thread's, pausing between them): the same answers, in order,
    # each step of `step` memories or fewer (a matrix of ROUTE_CELLS holds 7 rows here)
    for step in (1, 3, 7, 50):
        parts = list(ix.route_steps(batch, step))
        assert [cid for part in parts for cid in part] == one
        assert [len(p) for p in parts[:-1]] == [min(step, 7)] * (len(parts) - 1)
    monkeypatch.setattr(routing, "ROUTE_BLOCK", 32)
    # dead cluster slots (a rewritten and a removed cluster)
    cids = sorted(clusters)
    c = clusters[cids[0]]
    ix2 = ix.apply(
        IndexChange(
            upsert_clusters=[Cluster(c.id, "Other name", memories=c.memories[1:])],
            remove_clusters=[cids[1]],
        )
    )
    assert len(ix2.cluster_bm25.dead)
    assert ix2.route_many(batch) == [_route_one(ix2, m) for m in batch]
    assert ix2.route_many([]) == []
    assert Index.build({}, []).route_many(batch[:3]) == [None, None, None]


def test_the_route_key_changes_exactly_when_a_cluster_does() -> None:
    """`route_key` says when `route_many` answers made on an older snapshot still hold:
    the same object while only unsorted memories come and go, a new one for any cluster
    change, and never taken along in a pickle."""
    import pickle

    c = Cluster("c-1", "Sailing", memories=[Memory.new("sailing the boat in the harbour")])
    idx = Index.build([c], [])
    loose = Memory.new("the harbour wind was strong")
    more = idx.apply(IndexChange(add_unsorted=[loose]))
    assert more.route_key is idx.route_key
    assert more.apply(IndexChange(remove_unsorted=[loose.id])).route_key is idx.route_key
    grown = Cluster("c-1", "Sailing", memories=[*c.memories, Memory.new("boat trip")])
    assert more.apply(IndexChange(upsert_clusters=[grown])).route_key is not idx.route_key
    assert more.apply(IndexChange(remove_clusters=["c-1"])).route_key is not idx.route_key
    copy = pickle.loads(pickle.dumps(more, pickle.HIGHEST_PROTOCOL))
    assert copy.route_key is not more.route_key
    assert copy.route_many([loose]) == more.route_many([loose])


def test_routing_new_unsorted_memories_reuses_their_term_ids_and_answers_the_same() -> None:
    """The change that adds unsorted memories keeps their term ids (text order), so the
    route pass's `route_many` does not tokenize them again; the answers are the ones
    tokenizing gives, a memory whose text is not the one indexed is tokenized, and the
    ids are not taken along in a pickle."""
    import pickle

    clusters = [
        Cluster("c-1", "Sailing", memories=[Memory.new("sailing the boat in the harbour")]),
        Cluster("c-2", "Cooking", memories=[Memory.new("baking bread with ricotta cheese")]),
    ]
    idx = Index.build(clusters, [], ingest=IngestConfig(route_min_score=1.0, route_margin=0.3))
    loose = [
        Memory.new("the harbour boat and the sailing club"),
        Memory.new("ricotta bread baking again, the cheese"),
        Memory.new("nothing in common here at all"),
    ]
    more = idx.apply(IndexChange(add_unsorted=loose), routes=True)
    assert set(more.loose_tids) == {m.id for m in loose}
    want = idx.route_many(loose)
    assert want[:2] == ["c-1", "c-2"]
    assert more.route_many(loose) == want
    # same id, another text (not what was indexed): tokenized, not taken from the kept ids
    other = Memory(loose[0].id, "baking ricotta bread cheese", loose[0].created_at)
    assert more.route_many([other]) == idx.route_many([other]) == ["c-2"]
    assert not pickle.loads(pickle.dumps(more, pickle.HIGHEST_PROTOCOL)).loose_tids
    gone = IndexChange(remove_unsorted=[loose[2].id])
    assert not more.apply(gone, routes=True).loose_tids  # only the adding change keeps them
    assert not idx.apply(IndexChange(add_unsorted=loose)).loose_tids  # routes=False: none
