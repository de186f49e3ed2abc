"""Lexical similarity for organizing: the one home of the measures the organizers use.

"Does this text match this cluster?" has one answer in clagd: the index's own BM25 over the
cluster profiles, the scorer queries and the router use (`ClusterScores`, over
`clagd.retrieval`). The session's retrievability and coherence checks ask it. The other
measures here answer other questions, all over the stemmed tokens of `clagd.text`:

- term sets and overlap (`terms`, `cluster_terms`, `jaccard`): does a memory share any word
  with a cluster (the session's candidate clusters, the coherence check's first step), are
  two memories near-identical (the size policy's fold);
- raw term-count cosine (`term_counts`, `count_cosine`): are two clusters near-duplicates
  (the size policy);
- TF-IDF over a corpus (`TfIdf`, `unit_cosine`): how alike two groups of memories are, the
  lexical organizer's cohesion, joins and merges (a symmetric similarity of two groups,
  where BM25 scores a query against documents; see docs/sessions.md for the measurement).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping

from clagd.model import Cluster, Memory
from clagd.retrieval.index import Index
from clagd.store.holds import pause
from clagd.text import STOPWORDS, stem, tokenize, word_terms, words

Vec = dict[str, float]

# members of a cluster read for its terms (a profile, not the whole cluster)
CLUSTER_TERM_MEMBERS = 50


def terms(text: str) -> set[str]:
    """The distinct stemmed terms of a text."""
    return set(tokenize(text))


def label_terms(c: Cluster) -> set[str]:
    """The terms of a cluster's name, description and tags."""
    return terms(f"{c.name} {c.description} {' '.join(c.tags)}")


def cluster_terms(c: Cluster) -> set[str]:
    """The terms of a cluster's label and of its first `CLUSTER_TERM_MEMBERS` members."""
    t = label_terms(c)
    for m in c.memories[:CLUSTER_TERM_MEMBERS]:
        t |= terms(m.content)
    return t


def jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a and b else 0.0


def term_counts(texts: Iterable[str]) -> dict[str, int]:
    """How often each term occurs in these texts together."""
    bag: dict[str, int] = {}
    for text in texts:
        for t in tokenize(text):
            bag[t] = bag.get(t, 0) + 1
    return bag


def count_cosine(a: Mapping[str, int], b: Mapping[str, int]) -> float:
    """Cosine of two term-count vectors (0 when either is empty)."""
    if not a or not b:
        return 0.0
    dot = sum(v * b.get(k, 0) for k, v in a.items())
    na = sum(v * v for v in a.values()) ** 0.5
    nb = sum(v * v for v in b.values()) ** 0.5
    return dot / (na * nb)


def unit_cosine(a: Vec, b: Vec) -> float:
    """Cosine of two unit vectors (`TfIdf.vec`): their dot product."""
    if len(a) > len(b):
        a, b = b, a
    return sum(x * b.get(t, 0.0) for t, x in a.items())


class TfIdf:
    """Term counts and IDF over every memory the organizer can see."""

    def __init__(self, memories: Iterable[Memory]) -> None:
        self.tf: dict[str, Counter[str]] = {}
        self.surface: dict[str, Counter[str]] = {}
        df: Counter[str] = Counter()
        for m in memories:
            if m.id in self.tf:
                continue
            pause()  # a step of work off the writer (`store/holds.py`)
            tf = Counter(tokenize(m.content))
            self.tf[m.id] = tf
            df.update(tf.keys())
        self.n = max(1, len(self.tf))
        self.idf = {t: math.log((1 + self.n) / (1 + d)) + 1.0 for t, d in df.items()}
        self.df = df

    def vec(self, mids: Iterable[str]) -> Vec:
        """The unit TF-IDF vector (sublinear tf) of these memories together."""
        total: Counter[str] = Counter()
        for mid in mids:
            total.update(self.tf.get(mid, ()))
        v = {t: (1.0 + math.log(n)) * self.idf.get(t, 1.0) for t, n in total.items()}
        norm = math.sqrt(sum(x * x for x in v.values())) or 1.0
        return {t: x / norm for t, x in v.items()}

    def surface_word(self, term: str, contents: Iterable[str]) -> str:
        """The most frequent original word that stems to `term` (names read better)."""
        counts = self.surface.get(term)
        if counts is None:
            counts = Counter(
                w for c in contents for w in words(c) if w not in STOPWORDS and stem(w) == term
            )
            self.surface[term] = counts
        return counts.most_common(1)[0][0] if counts else term


class ClusterScores:
    """The index's BM25 of a text against these clusters' profiles: an `Index` of them
    alone (the store's scorer, with the default retrieval settings), asked as a query asks
    it (`Index.cluster_candidates`: members' terms plus the weighted label terms, IDF over
    the clusters)."""

    def __init__(self, clusters: Mapping[str, Cluster]) -> None:
        self.index = Index.build(clusters, [])
        self.scope_of = {cid: c.scope for cid, c in clusters.items()}

    def scores(self, text: str, scope: str | None = None) -> dict[str, float]:
        """Every cluster's score for `text` (a cluster left out scores 0); with `scope`,
        of that scope's clusters only (what a query of that scope can find)."""
        n = self.index.n_clusters
        return {
            cid: score
            for cid, _name, score in self.index.cluster_candidates(text, n)
            if scope is None or self.scope_of.get(cid) == scope
        }

    def rank(self, text: str, cid: str) -> int | None:
        """1-based rank of cluster `cid` for `text` among the clusters of its scope (a
        query sees no other's), None when it does not match at all."""
        scores = self.scores(text, self.scope_of.get(cid))
        mine = scores.get(cid, 0.0)
        if mine <= 0:
            return None
        return 1 + sum(1 for s in scores.values() if s > mine)


def surface_query(term_list: Iterable[str], text: str) -> str:
    """Terms (stems) as the words of `text` that give them, for a query that the index
    tokenizes as it tokenizes everything (a stem is not always its own stem)."""
    ws = [w for w in words(text) if w not in STOPWORDS]
    of: dict[str, str] = {}
    for w, t in zip(ws, word_terms(ws, stopwords=False)):
        of.setdefault(t, w)
    return " ".join(of.get(t, t) for t in term_list)
