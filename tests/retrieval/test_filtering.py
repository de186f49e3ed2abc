"""Metadata filters inside retrieval (`where`) and reading a snapshot without a query
(`retrieval.listing`): the filter applies before the cut, so a filtered query fills its
answer; `newest` lists in time order."""

from __future__ import annotations

from index_stores import T0, mem

from clagd.model import Cluster
from clagd.protocol import check_where
from clagd.retrieval import searching
from clagd.retrieval.index import Index


def _store(padding: int = 0) -> Index:
    """Two clusters: gardening (web notes) and cars, three of whose chat notes mention the
    garden; and unsorted chat notes (and `padding` unrelated ones). A query for "garden"
    picks the gardening cluster."""
    garden = Cluster(
        "c-00000011",
        "Garden Work",
        memories=[
            mem(f"watered the garden tomatoes, round {i}", i, source="web") for i in range(12)
        ],
    )
    cars = Cluster(
        "c-00000012",
        "Car Repairs",
        memories=[
            mem(f"changed the car engine oil, visit {i}", 100 + i, source="web") for i in range(9)
        ]
        + [
            mem(f"parked the car by the garden gate, day {i}", 200 + i, source="chat")
            for i in range(3)
        ],
    )
    unsorted = [
        mem(f"a chat about the garden shed, note {i}", 300 + i, source="chat") for i in range(2)
    ]
    unsorted += [
        mem(f"the weather report, day {i}", 400 + i, source="chat") for i in range(padding)
    ]
    return Index.build({c.id: c for c in (garden, cars)}, unsorted)


def test_a_filter_finds_matches_outside_the_chosen_clusters():
    ix = _store()
    plain = ix.search("garden", max_memories=5, token_budget=0)
    assert plain.clusters[0][0] == "c-00000011"
    assert all(h.memory.metadata["source"] == "web" for h in plain.memories)
    chat = check_where({"source": "chat"})
    res = ix.search("garden", max_memories=5, token_budget=0, where=chat)
    # every chat memory that says "garden": the 3 in the car cluster, the 2 unsorted
    assert len(res.memories) == 5
    assert {h.memory.metadata["source"] for h in res.memories} == {"chat"}
    assert {h.cluster_id for h in res.memories} == {"c-00000012", None}


def test_a_filter_fills_the_answer_before_the_cut_to_k():
    ix = _store()
    web = check_where({"source": "web"})
    res = ix.search("garden car", max_memories=4, token_budget=0, where=web)
    assert len(res.memories) == 4
    assert all(h.memory.metadata["source"] == "web" for h in res.memories)
    # a filter nothing matches gives nothing, and is not served from the unfiltered cache
    none = ix.search("garden", max_memories=4, where=check_where({"source": "mail"}))
    assert none.memories == []
    assert ix.search("garden", max_memories=4).memories


def test_several_pairs_are_anded_and_values_compare_as_text():
    ix = Index.build(
        {},
        [
            mem("tea with alice", 1, user="alice", importance=1.0, pinned=True),
            mem("tea with bob", 2, user="bob", importance=1.0, pinned=True),
            mem("tea with alice again", 3, user="alice", importance=0.5, tags=["a"]),
        ],
    )
    both = check_where({"user": "alice", "importance": "1"})
    assert [h.memory.content for h in ix.search("tea", where=both).memories] == ["tea with alice"]
    flag = check_where({"pinned": True})
    assert len(ix.search("tea", where=flag).memories) == 2
    assert ix.search("tea", where=check_where({"pinned": "true"})).memories
    # a list-valued metadata key matches no scalar
    assert ix.search("tea", where=check_where({"tags": "a"})).memories == []


def test_newest_lists_in_time_order_with_filter_since_and_limit():
    ix = _store()
    hits, total = ix.newest(limit=3)
    assert total == len(ix) == 26
    assert [h.memory.content for h in hits] == [
        "a chat about the garden shed, note 1",
        "a chat about the garden shed, note 0",
        "parked the car by the garden gate, day 2",
    ]
    hits, total = ix.newest(check_where({"source": "chat"}), limit=100)
    assert total == 5 and len(hits) == 5
    assert hits[-1].cluster_id == "c-00000012" and hits[-1].cluster_name == "Car Repairs"
    since = (T0.timestamp()) + 200 * 60
    hits, total = ix.newest(since=since, limit=100)
    assert total == 5  # minutes 200-202 and 300-301
    hits, total = ix.newest(check_where({"source": "web"}), since=since)
    assert (hits, total) == ([], 0)


def test_find_gives_a_memory_where_it_is_filed():
    ix = _store()
    some = ix.newest(check_where({"source": "chat"}), limit=1)[0][0]
    found = ix.find(some.memory.id)
    assert found is not None and found.memory == some.memory and found.cluster_id is None
    assert ix.find("m-0000000000000000") is None


def test_testing_the_slots_and_the_mask_give_the_same_answer():
    """A filter's first queries on a snapshot test their own slots; from the MASK_AFTER-th
    on (or after a `list`) they read the snapshot's mask: the same answers either way."""
    ix = _store(padding=400)  # a query's slots are a small part of the store
    chat = check_where({"source": "chat"})
    queries = ["garden", "car garden gate", "shed note", "parked gate"]
    before = [ix.search(q, max_memories=5, token_budget=0, where=chat) for q in queries]
    assert chat not in ix.filters and all(r.memories for r in before)
    masked = _store(padding=400)
    searching.where_mask(masked, chat)
    after = [masked.search(q, max_memories=5, token_budget=0, where=chat) for q in queries]
    assert [[h.memory.id for h in r.memories] for r in before] == [
        [h.memory.id for h in r.memories] for r in after
    ]
    for i in range(searching.MASK_AFTER):  # distinct queries: none answered from the cache
        ix.search(f"garden round {i}", where=check_where({"user": "x"}))
    assert check_where({"user": "x"}) in ix.filters  # asked often enough: the mask is made
