"""BM25, the one lexical scorer of clagd: over one level of a snapshot (`BM25`), and over a
set of clusters for whoever must judge a text against them as a query would
(`ClusterScorer`).

BM25 is implemented here over an inverted index with numpy postings instead of rank-bm25:
rank-bm25 cannot update incrementally, loops over every document per query term, raises on
an empty corpus, and its IDF (`log((N - df + .5) / (df + .5))`, floored at a fraction of the
mean) goes to zero or below on tiny corpora. The default IDF here is the Lucene form
`log(1 + (N - df + .5) / (df + .5))`, always positive; `idf: okapi` gives rank-bm25's.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from clagd.config import IngestConfig, RetrievalConfig
from clagd.model import Cluster
from clagd.retrieval.postings import (
    TERM_CACHE_POSTINGS,
    Segment,
    TermCache,
    Weighted,
    label,
    profiles,
)
from clagd.text import tokenize


def idf(n_docs: int, df: np.ndarray | int, mode: str = "lucene") -> np.ndarray | float:
    """BM25 IDF. `lucene` is always positive; `okapi` is rank-bm25's (before its floor)."""
    if mode == "okapi":
        return np.log((n_docs - df + 0.5) / (df + 0.5))
    return np.log1p((n_docs - df + 0.5) / (df + 0.5))


def top(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the `k` highest scores, highest first, ties by index: the same as
    `np.argsort(-scores, kind="stable")[:k]` without sorting everything."""
    if len(scores) > 4 * k:
        kth = np.partition(scores, len(scores) - k)[len(scores) - k]
        cand = np.flatnonzero(scores >= kth)  # the top k and everything tied with the last
        return cand[np.argsort(-scores[cand], kind="stable")][:k]
    return np.argsort(-scores, kind="stable")[:k]


class BM25:
    """BM25 over one level of one snapshot: the memories, or the cluster profiles. Built
    with the snapshot (its inputs never change after), it keeps each query term's
    contributions once computed (`TermCache`)."""

    __slots__ = ("segs", "alive", "dead", "dn", "n_docs", "terms", "k1", "mode")

    def __init__(
        self,
        segs: tuple[Segment, ...],
        alive: np.ndarray,
        lengths: np.ndarray,
        n_docs: int,
        total_len: float,
        cfg: RetrievalConfig,
    ) -> None:
        self.segs, self.alive, self.n_docs = segs, alive, n_docs
        self.k1, self.mode = cfg.k1, cfg.idf
        avgdl = total_len / n_docs if n_docs and total_len > 0 else 1.0
        # the length norm of each slot: k1 * (1 - b + b * length / average length)
        self.dn = (cfg.k1 * (1.0 - cfg.b + cfg.b * lengths / avgdl)).astype(np.float32)
        self.dead = np.flatnonzero(~alive)
        self.terms = TermCache(TERM_CACHE_POSTINGS)

    def term(self, tid: int) -> Weighted | None:
        """The postings (slots, tf) of one term and its BM25 weight (IDF * (k1 + 1)), or
        None when no live document has it. Document frequencies count live slots only."""
        parts = [p for p in (seg.postings(tid) for seg in self.segs) if p is not None]
        if not parts:
            return None
        alive, n_docs = self.alive, self.n_docs
        if n_docs == len(alive):
            df = sum(len(sl) for sl, _ in parts)
        else:
            df = sum(int(np.count_nonzero(alive[sl])) for sl, _ in parts)
        if df == 0:
            return None
        return parts, float(idf(n_docs, df, self.mode)) * (self.k1 + 1.0)

    def weighted(self, tid: int) -> Weighted | None:
        """The postings of one query term with each one's BM25 contribution
        `w * tf / (tf + dn)`, and the term's weight `w` (`term`), or None when no live
        document has it. Computed on the term's first query and kept (`TermCache`)."""
        terms = self.terms.terms
        if tid in terms:
            try:
                return terms[tid]
            except KeyError:  # dropped meanwhile by another thread: computed again
                pass
        got = self.term(tid)
        if got is None:
            self.terms.put(tid, None, 0)
            return None
        parts, w = got
        dn = self.dn
        runs = []
        for slots, tf in parts:
            x = dn.take(slots)
            x += tf
            y = w * tf
            y /= x  # w * tf / (tf + dn): the same float32 steps as the plain expression
            runs.append((slots, y))
        out = (runs, w)
        self.terms.put(tid, out, sum(len(sl) for sl, _ in runs))
        return out

    def scores(self, q: list[int], pad: int = 0) -> np.ndarray:
        """BM25 of every slot for the query term ids `q`, plus `pad` zeros at the end; 0 for
        a dead slot. Only the postings of the query terms are touched: the array is
        allocated zeroed and their contributions (`weighted`) are added into it, term by
        term in query order (each term's slots are distinct within a run and the runs'
        slots are disjoint, so `np.add.at` adds exactly what `scores[sl] += y` does,
        without the gather and scatter of a fancy index)."""
        alive = self.alive
        scores = np.zeros(len(alive) + pad, dtype=np.float32)
        if self.n_docs == 0:
            return scores
        add = np.add.at
        for tid in q:
            got = self.weighted(tid)
            if got is not None:
                for slots, y in got[0]:
                    add(scores, slots, y)
        if self.n_docs != len(alive):
            scores[self.dead] = 0.0  # dead slots score nothing
        return scores

    def weights(self, q: list[int]) -> dict[int, float]:
        """The BM25 weight (IDF x (k1 + 1)) of each query term some live document has."""
        out: dict[int, float] = {}
        for tid in dict.fromkeys(q):
            got = self.weighted(tid)
            if got is not None:
                out[tid] = got[1]
        return out


def routed(scores: np.ndarray, min_score: float, margin: float) -> int | None:
    """Ingest's routing rule over one text's cluster scores: the best cluster (the first
    of equal maxima) when its score is at least `min_score` and beats the runner-up (0
    when it is alone) by `margin`, else None. Compared in float64."""
    if not len(scores):
        return None
    best = int(np.argmax(scores))
    rest = np.delete(scores, best)
    second = float(rest.max()) if len(rest) else 0.0
    top_score = float(scores[best])
    return best if top_score >= min_score and top_score - second >= margin else None


class ClusterScorer:
    """A text scored against a fixed set of clusters exactly as the index scores cluster
    profiles: what a query sees when it chooses its clusters, and what ingest uses to
    route a memory (`Index.route_many`). For the organizer's judgements of "does this
    text match this cluster?" (the gate's lexical baseline, the retrievability and
    coherence checks, naming), so that they judge with the scorer clagd actually uses.

    A cluster's profile is its label (name, description, tags, counted
    PROFILE_FIELD_WEIGHT times) and the text of its members; IDF and length norms are
    over the given clusters. Clusters named twice: the last one given counts, in the place
    of the first (as `Index.build`)."""

    def __init__(
        self,
        clusters: Iterable[Cluster],
        cfg: RetrievalConfig | None = None,
        ingest: IngestConfig | None = None,
    ) -> None:
        self.cfg = cfg or RetrievalConfig()
        self.ingest = ingest or IngestConfig()
        self.ids = list({c.id: c for c in clusters}.items())
        self.vocab: dict[str, int] = {}
        owner: list[int] = []
        tids: list[int] = []
        labels: list[list[int]] = []
        for j, (_, c) in enumerate(self.ids):
            seen: set[str] = set()
            for m in c.memories:
                if m.id not in seen:
                    seen.add(m.id)
                    ids = self._learn(m.content)
                    tids.extend(ids)
                    owner.extend([j] * len(ids))
            labels.append(self._learn(label(c)))
        n = len(self.ids)
        seg, lengths = profiles(
            0,
            n,
            np.asarray(owner, dtype=np.int64),
            np.asarray(tids, dtype=np.int64),
            np.ones(len(tids), dtype=np.float64),
            labels,
            len(self.vocab),
        )
        lens = lengths.astype(np.float32)
        segs = (seg,) if n else ()
        self.bm25 = BM25(segs, np.ones(n, dtype=bool), lens, n, float(lengths.sum()), self.cfg)

    def _tokens(self, text: str) -> list[str]:
        return tokenize(text, stem=self.cfg.stemmer, stopwords=self.cfg.stopwords)

    def _learn(self, text: str) -> list[int]:
        vocab = self.vocab
        return [vocab.setdefault(t, len(vocab)) for t in self._tokens(text)]

    def _scores(self, text: str) -> np.ndarray:
        get = self.vocab.get
        return self.bm25.scores([i for i in map(get, self._tokens(text)) if i is not None])

    def scores(self, text: str) -> dict[str, float]:
        """Every cluster's BM25 for `text` (0 for a cluster that shares no term with it)."""
        s = self._scores(text)
        return {cid: float(s[j]) for j, (cid, _) in enumerate(self.ids)}

    def ranked(self, text: str, n: int | None = None) -> list[tuple[str, float]]:
        """The clusters that match `text` (positive score), best first, ties in the order
        given; at most `n` of them. (`Index.cluster_candidates` gives the same for the
        index's hot clusters.)"""
        s = self._scores(text)
        order = top(s, len(s) if n is None else n)
        return [(self.ids[j][0], float(s[j])) for j in order.tolist() if s[j] > 0]

    def rank_of(self, text: str, cid: str) -> int | None:
        """The 1-based rank of cluster `cid` for `text` (1 + the clusters that score more),
        or None when it does not match at all or is not one of these clusters."""
        s = self._scores(text)
        j = next((j for j, (c, _) in enumerate(self.ids) if c == cid), None)
        if j is None or s[j] <= 0:
            return None
        return 1 + int(np.count_nonzero(s > s[j]))

    def route(self, text: str) -> str | None:
        """The cluster a new memory with this text goes to by ingest's rule (its best score
        at least `route_min_score`, ahead of the runner-up by `route_margin`), or None: it
        stays unsorted. The answer `Index.route_many` gives over the same clusters."""
        j = routed(self._scores(text), self.ingest.route_min_score, self.ingest.route_margin)
        return None if j is None else self.ids[j][0]
