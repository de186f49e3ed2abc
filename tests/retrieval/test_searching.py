"""Searching a snapshot (`retrieval.searching`): the two-level ranking against a dense
reference, the cut-offs, the token budget, the result shape."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import pytest
from index_stores import COOKING, HIKING, T0, cluster, mem, random_store

from clagd.change import IndexChange
from clagd.config import RetrievalConfig
from clagd.model import Cluster, Memory
from clagd.retrieval import searching
from clagd.retrieval.index import Index


def test_one_cluster_of_three_memories_scores_positive():
    ix = Index.build({HIKING.id: HIKING}, [])
    res = ix.search("hiking boots")
    assert res.memories, "a tiny store must still find its matches"
    assert res.memories[0].memory.content == "New hiking boots arrived"
    assert all(h.score > 0 for h in res.memories)
    assert res.clusters[0][:2] == (HIKING.id, "Hiking Trips")
    # "hiking" and "hike" share a stem: in all 3 documents, where rank-bm25's IDF is < 0
    scores = ix.memory_scores("hiking")
    assert sum(s > 0 for s in scores.values()) == 3


def test_two_clusters_pick_the_right_one():
    ix = Index.build({c.id: c for c in (HIKING, COOKING)}, [])
    res = ix.search("ricotta lasagna", max_memories=3)
    assert res.memories[0].memory.content == "Lasagna recipe uses ricotta"
    assert res.memories[0].cluster_name == "Cooking Recipes"
    assert {h.cluster_id for h in res.memories} == {COOKING.id}
    assert res.clusters[0][0] == COOKING.id


def test_empty_store_and_stopword_query_give_empty_results():
    empty = Index.build({}, [])
    res = empty.search("anything at all")
    assert res.memories == [] and res.context == "" and res.tokens == 0
    assert empty.route_many([mem("hiking")]) == [None]
    ix = Index.build({HIKING.id: HIKING}, [mem("unsorted note about hiking", 9)])
    assert ix.search("the and of what is it").memories == []
    assert ix.search("").memories == []
    assert ix.search("zebra quantum").memories == []


def test_unsorted_area_is_always_searched():
    ix = Index.build({c.id: c for c in (HIKING, COOKING)}, [mem("Paid the electricity bill", 5)])
    res = ix.search("electricity bill")
    assert res.memories[0].cluster_id is None
    assert res.memories[0].cluster_name == "unsorted"
    assert "[Memory · unsorted · 1 January 2024] Paid the electricity bill" in res.context


def test_to_dict_has_the_protocol_shape():
    ix = Index.build({HIKING.id: HIKING}, [])
    d = ix.search("hiking").to_dict()
    assert set(d) == {"memories", "clusters", "context", "tokens"}
    assert set(d["memories"][0]) == {
        "id",
        "content",
        "cluster_id",
        "cluster_name",
        "score",
        "created_at",
        "metadata",
        "scope",
    }
    assert set(d["clusters"][0]) == {"id", "name", "score"}
    assert d["context"].startswith("[Memory · Hiking Trips · 1 January 2024] ")


def test_superseded_memory_ranks_below_its_successor():
    old = mem("My phone number is 555 0100, call my phone number", 1)
    new = mem("My phone number changed to 555 0199", 2)
    c = Cluster("c-000000bb", "Contact Details", memories=[old, new], supersedes={new.id: old.id})
    res = Index.build({c.id: c}, []).search("phone number")
    assert [h.memory.id for h in res.memories[:2]] == [new.id, old.id]
    plain = Cluster("c-000000bb", "Contact Details", memories=[old, new])
    no_tie = RetrievalConfig(recency_tie=0.0)
    res2 = Index.build({plain.id: plain}, [], no_tie).search("phone number")
    assert res2.memories[0].memory.id == old.id  # without the link the old one wins
    # ... unless the newer statement of the same thing ranks first (`recency_tie`)
    res3 = Index.build({plain.id: plain}, []).search("phone number")
    assert res3.memories[0].memory.id == new.id


def test_the_newer_of_two_statements_of_one_fact_ranks_first():
    """Near-equal own relevance and most terms shared: the newer first, wherever the
    cluster evidence puts it; another fact sharing only the query's words is not moved."""
    old = mem("Marta works at Siemens in the design team", 1)
    busy = [mem(f"Marta works late on project {i}, design reviews", 2 + i) for i in range(3)]
    team = Cluster("c-000000a1", "Marta at work", memories=[old, *busy])
    new = mem("Marta works at Bosch in the design team", 90)
    other = mem("Where Marta works the canteen is cheap", 95)
    ix = Index.build({team.id: team}, [new, other])
    hits = {h.memory.id: h.score for h in ix.search("where does marta work", 6).memories}
    flat = Index.build({team.id: team}, [new, other], RetrievalConfig(recency_tie=0.0))
    base = {h.memory.id: h.score for h in flat.search("where does marta work", 6).memories}
    assert base[new.id] < base[old.id]  # the cluster evidence put it below
    assert hits[new.id] > hits[old.id]
    assert hits[other.id] == base[other.id]  # another statement: not moved


def _newer_first_pairwise(
    ix: Index, cand: np.ndarray, score: np.ndarray, s: np.ndarray, limit: int
) -> np.ndarray:
    """The pairwise reference of `searching.newer_first` (its first form): each best hit
    against every found memory in turn, the shared terms as Python sets."""
    delta = ix.cfg.recency_tie
    nz = np.flatnonzero(score)
    if len(nz) < 2:
        return score
    best = nz[np.argsort(-score[nz], kind="stable")[:limit]]
    ts, own, slots = ix.memories.ts[cand[nz]], s[cand[nz]], cand[nz]
    lifted = np.zeros(len(nz), dtype=np.float32)

    def terms(slot: int) -> set[int]:
        for seg in ix.memories.segs:
            if seg.start <= slot < seg.stop:
                j = slot - seg.start
                return set(seg.ftid[int(seg.fptr[j]) : int(seg.fptr[j + 1])].tolist())
        return set()

    for slot, sa, sc in zip(cand[best].tolist(), s[cand[best]].tolist(), score[best].tolist()):
        near = (ts > ix.memories.ts[slot]) & (np.abs(own - sa) <= delta * np.maximum(own, sa))
        mine = terms(slot)
        for i in np.flatnonzero(near).tolist():
            theirs = terms(int(slots[i]))
            if len(mine & theirs) >= searching.SAME_STATEMENT * min(len(mine), len(theirs)):
                lifted[i] = max(lifted[i], np.float32(sc) * np.float32(1.0001))
    if not lifted.any():
        return score
    out = score.copy()
    out[nz] = np.maximum(out[nz], lifted)
    return out


@pytest.mark.parametrize("table", [True, False])
def test_newer_first_equals_the_pairwise_reference(monkeypatch, table):
    """Every call of a search's `newer_first` gives exactly the pairwise reference's scores:
    restatements (one word changed, later, in later segments), dead slots, several
    `recency_tie` values and limits, both ways of finding the shared terms."""
    if not table:
        monkeypatch.setattr(searching, "TABLE_CELLS", 0)
    real, moved = searching.newer_first, []

    def check(ix, cand, score, s, limit):
        want = _newer_first_pairwise(ix, cand, score, s, limit)
        got = real(ix, cand, score, s, limit)
        assert got.dtype == want.dtype and np.array_equal(got, want)
        moved.append(not np.array_equal(got, score))
        return got

    monkeypatch.setattr(searching, "newer_first", check)
    clusters, unsorted, vocab, rng = random_store(11, n_clusters=8, per=9, n_unsorted=20)
    queries = [" ".join(rng.choices(vocab, k=rng.randint(1, 4))) for _ in range(40)]
    for tie in (0.2, 0.5, 1.0):
        ix = Index.build(clusters, unsorted, RetrievalConfig(recency_tie=tie))
        for batch in range(3):  # each a segment of its own
            olds = rng.sample([m for c in clusters.values() for m in c.memories], 12)
            again = [
                mem(o.content.replace(rng.choice(o.content.split()), rng.choice(vocab)), 100 + i)
                for i, o in enumerate(olds)
            ]
            ix = ix.apply(IndexChange(add_unsorted=again, remove_unsorted=[unsorted[batch].id]))
        assert len(ix.memories.segs) > 1 and ix.memories.n_alive < len(ix.memories.alive)
        for q in queries:
            for k in (1, 5, 12):
                ix.search(q, max_memories=k, token_budget=0)
    assert any(moved) and not all(moved)


def test_archive_results_are_merged_on_request():
    hot = Index.build({HIKING.id: HIKING}, [])
    cold_cluster = cluster("c-000000cc", "Old Garden Notes", ["Planted tulip bulbs in autumn"])
    cold = Index.build({cold_cluster.id: cold_cluster}, [])
    assert hot.search("tulip bulbs").memories == []
    res = hot.search("tulip bulbs hiking", max_memories=5, archive=cold)
    names = {h.cluster_name for h in res.memories}
    assert names == {"Old Garden Notes", "Hiking Trips"}
    assert cold_cluster.id in {c[0] for c in res.clusters}


def test_token_budget_cuts_the_context():
    texts = [f"hiking story number {i} " + "with many extra words " * 8 for i in range(10)]
    c = cluster("c-000000dd", "Hiking Stories", texts)
    ix = Index.build({c.id: c}, [])
    full = ix.search("hiking story", max_memories=10, token_budget=0)
    assert len(full.memories) == 10
    cut = ix.search("hiking story", max_memories=10, token_budget=150)
    assert 0 < len(cut.memories) < 10
    assert cut.tokens <= 150
    assert [h.memory.id for h in cut.memories] == [h.memory.id for h in full.memories][
        : len(cut.memories)
    ]
    assert ix.search("hiking story", max_memories=10).tokens <= RetrievalConfig().token_budget
    assert len(ix.search("hiking story").memories) == RetrievalConfig().max_memories


def test_freshness_and_confidence_only_when_enabled():
    a = Memory.new("project deadline moved", "2020-01-01T00:00:00Z", {"importance": 0.1})
    b = Memory.new("project deadline set", "2024-01-01T00:00:00Z", {"importance": 0.9})
    now = datetime(2024, 1, 2, tzinfo=timezone.utc)
    off = Index.build({}, [a, b]).search("project deadline moved set", now=now)
    on = Index.build(
        {}, [a, b], RetrievalConfig(use_freshness=True, freshness_weight=0.5, confidence_weight=0.5)
    )
    ranked = on.search("project deadline", now=now)
    assert ranked.memories[0].memory.id == b.id
    assert len(off.memories) == 2


def test_context_is_grouped_by_cluster():
    ix = Index.build(
        {c.id: c for c in (HIKING, COOKING)},
        [],
        RetrievalConfig(cluster_weight=0.0, neighbor_weight=0.0),
    )
    res = ix.search("hiking rain bread rye tomato", max_memories=6)
    names = [line.split("]")[0] for line in res.context.splitlines()]
    # each cluster's lines are contiguous
    assert names == sorted(names, key=names.index)
    assert len(set(names)) == 2


def test_search_with_given_clusters_replaces_the_lexical_choice():
    ix = Index.build({c.id: c for c in (HIKING, COOKING)}, [])
    assert ix.search("hiking boots").clusters[0][0] == HIKING.id
    res = ix.search("hiking boots", clusters=[COOKING.id, "c-99999999"])
    assert [c[0] for c in res.clusters] == [COOKING.id]
    assert all(h.cluster_id != HIKING.id for h in res.memories)
    cands = ix.cluster_candidates("hiking ricotta", 5)
    assert {c[0] for c in cands} == {HIKING.id, COOKING.id}


def _time_links(ix: Index) -> tuple[np.ndarray, np.ndarray]:
    """The reference time neighbours: every live slot sorted by (created_at, id) from
    scratch, each linked to the next one when they are within the gap (unknown times
    never link)."""
    n = len(ix.memories.alive)
    prev, nxt = np.full(n, -1), np.full(n, -1)

    def when(slot: int) -> float:
        t = float(ix.memories.ts[slot])
        return -np.inf if np.isnan(t) else t

    live = sorted(
        np.flatnonzero(ix.memories.alive).tolist(), key=lambda i: (when(i), ix.memories.mems[i].id)
    )
    gap = ix.cfg.neighbor_gap_minutes * 60
    for a, b in zip(live, live[1:]):
        if when(a) > -np.inf and when(b) - when(a) <= gap:
            nxt[a], prev[b] = b, a
    return prev, nxt


def _dense_rank(ix: Index, text: str, limit: int, now: float | None = None, only=None):
    """The dense reference of `searching.rank` (every slot scored, as before candidate
    scoring): (memory id, score) of the top `limit`, ties by id."""
    q = [i for i in map(ix.vocab.get, ix.tokens(text)) if i is not None]
    if not q or ix.memories.n_alive == 0:
        return []
    cfg = ix.cfg
    s = ix.memory_bm25.scores(q)
    smax = float(s.max()) if len(s) else 0.0
    cs = ix.cluster_bm25.scores(q)
    c_norm = np.zeros(len(cs) + 1, dtype=np.float32)
    selected = np.zeros(len(cs) + 1, dtype=bool)
    chosen = False
    if only is not None:
        order = np.asarray(
            [ix.profiles.slot_of[c] for c in only if c in ix.profiles.slot_of], dtype=np.int64
        )
        if len(order):
            cmax = float(cs[order].max())
            if cmax > 0:
                c_norm[:-1] = np.maximum(cs / cmax, 0.0)
            selected[order] = chosen = True
    elif len(cs) and cfg.top_clusters > 0:
        order = np.argsort(-cs, kind="stable")[: cfg.top_clusters]
        order = order[cs[order] > 0]
        if len(order):
            c_norm[:-1] = cs / float(cs[order[0]])
            selected[order] = chosen = True
    if smax <= 0 and not chosen:
        return []
    sn = s / smax if smax > 0 else s
    score = sn.copy()
    if cfg.cluster_weight:
        score += cfg.cluster_weight * c_norm[ix.memories.group]
    home = ix.unsorted | selected[ix.memories.group]
    found = (s > 0) & home
    eligible = found.copy()
    if cfg.neighbor_weight:
        prev, nxt = (
            _time_links(ix) if cfg.neighbors == "time" else (ix.memories.prev, ix.memories.nxt)
        )
        pad = np.append(sn, np.float32(0.0))
        nb = np.maximum(pad[prev], pad[nxt])
        score += cfg.neighbor_weight * nb
        eligible |= (nb > 0) & selected[ix.memories.group]
        if cfg.neighbors == "time":  # the time neighbour of a match, wherever filed
            fpad = np.append(found, False)
            eligible |= fpad[prev] | fpad[nxt]
            two_back = np.where(prev >= 0, prev[prev], -1)
            two_on = np.where(nxt >= 0, nxt[nxt], -1)
            score += cfg.second_neighbor_weight * np.maximum(pad[two_back], pad[two_on])
    eligible &= ix.memories.alive
    if cfg.use_freshness:
        score = score * searching.quality(ix, now, np.arange(len(score)))
    if len(ix.sup_old):
        score[ix.sup_old] *= cfg.superseded_penalty
        score[ix.sup_old] = np.minimum(score[ix.sup_old], score[ix.sup_new] * np.float32(0.999))
    score = np.where(eligible & (score > 0), score, 0.0)
    nz = np.flatnonzero(score)
    top = sorted((-float(score[i]), ix.memories.mems[int(i)].id) for i in nz)[:limit]
    return [(mid, -neg) for neg, mid in top]


def _check_dense(ix: Index, queries: list[str], now: float | None = None) -> None:
    for q in queries:
        for only in (None, sorted(ix.profiles.slot_of)[:2]):
            hits, _ = searching.rank(ix, ix.tokens(q), 9, now, only)
            got = [(h.memory.id, h.score) for h, *_ in hits]
            assert got == _dense_rank(ix, q, 9, now, only)  # exactly: same float32 steps


@pytest.mark.parametrize("freshness", [False, True])
@pytest.mark.parametrize("neighbors", ["time", "cluster"])
def test_candidate_scoring_equals_the_dense_reference(freshness, neighbors):
    clusters, unsorted, vocab, rng = random_store(7, n_clusters=8, per=7, n_unsorted=15)
    cfg = RetrievalConfig(use_freshness=freshness, top_clusters=3, neighbors=neighbors)
    # a supersedes link inside one cluster
    c0 = clusters["c-00000000"]
    clusters["c-00000000"] = Cluster(
        c0.id, c0.name, memories=c0.memories, supersedes={c0.memories[1].id: c0.memories[0].id}
    )
    ix = Index.build(clusters, unsorted, cfg)
    queries = [" ".join(rng.choices(vocab, k=rng.randint(1, 4))) for _ in range(30)]
    now = (T0 + timedelta(days=3)).timestamp()
    _check_dense(ix, queries, now)
    # dead slots: a changed memory, a removed cluster, removed unsorted memories
    c1 = clusters["c-00000001"]
    edited = [mem(c1.memories[0].content + " w5 edited", 50), *c1.memories[1:]]
    ix2 = ix.apply(
        IndexChange(
            upsert_clusters=[Cluster(c1.id, "Renamed", memories=edited)],
            remove_clusters=["c-00000002"],
            add_unsorted=[mem(" ".join(rng.choices(vocab, k=5)), 60)],
            remove_unsorted=[m.id for m in unsorted[:4]],
        )
    )
    assert ix2.memories.n_alive < len(ix2.memories.alive)
    _check_dense(ix2, queries, now)


def test_relative_cut_off_drops_weak_hits():
    texts = ["python packaging with uv and wheels", "the user likes tea", "the user walks"]
    c = cluster("c-000000ee", "Notes", texts)
    q = "python packaging for the user"
    full = Index.build({c.id: c}, []).search(q, max_memories=5, token_budget=0)
    assert len(full.memories) == 3
    cut = Index.build({c.id: c}, [], RetrievalConfig(min_relative_score=0.9)).search(
        q, max_memories=5, token_budget=0
    )
    best = full.memories[0].score
    assert [h.memory.id for h in cut.memories] == [
        h.memory.id for h in full.memories if h.score >= 0.9 * best
    ]
    assert 1 <= len(cut.memories) < 3 and cut.tokens < full.tokens


def test_sorted_set_equals_np_unique():
    from clagd.retrieval.searching import sorted_set as _sorted_set

    rng = np.random.default_rng(3)
    for n, k in [(1000, 0), (1000, 1), (1000, 2), (1000, 40), (1000, 900), (50, 300)]:
        for dtype in (np.int32, np.int64):
            slots = rng.integers(0, n, size=k).astype(dtype)
            got = _sorted_set(slots, n)
            want = np.unique(slots.astype(np.int64))
            assert got.dtype == np.int64 and np.array_equal(got, want)
