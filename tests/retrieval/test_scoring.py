"""BM25 (`retrieval.scoring`): the scores against rank-bm25 and a plain scatter, the kept
terms, and `ClusterScorer` against the index's own cluster level."""

from __future__ import annotations

import random

import numpy as np
import pytest
from index_stores import COOKING, HIKING, cluster, mem, random_store, routing_store
from rank_bm25 import BM25Okapi

from clagd.change import IndexChange
from clagd.config import IngestConfig, RetrievalConfig
from clagd.model import Cluster
from clagd.retrieval.index import Index
from clagd.retrieval.scoring import ClusterScorer
from clagd.text import tokenize


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


def test_top_equals_a_stable_argsort():
    from clagd.retrieval.scoring import top as _top

    rng = np.random.default_rng(5)
    for n, k in ((50, 4), (1000, 4), (1000, 8), (3, 4), (200, 1)):
        for scores in (rng.random(n), rng.integers(0, 3, n).astype(np.float32), np.zeros(n)):
            ref = np.argsort(-scores, kind="stable")[:k]
            assert _top(scores, k).tolist() == ref.tolist()


def _plain_bm25(ix: Index, q: list[int], cluster: bool = False) -> np.ndarray:
    """BM25 the way `BM25.scores` computed it before its terms were kept per snapshot: for each
    query term, its live document frequency and IDF, then `scores[sl] += w * tf / (tf +
    dn[sl])` over each postings run (the same float32 steps), dead slots zeroed."""
    if cluster:
        segs, alive, dn, n_docs = (
            ix.profiles.segs,
            ix.profiles.alive,
            ix.cluster_bm25.dn,
            len(ix.profiles.slot_of),
        )
    else:
        segs, alive, dn, n_docs = (
            ix.memories.segs,
            ix.memories.alive,
            ix.memory_bm25.dn,
            ix.memories.n_alive,
        )
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
    clusters, unsorted, vocab, rng = random_store(11, n_clusters=8, per=7, n_unsorted=12)
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
    assert len(ix.memories.segs) > 1 and ix.memories.n_alive < len(ix.memories.alive)
    assert len(ix.profiles.slot_of) < len(ix.profiles.alive)
    queries = [rng.choices(vocab, k=rng.randint(1, 5)) for _ in range(40)]
    queries += [["w5", "w5", "w7"], ["edited", "w1"]]  # a repeated term counts twice
    for words in queries:
        q = [ix.vocab[w] for w in words if w in ix.vocab]
        for cluster_level in (False, True):
            want = _plain_bm25(ix, q, cluster_level)
            first = (ix.cluster_bm25 if cluster_level else ix.memory_bm25).scores(q)
            again = (ix.cluster_bm25 if cluster_level else ix.memory_bm25).scores(q)  # kept terms
            assert first.dtype == want.dtype == np.float32
            assert np.array_equal(first, want) and np.array_equal(again, want)
    assert ix.memory_bm25.terms.terms and ix.cluster_bm25.terms.terms
    # a new snapshot starts with no kept terms, and its own IDF
    ix2 = ix.apply(IndexChange(add_unsorted=[mem("w5 w5 w9 fresh", 90)]))
    assert not ix2.memory_bm25.terms.terms and not ix2.cluster_bm25.terms.terms
    q = [ix2.vocab[w] for w in ("w5", "w9", "fresh")]
    assert np.array_equal(ix2.memory_bm25.scores(q), _plain_bm25(ix2, q))
    assert not np.array_equal(ix2.memory_bm25.scores(q), _plain_bm25(ix, q[:2]))


def test_kept_terms_stay_within_their_limit_and_answer_the_same():
    clusters, unsorted, vocab, rng = random_store(12, n_clusters=6, per=8, n_unsorted=10)
    ix = Index.build(clusters, unsorted)
    queries = [" ".join(rng.choices(vocab, k=rng.randint(1, 5))) for _ in range(30)]
    want = [(r.context, [h.score for h in r.memories]) for r in map(ix.search, queries)]
    small = Index.build(clusters, unsorted)
    small.memory_bm25.terms.limit = 12  # a few terms' postings at a time: terms are dropped
    small.cluster_bm25.terms.limit = 0  # none kept
    for _ in range(2):
        small.results.results.clear()
        got = [(r.context, [h.score for h in r.memories]) for r in map(small.search, queries)]
        assert got == want
        kept = small.memory_bm25.terms
        assert kept.size == sum(len(sl) for v in kept.terms.values() if v for sl, _ in v[0])
        assert kept.size <= 12
        assert not any(
            small.cluster_bm25.terms.terms.values()
        )  # a term no profile has is kept: None


def test_kept_terms_are_not_pickled():
    import pickle

    ix = Index.build({c.id: c for c in (HIKING, COOKING)}, [mem("unsorted hiking note", 5)])
    ix.search("hiking ricotta")
    assert ix.memory_bm25.terms.terms
    back = pickle.loads(pickle.dumps(ix))
    assert not back.memory_bm25.terms.terms and not back.cluster_bm25.terms.terms
    assert back.search("hiking boots").context == ix.search("hiking boots").context


def _index_cluster_scores(ix: Index, text: str) -> dict[str, float]:
    """The index's own cluster-level BM25 of `text`, by cluster id (live clusters only)."""
    s = ix.cluster_bm25.scores(ix.term_ids(text))
    return {cid: float(s[slot]) for cid, slot in ix.profiles.slot_of.items()}


@pytest.mark.parametrize("idf_mode", ["lucene", "okapi"])
def test_the_cluster_scorer_scores_as_the_index_does_bit_for_bit(idf_mode: str) -> None:
    clusters, unsorted, vocab, rng = random_store(21, n_clusters=8, per=6, n_unsorted=5)
    cfg = RetrievalConfig(idf=idf_mode)
    ix = Index.build(clusters, unsorted, cfg)
    # and after a change: a rewritten and a removed cluster leave dead cluster slots
    c1 = clusters["c-00000001"]
    renamed = Cluster(c1.id, "Renamed w7 notes", memories=c1.memories[1:])
    changed = ix.apply(IndexChange(upsert_clusters=[renamed], remove_clusters=["c-00000002"]))
    live = {cid: c for cid, c in clusters.items() if cid != "c-00000002"}
    live[c1.id] = renamed
    texts = [" ".join(rng.choices(vocab, k=rng.randint(1, 6))) for _ in range(40)]
    texts += ["w7 w7 renamed", "nothing known here", ""]
    for snapshot, given in ((ix, clusters), (changed, live)):
        scorer = ClusterScorer(given.values(), cfg)
        for text in texts:
            want = _index_cluster_scores(snapshot, text)
            assert scorer.scores(text) == want, text
            ranked = [(cid, score) for cid, _, score in snapshot.cluster_candidates(text, 3)]
            assert scorer.ranked(text, 3) == ranked
            for cid, score in scorer.ranked(text):
                assert scorer.rank_of(text, cid) == 1 + sum(v > score for v in want.values())
    assert any(scorer.ranked(t) for t in texts)


def test_the_cluster_scorer_routes_as_ingest_does() -> None:
    clusters, batch = routing_store(13)
    ingest = IngestConfig(route_min_score=1.0, route_margin=0.3)
    ix = Index.build(clusters, [], RetrievalConfig(), ingest)
    scorer = ClusterScorer(clusters.values(), RetrievalConfig(), ingest)
    want = ix.route_many(batch)
    assert [scorer.route(m.content) for m in batch] == want
    assert any(want) and not all(want)


def test_the_cluster_scorer_of_no_clusters_or_an_unknown_one_finds_nothing() -> None:
    empty = ClusterScorer([])
    assert empty.scores("hiking") == {} and empty.ranked("hiking") == []
    assert empty.route("hiking boots") is None
    two = ClusterScorer([HIKING, COOKING])
    assert two.rank_of("hiking boots", "c-nope") is None
    assert two.rank_of("ricotta", HIKING.id) is None  # it does not match at all
    assert two.rank_of("ricotta", COOKING.id) == 1
    assert two.ranked("ricotta lasagna")[0][0] == COOKING.id
