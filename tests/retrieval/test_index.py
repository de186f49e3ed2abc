import random
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest
from rank_bm25 import BM25Okapi

from clagd.config import Config, IngestConfig, RetrievalConfig
from clagd.model import Cluster, Memory
from clagd.retrieval.change import IndexChange
from clagd.retrieval.index import Index
from clagd.text import tokenize

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)


def mem(text: str, i: int = 0, **meta) -> Memory:
    at = (T0 + timedelta(minutes=i)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return Memory.new(text, created_at=at, metadata=meta)


def cluster(cid: str, name: str, texts: list[str], start: int = 0, **kw) -> Cluster:
    """Members one minute apart from `start` minutes after T0 (clusters of the same minutes
    are one conversation: their memories are each other's time neighbours)."""
    return Cluster(cid, name, memories=[mem(t, start + i) for i, t in enumerate(texts)], **kw)


HIKING = cluster(
    "c-00000001",
    "Hiking Trips",
    ["I love hiking in the mountains", "New hiking boots arrived", "Rain ruined the hike"],
)
COOKING = cluster(
    "c-00000002",
    "Cooking Recipes",
    ["Lasagna recipe uses ricotta", "Baked bread with rye flour", "Tomato soup for dinner"],
    start=24 * 60,  # the next day
)


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
    assert "[Memory · unsorted] Paid the electricity bill" in res.context


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
    }
    assert set(d["clusters"][0]) == {"id", "name", "score"}
    assert d["context"].startswith("[Memory · Hiking Trips] ")


def _random_store(seed: int, n_clusters: int = 6, per: int = 8, n_unsorted: int = 10):
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(120)]
    clusters = {}
    k = 0
    for c in range(n_clusters):
        texts = [
            " ".join(rng.choices(vocab, k=rng.randint(3, 12))) + f" u{k + i}" for i in range(per)
        ]
        k += per
        cid = f"c-{c:08x}"
        clusters[cid] = cluster(cid, f"Topic {c} notes", texts)
    unsorted = [mem(" ".join(rng.choices(vocab, k=6)) + f" x{i}", i) for i in range(n_unsorted)]
    return clusters, unsorted, vocab, rng


def _same(a: Index, b: Index, queries: list[str]) -> None:
    assert len(a) == len(b) and a.n_clusters == b.n_clusters
    for q in queries:
        sa = a.memory_scores(q)
        sb = b.memory_scores(q)
        assert sa.keys() == sb.keys()
        for mid in sa:
            assert sa[mid] == pytest.approx(sb[mid], rel=1e-5, abs=1e-6)
        ra, rb = a.search(q, max_memories=7), b.search(q, max_memories=7)
        assert [h.memory.id for h in ra.memories] == [h.memory.id for h in rb.memories]
        assert [h.score for h in ra.memories] == pytest.approx([h.score for h in rb.memories])
        assert ra.context == rb.context


def test_incremental_apply_equals_full_rebuild():
    clusters, unsorted, vocab, rng = _random_store(1)
    ix = Index.build(clusters, unsorted)
    cids = sorted(clusters)
    # a session: one cluster removed, one changed (takes two unsorted memories), new unsorted
    gone = cids[0]
    changed = clusters[cids[1]]
    moved = unsorted[:2]
    changed2 = Cluster(changed.id, "Renamed topic", memories=changed.memories[2:] + moved)
    added = [mem("fresh note " + " ".join(rng.choices(vocab, k=5)), 99)]
    inc = ix.apply(
        IndexChange(
            upsert_clusters=[changed2],
            remove_clusters=[gone],
            add_unsorted=added,
            remove_unsorted=[m.id for m in moved],
        )
    )
    final = {cid: c for cid, c in clusters.items() if cid != gone}
    final[changed2.id] = changed2
    full = Index.build(final, unsorted[2:] + added)
    queries = [" ".join(rng.choices(vocab, k=3)) for _ in range(25)] + ["renamed topic w3"]
    _same(inc, full, queries)
    # the old snapshot is untouched
    _same(ix, Index.build(clusters, unsorted), queries[:5])


def test_compaction_keeps_results():
    clusters, unsorted, vocab, rng = _random_store(2, n_clusters=3, per=5, n_unsorted=1200)
    ix = Index.build(clusters, unsorted)
    ix2 = ix.apply(IndexChange(remove_unsorted=[m.id for m in unsorted[:1100]]))
    assert len(ix2._mems) == len(ix2)  # dead slots outnumbered live ones: compacted
    full = Index.build(clusters, unsorted[1100:])
    _same(ix2, full, [" ".join(rng.choices(vocab, k=3)) for _ in range(10)])


def test_memory_idf_comes_from_the_whole_store():
    # "rare" is in 1 of 3 memories of the cluster but in 40 unsorted memories
    c = cluster("c-000000aa", "Misc Notes", ["rare word here", "other text", "more text"])
    unsorted = [mem(f"rare filler {i}", i) for i in range(40)]
    unsorted += [mem(f"different stuff {i}", i) for i in range(40)]
    ix = Index.build({c.id: c}, unsorted)
    alone = Index.build({c.id: c}, [])
    mid = c.memories[0].id
    assert ix.memory_scores("rare")[mid] < alone.memory_scores("rare")[mid]
    n, df = 83, 41
    idf = np.log1p((n - df + 0.5) / (df + 0.5))
    assert ix.memory_scores("rare")[mid] > 0
    k1, b = 1.2, 0.75
    avgdl = sum(len(tokenize(m.content)) for m in [*c.memories, *unsorted]) / n
    dl = len(tokenize("rare word here"))
    expect = idf * (k1 + 1) / (1 + k1 * (1 - b + b * dl / avgdl))
    assert ix.memory_scores("rare")[mid] == pytest.approx(expect, rel=1e-5)


def test_bm25_matches_rank_bm25_okapi_on_a_mid_size_corpus():
    rng = random.Random(7)
    vocab = [f"term{i}" for i in range(400)]
    weights = [1.0 / (i + 1) for i in range(len(vocab))]
    texts = [
        " ".join(rng.choices(vocab, weights=weights, k=rng.randint(5, 30))) for _ in range(300)
    ]
    texts = list(dict.fromkeys(texts))
    mems = [mem(t, i) for i, t in enumerate(texts)]
    ix = Index.build({}, mems, RetrievalConfig(idf="okapi"))
    okapi = BM25Okapi([tokenize(t) for t in texts], k1=1.2, b=0.75)
    checked = 0
    for q in ["term5 term17 term80", "term40 term41", "term150 term3 term3 term399"]:
        toks = tokenize(q)
        df = {t: sum(1 for d in okapi.doc_freqs if t in d) for t in toks}
        assert all(0 < d < len(texts) / 2 for d in df.values())  # no IDF floor
        ours = ix.memory_scores(q)
        theirs = okapi.get_scores(toks)
        for m, s in zip(mems, theirs):
            assert ours[m.id] == pytest.approx(s, rel=1e-4, abs=1e-5)
            checked += 1
    assert checked == 3 * len(texts)


def test_superseded_memory_ranks_below_its_successor():
    old = mem("My phone number is 555 0100, call my phone number", 1)
    new = mem("My phone number changed to 555 0199", 2)
    c = Cluster("c-000000bb", "Contact Details", memories=[old, new], supersedes={new.id: old.id})
    res = Index.build({c.id: c}, []).search("phone number")
    assert [h.memory.id for h in res.memories[:2]] == [new.id, old.id]
    plain = Cluster("c-000000bb", "Contact Details", memories=[old, new])
    res2 = Index.build({plain.id: plain}, []).search("phone number")
    assert res2.memories[0].memory.id == old.id  # without the link the old one wins


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


def test_many_mixed_changes_equal_a_full_rebuild():
    """Ingest batches, routing into clusters, sessions that move, merge, split, rename and
    delete clusters, metadata edits: after every step the incremental snapshot answers
    exactly like one built from scratch, and older snapshots keep their answers."""
    clusters, unsorted, vocab, rng = _random_store(3, n_clusters=5, per=6, n_unsorted=8)
    clusters = dict(clusters)
    unsorted = list(unsorted)
    ix = Index.build(clusters, unsorted)
    history = [(ix, dict(clusters), list(unsorted))]
    queries = [" ".join(rng.choices(vocab, k=3)) for _ in range(8)] + ["topic notes w7"]
    n = 1000
    for step in range(60):
        op = rng.choice(["ingest", "route", "session", "delete", "rename", "edit", "split"])
        kw: dict = {}
        if op == "ingest":
            new = [mem(" ".join(rng.choices(vocab, k=5)) + f" n{n + i}", n + i) for i in range(4)]
            n += 4
            unsorted += new
            kw = {"add_unsorted": new}
        elif op == "route" and clusters:
            cid = rng.choice(sorted(clusters))
            m = mem(" ".join(rng.choices(vocab, k=4)) + f" r{n}", n)
            n += 1
            c = clusters[cid]
            clusters[cid] = Cluster(cid, c.name, memories=[*c.memories, m])
            kw = {"upsert_clusters": [clusters[cid]]}
        elif op == "session" and unsorted and clusters:
            take = unsorted[: rng.randint(1, 4)]
            unsorted = unsorted[len(take) :]
            a, b = (
                (rng.sample(sorted(clusters), 2) + [None])[:2]
                if len(clusters) > 1
                else (
                    next(iter(clusters)),
                    None,
                )
            )
            merged = clusters[a].memories + take
            removed = []
            if b is not None and rng.random() < 0.5:  # merge b into a
                merged += clusters.pop(b).memories
                removed = [b]
            clusters[a] = Cluster(a, f"Merged {step}", memories=merged)
            kw = {
                "upsert_clusters": [clusters[a]],
                "remove_clusters": removed,
                "remove_unsorted": [m.id for m in take],
            }
        elif op == "delete" and clusters:
            cid = rng.choice(sorted(clusters))
            back = clusters.pop(cid).memories
            unsorted += back  # its memories go back to unsorted
            kw = {"remove_clusters": [cid], "add_unsorted": back}
        elif op == "rename" and clusters:
            cid = rng.choice(sorted(clusters))
            c = clusters[cid]
            clusters[cid] = Cluster(
                cid, f"Renamed {step}", "new words", ["tag"], memories=c.memories
            )
            kw = {"upsert_clusters": [clusters[cid]]}
        elif op == "edit" and clusters:
            cid = rng.choice(sorted(clusters))
            c = clusters[cid]
            if c.memories:
                old = c.memories[0]
                edited = Memory(old.id, old.content, old.created_at, {"importance": 0.9})
                clusters[cid] = Cluster(cid, c.name, memories=[edited, *c.memories[1:]])
                kw = {"upsert_clusters": [clusters[cid]]}
        elif op == "split" and clusters:
            cid = rng.choice(sorted(clusters))
            c = clusters[cid]
            half = len(c.memories) // 2
            if half:
                nid = f"c-{0xF000 + step:08x}"
                clusters[cid] = Cluster(cid, c.name, memories=c.memories[:half])
                clusters[nid] = Cluster(nid, f"Split {step}", memories=c.memories[half:])
                kw = {"upsert_clusters": [clusters[cid], clusters[nid]]}
        if not kw:
            continue
        ix = ix.apply(IndexChange(**kw))
        history.append((ix, dict(clusters), list(unsorted)))
        if step % 5 == 0:
            _same(ix, Index.build(clusters, unsorted), queries)
    _same(ix, Index.build(clusters, unsorted), queries)
    for old, cl, un in history[::7]:  # snapshots are immutable
        _same(old, Index.build(cl, un), queries[:3])


def test_compaction_after_many_removals_keeps_answers():
    clusters, unsorted, vocab, rng = _random_store(4, n_clusters=4, per=5, n_unsorted=0)
    ix = Index.build(clusters, [])
    live: list[Memory] = []
    for batch in range(12):
        new = [mem(" ".join(rng.choices(vocab, k=5)) + f" b{batch}x{i}", i) for i in range(200)]
        ix = ix.apply(IndexChange(add_unsorted=new, remove_unsorted=[m.id for m in live[:150]]))
        live = live[150:] + new
    assert len(ix._mems) < 2 * len(ix) + 1100  # compacted along the way
    _same(ix, Index.build(clusters, live), [" ".join(rng.choices(vocab, k=3)) for _ in range(6)])


def test_search_cache_is_per_snapshot():
    ix = Index.build({HIKING.id: HIKING}, [])
    a = ix.search("hiking boots")
    assert ix.search("hiking boots") is a and ix.cache_hits == 1
    ix2 = ix.apply(IndexChange(add_unsorted=[mem("hiking boots on sale", 20)]))
    b = ix2.search("hiking boots")
    assert b is not a and ix2.cache_hits == 0
    assert "hiking boots on sale" in b.context


def test_search_with_given_clusters_replaces_the_lexical_choice():
    ix = Index.build({c.id: c for c in (HIKING, COOKING)}, [])
    assert ix.search("hiking boots").clusters[0][0] == HIKING.id
    res = ix.search("hiking boots", clusters=[COOKING.id, "c-99999999"])
    assert [c[0] for c in res.clusters] == [COOKING.id]
    assert all(h.cluster_id != HIKING.id for h in res.memories)
    cands = ix.cluster_candidates("hiking ricotta", 5)
    assert {c[0] for c in cands} == {HIKING.id, COOKING.id}


def test_old_snapshot_pickles_are_refused():
    import pickle

    ix = Index.build({HIKING.id: HIKING}, [])
    back = pickle.loads(pickle.dumps(ix))
    assert back.search("hiking boots").context == ix.search("hiking boots").context
    state = dict(ix.__dict__, _format=1)
    with pytest.raises(ValueError):
        Index.__new__(Index).__setstate__(state)


def _time_links(ix: Index) -> tuple[np.ndarray, np.ndarray]:
    """The reference time neighbours: every live slot sorted by (created_at, id) from
    scratch, each linked to the next one when they are within the gap (unknown times
    never link)."""
    n = len(ix._alive)
    prev, nxt = np.full(n, -1), np.full(n, -1)

    def when(slot: int) -> float:
        t = float(ix._ts[slot])
        return -np.inf if np.isnan(t) else t

    live = sorted(np.flatnonzero(ix._alive).tolist(), key=lambda i: (when(i), ix._mems[i].id))
    gap = ix.cfg.neighbor_gap_minutes * 60
    for a, b in zip(live, live[1:]):
        if when(a) > -np.inf and when(b) - when(a) <= gap:
            nxt[a], prev[b] = b, a
    return prev, nxt


def _dense_rank(ix: Index, text: str, limit: int, now: float | None = None, only=None):
    """The dense reference of `Index._rank` (every slot scored, as before candidate
    scoring): (memory id, score) of the top `limit`, ties by id."""
    q = [i for i in map(ix._vocab.get, ix._tokens(text)) if i is not None]
    if not q or ix._n_alive == 0:
        return []
    cfg = ix.cfg
    s = ix._mem_bm25(q)
    smax = float(s.max()) if len(s) else 0.0
    cs = ix._cluster_bm25(q)
    c_norm = np.zeros(len(cs) + 1, dtype=np.float32)
    selected = np.zeros(len(cs) + 1, dtype=bool)
    chosen = False
    if only is not None:
        order = np.asarray([ix._cslot_of[c] for c in only if c in ix._cslot_of], dtype=np.int64)
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
        score += cfg.cluster_weight * c_norm[ix._group]
    home = ix._unsorted | selected[ix._group]
    found = (s > 0) & home
    eligible = found.copy()
    if cfg.neighbor_weight:
        prev, nxt = _time_links(ix) if cfg.neighbors == "time" else (ix._prev, ix._next)
        pad = np.append(sn, np.float32(0.0))
        nb = np.maximum(pad[prev], pad[nxt])
        score += cfg.neighbor_weight * nb
        eligible |= (nb > 0) & selected[ix._group]
        if cfg.neighbors == "time":  # the time neighbour of a match, wherever filed
            fpad = np.append(found, False)
            eligible |= fpad[prev] | fpad[nxt]
            two_back = np.where(prev >= 0, prev[prev], -1)
            two_on = np.where(nxt >= 0, nxt[nxt], -1)
            score += cfg.second_neighbor_weight * np.maximum(pad[two_back], pad[two_on])
    eligible &= ix._alive
    if cfg.use_freshness:
        score = score * ix._quality(now, np.arange(len(score)))
    if len(ix._sup_old):
        score[ix._sup_old] *= cfg.superseded_penalty
        score[ix._sup_old] = np.minimum(score[ix._sup_old], score[ix._sup_new] * np.float32(0.999))
    score = np.where(eligible & (score > 0), score, 0.0)
    nz = np.flatnonzero(score)
    top = sorted((-float(score[i]), ix._mems[int(i)].id) for i in nz)[:limit]
    return [(mid, -neg) for neg, mid in top]


def _check_dense(ix: Index, queries: list[str], now: float | None = None) -> None:
    for q in queries:
        for only in (None, sorted(ix._cslot_of)[:2]):
            hits, _ = ix._rank(ix._tokens(q), 9, now, only)
            got = [(h.memory.id, h.score) for h, *_ in hits]
            assert got == _dense_rank(ix, q, 9, now, only)  # exactly: same float32 steps


@pytest.mark.parametrize("freshness", [False, True])
@pytest.mark.parametrize("neighbors", ["time", "cluster"])
def test_candidate_scoring_equals_the_dense_reference(freshness, neighbors):
    clusters, unsorted, vocab, rng = _random_store(7, n_clusters=8, per=7, n_unsorted=15)
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
    assert ix2._n_alive < len(ix2._alive)
    _check_dense(ix2, queries, now)


def _routing_store(seed: int):
    clusters, unsorted, vocab, rng = _random_store(seed, n_clusters=9, per=6, n_unsorted=0)
    # topical clusters: each has its own words, so routing has clear winners
    for j, cid in enumerate(sorted(clusters)):
        c = clusters[cid]
        own = [f"t{j}x{k}" for k in range(4)]
        clusters[cid] = Cluster(
            cid,
            c.name,
            memories=[
                mem(m.content + " " + " ".join(rng.choices(own, k=3)), i)
                for i, m in enumerate(c.memories)
            ],
        )
    batch = []
    for i in range(120):
        j = rng.randrange(9)
        own = [f"t{j}x{k}" for k in range(4)]
        words = rng.choices(vocab, k=rng.randint(0, 6)) + rng.choices(own, k=rng.randint(0, 3))
        batch.append(mem(" ".join(words) + f" r{i} r{i}", 100 + i))
    batch.append(mem("zzz qqq unknown words only", 999))
    batch.append(mem("the and of", 998))
    return clusters, batch


def _route_one(ix: Index, memory: Memory) -> str | None:
    """The reference `route_many` must equal: one memory's cluster-profile BM25 vector, its
    best slot by a stable sort, compared as Python floats."""
    if not ix._cslot_of:
        return None
    scores = ix._cluster_bm25(ix._term_ids(memory.content))
    if not len(scores):
        return None
    top = np.argsort(-scores, kind="stable")[:2]
    best = float(scores[top[0]])
    second = float(scores[top[1]]) if len(top) > 1 else 0.0
    if best >= ix.ingest.route_min_score and best - second >= ix.ingest.route_margin:
        return ix._clusters[int(top[0])].id
    return None


@pytest.mark.parametrize("idf_mode", ["lucene", "okapi"])
def test_route_many_equals_route_one_by_one(idf_mode, monkeypatch):
    clusters, batch = _routing_store(11)
    loose = IngestConfig(route_min_score=1.0, route_margin=0.3)
    ix = Index.build(clusters, [], RetrievalConfig(idf=idf_mode), loose)
    one = [_route_one(ix, m) for m in batch]
    assert ix.route_many(batch) == one
    assert any(one) and not all(one)  # some routed, some not
    # several chunks of rows, several blocks in a chunk (memories of unequal term counts)
    monkeypatch.setattr(Index, "ROUTE_CELLS", 7 * len(ix._c_alive))
    monkeypatch.setattr(Index, "ROUTE_BLOCK", 2)
    assert len({len(ix._term_ids(m.content)) for m in batch}) > 2
    assert ix.route_many(batch) == one
    monkeypatch.setattr(Index, "ROUTE_BLOCK", 32)
    # dead cluster slots (a rewritten and a removed cluster)
    cids = sorted(clusters)
    c = clusters[cids[0]]
    ix2 = ix.apply(
        IndexChange(
            upsert_clusters=[Cluster(c.id, "Other name", memories=c.memories[1:])],
            remove_clusters=[cids[1]],
        )
    )
    assert len(ix2._c_dead)
    assert ix2.route_many(batch) == [_route_one(ix2, m) for m in batch]
    assert ix2.route_many([]) == []
    assert Index.build({}, []).route_many(batch[:3]) == [None, None, None]


def test_top_equals_a_stable_argsort():
    from clagd.retrieval.index import _top

    rng = np.random.default_rng(5)
    for n, k in ((50, 4), (1000, 4), (1000, 8), (3, 4), (200, 1)):
        for scores in (rng.random(n), rng.integers(0, 3, n).astype(np.float32), np.zeros(n)):
            ref = np.argsort(-scores, kind="stable")[:k]
            assert _top(scores, k).tolist() == ref.tolist()


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


def _plain_bm25(ix: Index, q: list[int], cluster: bool = False) -> np.ndarray:
    """BM25 the way `_bm25` computed it before its terms were kept per snapshot: for each
    query term, its live document frequency and IDF, then `scores[sl] += w * tf / (tf +
    dn[sl])` over each postings run (the same float32 steps), dead slots zeroed."""
    if cluster:
        segs, alive, dn, n_docs = ix._csegs, ix._c_alive, ix._c_dn, len(ix._cslot_of)
    else:
        segs, alive, dn, n_docs = ix._segs, ix._alive, ix._dn, ix._n_alive
    scores = np.zeros(len(alive), dtype=np.float32)
    for tid in q:
        parts = [p for p in (seg.postings(tid) for seg in segs) if p is not None]
        df = sum(int(np.count_nonzero(alive[sl])) for sl, _ in parts)
        if not df:
            continue
        w = float(np.log1p((n_docs - df + 0.5) / (df + 0.5))) * (ix.cfg.k1 + 1.0)
        for sl, tf in parts:
            sl = sl.astype(np.intp)
            x = dn[sl] + tf
            y = w * tf
            y /= x
            scores[sl] += y
    scores[~alive] = 0.0
    return scores


def test_bm25_with_kept_terms_equals_the_plain_scatter_bit_for_bit():
    clusters, unsorted, vocab, rng = _random_store(11, n_clusters=8, per=7, n_unsorted=12)
    ix = Index.build(clusters, unsorted)
    # more segments and dead slots: an edited memory, a removed cluster, new unsorted ones
    c1 = clusters["c-00000001"]
    edited = [mem(c1.memories[0].content + " w5 edited", 50), *c1.memories[1:]]
    ix = ix.apply(
        IndexChange(
            upsert_clusters=[Cluster(c1.id, "Renamed w7", memories=edited)],
            remove_clusters=["c-00000002"],
            add_unsorted=[mem(" ".join(rng.choices(vocab, k=6)), 60 + i) for i in range(5)],
            remove_unsorted=[m.id for m in unsorted[:3]],
        )
    )
    assert len(ix._segs) > 1 and ix._n_alive < len(ix._alive)
    assert len(ix._cslot_of) < len(ix._c_alive)
    queries = [rng.choices(vocab, k=rng.randint(1, 5)) for _ in range(40)]
    queries += [["w5", "w5", "w7"], ["edited", "w1"]]  # a repeated term counts twice
    for words in queries:
        q = [ix._vocab[w] for w in words if w in ix._vocab]
        for cluster_level in (False, True):
            want = _plain_bm25(ix, q, cluster_level)
            first = ix._bm25(q, cluster=cluster_level)
            again = ix._bm25(q, cluster=cluster_level)  # from the kept terms
            assert first.dtype == want.dtype == np.float32
            assert np.array_equal(first, want) and np.array_equal(again, want)
    assert ix._m_terms.terms and ix._c_terms.terms
    # a new snapshot starts with no kept terms, and its own IDF
    ix2 = ix.apply(IndexChange(add_unsorted=[mem("w5 w5 w9 fresh", 90)]))
    assert not ix2._m_terms.terms and not ix2._c_terms.terms
    q = [ix2._vocab[w] for w in ("w5", "w9", "fresh")]
    assert np.array_equal(ix2._bm25(q), _plain_bm25(ix2, q))
    assert not np.array_equal(ix2._bm25(q), _plain_bm25(ix, q[:2]))


def test_kept_terms_stay_within_their_limit_and_answer_the_same():
    clusters, unsorted, vocab, rng = _random_store(12, n_clusters=6, per=8, n_unsorted=10)
    ix = Index.build(clusters, unsorted)
    queries = [" ".join(rng.choices(vocab, k=rng.randint(1, 5))) for _ in range(30)]
    want = [(r.context, [h.score for h in r.memories]) for r in map(ix.search, queries)]
    small = Index.build(clusters, unsorted)
    small._m_terms.limit = 12  # a few terms' postings at a time: terms are dropped
    small._c_terms.limit = 0  # none kept
    for _ in range(2):
        small._cache.clear()
        got = [(r.context, [h.score for h in r.memories]) for r in map(small.search, queries)]
        assert got == want
        kept = small._m_terms
        assert kept.size == sum(len(sl) for v in kept.terms.values() if v for sl, _ in v[0])
        assert kept.size <= 12
        assert not any(small._c_terms.terms.values())  # a term no profile has is kept: None


def test_kept_terms_are_not_pickled():
    import pickle

    ix = Index.build({c.id: c for c in (HIKING, COOKING)}, [mem("unsorted hiking note", 5)])
    ix.search("hiking ricotta")
    assert ix._m_terms.terms
    back = pickle.loads(pickle.dumps(ix))
    assert not back._m_terms.terms and not back._c_terms.terms
    assert back.search("hiking boots").context == ix.search("hiking boots").context


def test_sorted_set_equals_np_unique():
    from clagd.retrieval.index import _sorted_set

    rng = np.random.default_rng(3)
    for n, k in [(1000, 0), (1000, 1), (1000, 2), (1000, 40), (1000, 900), (50, 300)]:
        for dtype in (np.int32, np.int64):
            slots = rng.integers(0, n, size=k).astype(dtype)
            got = _sorted_set(slots, n)
            want = np.unique(slots.astype(np.int64))
            assert got.dtype == np.int64 and np.array_equal(got, want)


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
    assert set(more._loose_tids) == {m.id for m in loose}
    want = idx.route_many(loose)
    assert want[:2] == ["c-1", "c-2"]
    assert more.route_many(loose) == want
    # same id, another text (not what was indexed): tokenized, not taken from the kept ids
    other = Memory(loose[0].id, "baking ricotta bread cheese", loose[0].created_at)
    assert more.route_many([other]) == idx.route_many([other]) == ["c-2"]
    assert not pickle.loads(pickle.dumps(more, pickle.HIGHEST_PROTOCOL))._loose_tids
    gone = IndexChange(remove_unsorted=[loose[2].id])
    assert not more.apply(gone, routes=True)._loose_tids  # only the adding change keeps them
    assert not idx.apply(IndexChange(add_unsorted=loose))._loose_tids  # routes=False: none
