"""The relevance cut-offs of a query (docs/retrieval.md, "Precision"): `min_relative_score`
and `min_term_rarity`, on real index snapshots and through a real daemon's socket."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

from helpers import InProcessDaemon, make_store

from clagd.change import IndexChange
from clagd.config import RetrievalConfig
from clagd.model import Cluster, Memory
from clagd.retrieval.index import Index

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=timezone.utc)


def mem(text: str, minutes: int) -> Memory:
    at = (T0 + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return Memory.new(text, created_at=at)


# the README's store: the tour's five memories in its three clusters, and the Python
# example's memory, added after the session (unsorted)
COLD = mem("The user is sensitive to cold and keeps a sweater at the office", 15)
HEATING = mem("The user asked where the heating switch is in the flat", 20)
TRIP = mem("Trip to Lisbon booked for 12-16 May; hotel near Alfama", 60 * 24 * 39)
SEAT = mem("The user wants a window seat on flights", 60 * 24 * 39 + 5)
ANA = mem("Ana (the user's sister) is allergic to walnuts.", 60 * 24 * 49)
UNITS = mem("The user prefers metric units", 60 * 24 * 60)
README_CLUSTERS = {
    "c-f5460cdc177c": Cluster("c-f5460cdc177c", "Asked Cold Flat", memories=[COLD, HEATING]),
    "c-67f1b3fdc366": Cluster("c-67f1b3fdc366", "Allergic Ana Sister", memories=[ANA]),
    "c-4f926b4b82d5": Cluster("c-4f926b4b82d5", "Alfama Booked Flights", memories=[TRIP, SEAT]),
}
QUERY = "which units does the user like?"


def ids(res) -> list[str]:  # type: ignore[no-untyped-def]
    return [h.memory.id for h in res.memories]


def test_readme_example_without_the_generic_hits() -> None:
    """The issue's example: the right memory first, then four that share only "user" with
    the question, lifted by their clusters' scores (0.42-0.63 of the best). The rare-term
    cut drops those four; the relative cut at its measured setting does not."""
    cfg = RetrievalConfig()
    full = Index.build(README_CLUSTERS, [UNITS], cfg).search(QUERY)
    assert ids(full)[0] == UNITS.id
    assert set(ids(full)[1:]) == {ANA.id, HEATING.id, COLD.id, SEAT.id}
    assert min(h.score for h in full.memories[1:]) > 0.4 * full.memories[0].score
    cut = Index.build(README_CLUSTERS, [UNITS], RetrievalConfig(min_term_rarity=0.2)).search(QUERY)
    assert ids(cut) == [UNITS.id]
    assert cut.context == "[Memory · unsorted · 1 May 2026] The user prefers metric units"
    assert cut.tokens < full.tokens / 4
    rel = Index.build(README_CLUSTERS, [UNITS], RetrievalConfig(min_relative_score=0.4))
    assert len(rel.search(QUERY).memories) == 5


def test_a_hit_with_a_rare_term_of_its_own_is_kept() -> None:
    """Each hit is measured against the rarest query term the best hits match themselves:
    a hit matching a rare query term of its own survives even when another term is rarer."""
    cfg = RetrievalConfig(min_term_rarity=0.5)
    mems = [
        mem("The user collects vinyl records from Lisbon", 0),
        mem("The user visited Porto in spring", 1000),
        mem("The user visited Lisbon in autumn", 2000),
        mem("The user likes tea", 3000),
        mem("The user walks the dog", 4000),
    ]
    res = Index.build({}, mems, cfg).search("vinyl from Lisbon for the user", token_budget=0)
    got = ids(res)
    assert got[0] == mems[0].id
    assert mems[2].id in got  # "lisbon" is in 2 of 5: rarer than half of "vinyl"'s weight
    assert mems[3].id not in got and mems[4].id not in got  # "user" only
    full = Index.build({}, mems, RetrievalConfig()).search("vinyl Lisbon user", token_budget=0)
    assert len(full.memories) == 5


def test_a_reply_without_the_term_is_kept_through_its_neighbour() -> None:
    """The neighbour term finds a reply that shares no word with the question; the cut
    must keep it when its time neighbour in the cluster has the rare term, and drop a
    member whose neighbours and itself have only the generic one."""
    chat = [
        mem("Caroline: which pottery class did you take?", 0),
        mem("Melanie: the one at the community studio, every Tuesday", 1),
        mem("Caroline: lovely, the user group meets there too", 200),
        mem("Melanie: the user group is fun", 201),
        mem("Caroline: did you see the user forum?", 202),
        mem("Melanie: yes the user forum is busy", 203),
    ]
    c = Cluster("c-000000a1", "Pottery Studio", memories=chat)
    q = "what pottery class did the user take"
    full = Index.build({c.id: c}, [], RetrievalConfig()).search(q, max_memories=10)
    reply = chat[1].id  # no query word of its own
    assert reply in ids(full)
    cut = Index.build({c.id: c}, [], RetrievalConfig(min_term_rarity=0.3)).search(
        q, max_memories=10
    )
    assert ids(cut)[:1] == [chat[0].id]
    assert reply in ids(cut)
    # chat[2]'s neighbour chat[1] has no query term, chat[3]'s are chat[2] and chat[4]:
    # "user" only, far below "pottery"
    assert chat[3].id in ids(full) and chat[3].id not in ids(cut)
    assert chat[5].id in ids(full) and chat[5].id not in ids(cut)


def test_the_best_hit_is_always_kept() -> None:
    """A best hit whose only query word is less rare than another hit's stays; the next
    hit with only that word goes."""
    # hours apart: no memory is another's time neighbour (a neighbour's match would lift
    # it, and a neighbour's rare word keep it)
    generic = mem("tea, more tea, always tea", 0)
    rare = mem("the theremin concert was loud", 60)
    other = mem("green tea in the garden", 120)
    filler = [mem(f"a note about walking {i}", 180 + 60 * i) for i in range(4)]
    store = [generic, rare, other, *filler]
    full = Index.build({}, store, RetrievalConfig()).search("tea theremin", token_budget=0)
    assert ids(full) == [generic.id, rare.id, other.id]
    cut = Index.build({}, store, RetrievalConfig(min_term_rarity=1.0))
    assert ids(cut.search("tea theremin", token_budget=0)) == [generic.id, rare.id]


def test_rarity_cut_equal_on_incremental_and_rebuilt_snapshots() -> None:
    """The cut reads each hit's terms from the forward postings of whichever segment holds
    its slot: an index grown by many applies answers like one built at once."""
    cfg = RetrievalConfig(min_term_rarity=0.4)
    words = ["user", "tea", "garden", "lisbon", "vinyl", "porto", "boots", "rain"]
    mems = [
        mem(f"The user {words[i % 8]} {words[(i * 3) % 8]} note {i}", i * 40) for i in range(60)
    ]
    inc = Index.build({}, mems[:5], cfg)
    for i in range(5, 60, 5):
        inc = inc.apply(IndexChange(add_unsorted=mems[i : i + 5]))
    inc = inc.apply(IndexChange(remove_unsorted=[m.id for m in mems[10:20]]))
    whole = Index.build({}, mems[:10] + mems[20:], cfg)
    for q in ("user tea", "vinyl for the user", "rain boots lisbon", "garden user note"):
        a = inc.search(q, max_memories=10, token_budget=0)
        b = whole.search(q, max_memories=10, token_budget=0)
        assert ids(a) == ids(b)
        assert [round(h.score, 5) for h in a.memories] == [round(h.score, 5) for h in b.memories]


def test_daemon_applies_the_store_config(tmp_path: Path, short_tmp: Path) -> None:
    """Through a real daemon and socket: the tour's store, the Python example's query;
    with `retrieval.min_term_rarity` in clagd.yaml only the right memory comes back."""
    answers = {}
    for rarity in (0.0, 0.2):
        store = make_store(
            tmp_path / f"memory-{rarity}", {"retrieval": {"min_term_rarity": rarity}}
        )
        d = InProcessDaemon(store, short_tmp / f"s{int(rarity * 10)}.sock")
        try:
            with d.client() as c:
                c.add_many(
                    {"content": m.content, "created_at": m.created_at}
                    for m in (COLD, HEATING, TRIP, SEAT, ANA)
                )
                c.recluster()
                c.add(UNITS.content, created_at=UNITS.created_at)
                answers[rarity] = [m.content for m in c.query(QUERY).memories]
        finally:
            d.stop()
    assert answers[0.0][0] == UNITS.content and len(answers[0.0]) == 5
    assert answers[0.2] == [UNITS.content]
