"""Immutable BM25 index snapshots: cluster level, memory level, context formatting.

Retrieval is two-level, as in CLAG: clusters are scored by BM25 over their profile (name,
description, tags and the text of their members), the best `top_clusters` are chosen, and
memories are scored inside them (the unsorted area is always searched). Memory-level IDF comes
from the whole store, so a term that is common everywhere does not look rare inside one
small cluster. A memory's final score is its normalized BM25 score plus cluster evidence
(the normalized score of its cluster: cluster-based smoothing) plus, optionally, the evidence
of its temporal neighbours inside the cluster (a reply to a matching turn is often the answer).

BM25 is implemented here over an inverted index with numpy postings instead of rank-bm25:
rank-bm25 cannot update incrementally, loops over every document per query term, raises on
an empty corpus, and its IDF (`log((N - df + .5) / (df + .5))`, floored at a fraction of the
mean) goes to zero or below on tiny corpora. The default IDF here is the Lucene form
`log(1 + (N - df + .5) / (df + .5))`, always positive; `idf: okapi` gives rank-bm25's.

A snapshot is never mutated after it is built: `apply()` returns a new snapshot that shares
every unchanged array with the old one. Documents live in slots; removing a memory only
clears its `alive` bit, adding appends slots and extends the postings of the terms it has.
When dead slots outnumber live ones the snapshot is compacted (rebuilt from cached term
counts, without re-tokenizing).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import numpy as np

from .config import IngestConfig, RetrievalConfig
from .model import Cluster, Memory, parse_time
from .text import estimate_tokens, tokenize

UNSORTED_NAME = "unsorted"
# how many times a cluster's name, description and tags count in its profile, relative to
# one occurrence in one member
PROFILE_FIELD_WEIGHT = 2

_EMPTY_I = np.zeros(0, dtype=np.int32)
_EMPTY_F = np.zeros(0, dtype=np.float32)


@dataclass(frozen=True)
class Hit:
    memory: Memory
    cluster_id: str | None
    cluster_name: str
    score: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.memory.id,
            "content": self.memory.content,
            "cluster_id": self.cluster_id,
            "cluster_name": self.cluster_name,
            "score": round(float(self.score), 4),
            "created_at": self.memory.created_at,
            "metadata": dict(self.memory.metadata),
        }


@dataclass
class SearchResult:
    memories: list[Hit] = field(default_factory=list)
    clusters: list[tuple[str, str, float]] = field(default_factory=list)
    context: str = ""
    tokens: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The query result shape of the socket protocol (DESIGN.md)."""
        return {
            "memories": [h.to_dict() for h in self.memories],
            "clusters": [
                {"id": cid, "name": name, "score": round(float(score), 4)}
                for cid, name, score in self.clusters
            ],
            "context": self.context,
            "tokens": self.tokens,
        }


def idf(n_docs: int, df: np.ndarray | int, mode: str = "lucene") -> Any:
    """BM25 IDF. `lucene` is always positive; `okapi` is rank-bm25's (before its floor)."""
    if mode == "okapi":
        return np.log((n_docs - df + 0.5) / (df + 0.5))
    return np.log1p((n_docs - df + 0.5) / (df + 0.5))


def _counts(tokens: list[str]) -> dict[str, int]:
    tf: dict[str, int] = {}
    for t in tokens:
        tf[t] = tf.get(t, 0) + 1
    return tf


def _epoch(created_at: str) -> float:
    dt = parse_time(created_at)
    return dt.timestamp() if dt is not None else math.nan


def _time_key(m: Memory) -> tuple[float, str]:
    t = _epoch(m.created_at)
    return (-math.inf if math.isnan(t) else t, m.id)


def _importance(m: Memory) -> float:
    try:
        v = float(m.metadata.get("importance", 0.5))
    except (TypeError, ValueError):
        return 0.5
    return min(1.0, max(0.0, v)) if math.isfinite(v) else 0.5


class _Postings:
    """term -> (slots int32, tf float32); copy-on-write across snapshots."""

    __slots__ = ("terms",)

    def __init__(self, terms: dict[str, tuple[np.ndarray, np.ndarray]] | None = None) -> None:
        self.terms = terms if terms is not None else {}

    def extended(self, docs: list[tuple[int, dict[str, int]]]) -> _Postings:
        if not docs:
            return self
        grow: dict[str, tuple[list[int], list[int]]] = {}
        for slot, tf in docs:
            for term, n in tf.items():
                entry = grow.get(term)
                if entry is None:
                    grow[term] = ([slot], [n])
                else:
                    entry[0].append(slot)
                    entry[1].append(n)
        terms = dict(self.terms)
        for term, (slots, tfs) in grow.items():
            s = np.asarray(slots, dtype=np.int32)
            f = np.asarray(tfs, dtype=np.float32)
            old = terms.get(term)
            if old is not None:
                s = np.concatenate((old[0], s))
                f = np.concatenate((old[1], f))
            terms[term] = (s, f)
        return _Postings(terms)


class Index:
    """One immutable snapshot of the store for retrieval; share it freely between threads."""

    def __init__(self, cfg: Any = None, ingest: IngestConfig | None = None) -> None:
        if cfg is not None and hasattr(cfg, "retrieval"):  # a whole Config
            ingest = ingest or getattr(cfg, "ingest", None)
            cfg = cfg.retrieval
        self.cfg: RetrievalConfig = cfg or RetrievalConfig()
        self.ingest: IngestConfig = ingest or IngestConfig()
        # memory slots
        self._mems: list[Memory] = []
        self._tf: list[dict[str, int]] = []
        self._len = _EMPTY_F
        self._alive = np.zeros(0, dtype=bool)
        self._group = _EMPTY_I  # cluster slot, -1 = unsorted
        self._unsorted = np.zeros(0, dtype=bool)
        self._prev = _EMPTY_I  # temporal neighbours inside the cluster, -1 = none
        self._next = _EMPTY_I
        self._ts = np.zeros(0, dtype=np.float64)
        self._imp = _EMPTY_F
        self._tok = _EMPTY_I  # estimated tokens of each memory's content
        self._dn = _EMPTY_F
        self._c_dn = _EMPTY_F
        self._post = _Postings()
        self._slot_of: dict[str, int] = {}
        self._n_alive = 0
        self._total_len = 0.0
        # cluster slots
        self._clusters: list[Cluster] = []
        self._members: list[np.ndarray] = []
        self._c_len = _EMPTY_F
        self._c_alive = np.zeros(0, dtype=bool)
        self._cpost = _Postings()
        self._cslot_of: dict[str, int] = {}
        self._c_total_len = 0.0
        # superseded memory slot -> successor slot (both alive)
        self._sup_old = _EMPTY_I
        self._sup_new = _EMPTY_I

    # ----------------------------------------------------------------- building
    @classmethod
    def build(
        cls,
        clusters: Mapping[str, Cluster] | Iterable[Cluster],
        unsorted: Iterable[Memory],
        cfg: Any = None,
        ingest: IngestConfig | None = None,
    ) -> Index:
        values = clusters.values() if isinstance(clusters, Mapping) else clusters
        return cls(cfg, ingest).apply(upsert_clusters=values, add_unsorted=unsorted)

    def __len__(self) -> int:
        return self._n_alive

    @property
    def n_clusters(self) -> int:
        return len(self._cslot_of)

    def cluster(self, cid: str) -> Cluster | None:
        cs = self._cslot_of.get(cid)
        return self._clusters[cs] if cs is not None else None

    def memory_ids(self) -> set[str]:
        return set(self._slot_of)

    def _tokens(self, text: str) -> list[str]:
        return tokenize(text, stem=self.cfg.stemmer, stopwords=self.cfg.stopwords)

    def apply(
        self,
        upsert_clusters: Iterable[Cluster] = (),
        remove_clusters: Iterable[str] = (),
        add_unsorted: Iterable[Memory] = (),
        remove_unsorted: Iterable[str] = (),
    ) -> Index:
        """A new snapshot with these changes; the work is proportional to what changed."""
        return self._apply(upsert_clusters, remove_clusters, add_unsorted, remove_unsorted)

    def _apply(
        self,
        upsert_clusters: Iterable[Cluster],
        remove_clusters: Iterable[str],
        add_unsorted: Iterable[Memory],
        remove_unsorted: Iterable[str],
        cache: dict[str, dict[str, int]] | None = None,
    ) -> Index:
        upsert: dict[str, Cluster] = {c.id: c for c in upsert_clusters}
        removed = [cid for cid in remove_clusters if cid not in upsert]
        add_u = list(add_unsorted)
        rm_u = list(remove_unsorted)
        if not (upsert or removed or add_u or rm_u):
            return self

        new = Index.__new__(Index)
        new.__dict__.update(self.__dict__)
        alive = self._alive.copy()
        c_alive = self._c_alive.copy()
        slot_of = dict(self._slot_of)
        cslot_of = dict(self._cslot_of)
        n_alive, total_len = self._n_alive, self._total_len
        c_total_len = self._c_total_len

        def kill(mid: str) -> None:
            nonlocal n_alive, total_len
            slot = slot_of.pop(mid, None)
            if slot is not None:
                alive[slot] = False
                n_alive -= 1
                total_len -= float(self._len[slot])

        for cid in [*removed, *upsert]:
            cs = cslot_of.pop(cid, None)
            if cs is None:
                continue
            c_alive[cs] = False
            c_total_len -= float(self._c_len[cs])
            for slot in self._members[cs].tolist():
                if alive[slot]:
                    kill(self._mems[slot].id)
        for mid in rm_u:
            slot = slot_of.get(mid)
            if slot is not None and self._group[slot] < 0:
                kill(mid)

        def term_counts(m: Memory) -> dict[str, int]:
            if cache is not None and m.id in cache:
                return cache[m.id]
            old = self._slot_of.get(m.id)
            if old is not None and self._mems[old].content == m.content:
                return self._tf[old]
            return _counts(self._tokens(m.content))

        mems: list[Memory] = []
        tfs: list[dict[str, int]] = []
        group: list[int] = []
        prev: list[int] = []
        nxt: list[int] = []
        base = len(self._mems)
        cbase = len(self._clusters)
        new_clusters: list[Cluster] = []
        members: list[np.ndarray] = []
        c_docs: list[tuple[int, dict[str, int]]] = []
        c_lens: list[float] = []

        def add(m: Memory, g: int) -> int:
            nonlocal n_alive, total_len
            if m.id in slot_of:  # a memory lives in one place: the newest wins
                kill(m.id)
            tf = term_counts(m)
            slot = base + len(mems)
            mems.append(m)
            tfs.append(tf)
            group.append(g)
            prev.append(-1)
            nxt.append(-1)
            slot_of[m.id] = slot
            n_alive += 1
            total_len += sum(tf.values())
            return slot

        for c in upsert.values():
            cs = cbase + len(new_clusters)
            new_clusters.append(c)
            cslot_of[c.id] = cs
            seen: set[str] = set()
            slots: list[int] = []
            profile: dict[str, int] = {}
            for m in sorted(c.memories, key=_time_key):
                if m.id in seen:
                    continue
                seen.add(m.id)
                slot = add(m, cs)
                if slots:
                    prev[slot - base] = slots[-1]
                    nxt[slots[-1] - base] = slot
                slots.append(slot)
                for t, n in tfs[-1].items():
                    profile[t] = profile.get(t, 0) + n
            label = " ".join([c.name, c.description, *c.tags])
            for t in self._tokens(label):
                profile[t] = profile.get(t, 0) + PROFILE_FIELD_WEIGHT
            members.append(np.asarray(slots, dtype=np.int32))
            c_docs.append((cs, profile))
            c_lens.append(float(sum(profile.values())))
            c_total_len += c_lens[-1]
        for m in add_u:
            add(m, -1)

        k = len(mems)
        new._mems = self._mems + mems
        new._tf = self._tf + tfs
        new._len = np.concatenate(
            (self._len, np.asarray([sum(tf.values()) for tf in tfs], dtype=np.float32))
        )
        new._alive = np.concatenate((alive, np.ones(k, dtype=bool)))
        new._group = np.concatenate((self._group, np.asarray(group, dtype=np.int32)))
        new._prev = np.concatenate((self._prev, np.asarray(prev, dtype=np.int32)))
        new._next = np.concatenate((self._next, np.asarray(nxt, dtype=np.int32)))
        new._ts = np.concatenate(
            (self._ts, np.asarray([_epoch(m.created_at) for m in mems], dtype=np.float64))
        )
        new._imp = np.concatenate(
            (self._imp, np.asarray([_importance(m) for m in mems], dtype=np.float32))
        )
        new._post = self._post.extended([(base + i, tf) for i, tf in enumerate(tfs)])
        # a slot added and then replaced inside this same batch must be dead too
        live_new = np.zeros(k, dtype=bool)
        for slot in slot_of.values():
            if slot >= base:
                live_new[slot - base] = True
        new._alive[base:] = live_new
        new._slot_of = slot_of
        new._n_alive = n_alive
        new._total_len = total_len

        new._clusters = self._clusters + new_clusters
        new._members = self._members + members
        new._c_len = np.concatenate((self._c_len, np.asarray(c_lens, dtype=np.float32)))
        new._c_alive = np.concatenate((c_alive, np.ones(len(new_clusters), dtype=bool)))
        new._cpost = self._cpost.extended(c_docs)
        new._cslot_of = cslot_of
        new._c_total_len = c_total_len
        new._link_supersedes()
        new._unsorted = new._group < 0
        new._length_norms()
        new._tok = np.concatenate(
            (self._tok, np.asarray([estimate_tokens(m.content) for m in mems], dtype=np.int32))
        )

        dead = len(new._mems) - new._n_alive
        if dead > max(1024, new._n_alive):
            return new._compacted()
        return new

    def _link_supersedes(self) -> None:
        old: list[int] = []
        newer: list[int] = []
        for cs in self._cslot_of.values():
            for new_mid, old_mid in self._clusters[cs].supersedes.items():
                a, b = self._slot_of.get(old_mid), self._slot_of.get(new_mid)
                if a is not None and b is not None and a != b:
                    old.append(a)
                    newer.append(b)
        self._sup_old = np.asarray(old, dtype=np.int32)
        self._sup_new = np.asarray(newer, dtype=np.int32)

    def _compacted(self) -> Index:
        """A full rebuild from the live memories, reusing their cached term counts."""
        cache = {mid: self._tf[slot] for mid, slot in self._slot_of.items()}
        clusters = [self._clusters[cs] for cs in self._cslot_of.values()]
        unsorted = [self._mems[s] for s in self._slot_of.values() if self._group[s] < 0]
        return Index(self.cfg, self.ingest)._apply(clusters, (), unsorted, (), cache)

    # ------------------------------------------------------------------ scoring
    def _bm25(
        self, q: list[str], post: _Postings, alive: np.ndarray, dn: np.ndarray, n_docs: int
    ) -> np.ndarray:
        """BM25 of every slot; `dn` is k1 * (1 - b + b * len / avgdl) per slot."""
        scores = np.zeros(len(alive), dtype=np.float32)
        if n_docs == 0:
            return scores
        k1p = self.cfg.k1 + 1.0
        mode = self.cfg.idf
        all_alive = n_docs == len(alive)
        for term in q:
            entry = post.terms.get(term)
            if entry is None:
                continue
            slots, tf = entry
            df = len(slots) if all_alive else int(np.count_nonzero(alive[slots]))
            if df == 0:
                continue
            w = float(idf(n_docs, df, mode)) * k1p
            scores[slots] += w * tf / (tf + dn[slots])
        if not all_alive:
            scores[~alive] = 0.0
        return scores

    def _length_norms(self) -> None:
        k1, b = self.cfg.k1, self.cfg.b
        n = self._n_alive
        avgdl = self._total_len / n if n and self._total_len > 0 else 1.0
        self._dn = (k1 * (1.0 - b + b * self._len / avgdl)).astype(np.float32)
        nc = len(self._cslot_of)
        c_avg = self._c_total_len / nc if nc and self._c_total_len > 0 else 1.0
        self._c_dn = (k1 * (1.0 - b + b * self._c_len / c_avg)).astype(np.float32)

    def memory_scores(self, text: str) -> dict[str, float]:
        """Plain BM25 of every live memory with global IDF (for tests and diagnostics)."""
        s = self._mem_bm25(self._tokens(text))
        return {m: float(s[slot]) for m, slot in self._slot_of.items()}

    def _mem_bm25(self, q: list[str]) -> np.ndarray:
        return self._bm25(q, self._post, self._alive, self._dn, self._n_alive)

    def _cluster_bm25(self, q: list[str]) -> np.ndarray:
        return self._bm25(q, self._cpost, self._c_alive, self._c_dn, len(self._cslot_of))

    def _rank(
        self, q: list[str], limit: int, now: float | None
    ) -> tuple[list[tuple[Hit, int]], list[tuple[str, str, float]]]:
        if not q or self._n_alive == 0:
            return [], []
        cfg = self.cfg
        s = self._mem_bm25(q)
        smax = float(s.max()) if len(s) else 0.0
        cs = self._cluster_bm25(q)
        chosen: list[tuple[str, str, float]] = []
        c_norm = np.zeros(len(cs) + 1, dtype=np.float32)  # last entry: unsorted (-1)
        selected = np.zeros(len(cs) + 1, dtype=bool)
        if len(cs) and cfg.top_clusters > 0:
            order = np.argsort(-cs, kind="stable")[: cfg.top_clusters]
            order = order[cs[order] > 0]
            if len(order):
                cmax = float(cs[order[0]])
                c_norm[:-1] = cs / cmax
                selected[order] = True
                chosen = [
                    (self._clusters[i].id, self._clusters[i].name, float(cs[i]))
                    for i in order.tolist()
                ]
        if smax <= 0 and not chosen:
            return [], []
        sn = s / smax if smax > 0 else s
        score = sn.copy()
        if cfg.cluster_weight:
            score += cfg.cluster_weight * c_norm[self._group]
        # eligible: own lexical evidence, or a matching neighbour inside a chosen cluster
        evidence = s > 0
        if cfg.neighbor_weight:
            pad = np.append(sn, np.float32(0.0))
            nb = np.maximum(pad[self._prev], pad[self._next])
            score += cfg.neighbor_weight * nb
            evidence |= nb > 0
        eligible = evidence & (self._unsorted | selected[self._group])
        if self._n_alive != len(eligible):
            eligible &= self._alive
        if cfg.use_freshness:
            score = score * self._quality(now)
        if len(self._sup_old):
            score[self._sup_old] *= cfg.superseded_penalty
            # a superseded memory ranks below its successor
            score[self._sup_old] = np.minimum(
                score[self._sup_old], score[self._sup_new] * np.float32(0.999)
            )
        score = np.where(eligible & (score > 0), score, 0.0)
        nz = np.flatnonzero(score)
        if len(nz) > limit:
            nz = nz[np.argpartition(-score[nz], limit - 1)[:limit]]
        nz = nz[np.lexsort((nz, -score[nz]))]
        hits = []
        for slot in nz.tolist():
            g = int(self._group[slot])
            c = self._clusters[g] if g >= 0 else None
            name = (c.name or c.id) if c else UNSORTED_NAME
            hit = Hit(self._mems[slot], c.id if c else None, name, float(score[slot]))
            # conservative: the estimate of a joined context never exceeds the sum of these
            cost = int(self._tok[slot]) + estimate_tokens(f"[Memory · {name}]") + 1
            hits.append((hit, cost))
        return hits, chosen

    def _quality(self, now: float | None) -> np.ndarray:
        """Confidence (metadata importance) and freshness, as a multiplier around 1."""
        cfg = self.cfg
        now = datetime.now(timezone.utc).timestamp() if now is None else now
        age_days = np.maximum(0.0, (now - self._ts) / 86400.0)
        fresh = np.where(
            np.isnan(age_days), 0.5, 0.5 ** (age_days / max(cfg.freshness_half_life_days, 1e-9))
        )
        mult = (
            1.0 + cfg.confidence_weight * (self._imp - 0.5) + cfg.freshness_weight * (fresh - 0.5)
        )
        return np.maximum(mult, 0.0).astype(np.float32)

    # ---------------------------------------------------------------- public API
    def search(
        self,
        text: str,
        max_memories: int | None = None,
        token_budget: int | None = None,
        archive: Index | None = None,
        now: datetime | None = None,
    ) -> SearchResult:
        """Top memories for `text`: ranked by score, deduplicated, cut to k and the budget.

        `token_budget` None means the configured budget; 0 or less means no budget.
        `archive` is another snapshot (the archived clusters) merged into the ranking.
        """
        k = self.cfg.max_memories if max_memories is None else max_memories
        budget = self.cfg.token_budget if token_budget is None else token_budget
        if k <= 0:
            return SearchResult()
        q = self._tokens(text)
        ts = now.timestamp() if now is not None else None
        limit = k if budget <= 0 and archive is None else k * 3 + 8
        hits, chosen = self._rank(q, limit, ts)
        if archive is not None:
            a_hits, a_chosen = archive._rank(q, limit, ts)
            hits = sorted(hits + a_hits, key=lambda hc: -hc[0].score)
            chosen = sorted(chosen + a_chosen, key=lambda c: -c[2])
        out: list[Hit] = []
        seen: set[str] = set()
        used = 0
        for h, cost in hits:
            if h.memory.id in seen:
                continue
            if budget > 0 and used + cost > budget:
                continue
            seen.add(h.memory.id)
            used += cost
            out.append(h)
            if len(out) >= k:
                break
        context = format_context(out)
        return SearchResult(out, chosen, context, estimate_tokens(context))

    def route(self, memory: Memory) -> str | None:
        """The cluster a new memory clearly belongs to, or None (it goes to unsorted).

        Clearly: the best cluster-profile BM25 score is at least `route_min_score` and beats
        the runner-up by `route_margin`.
        """
        if not self._cslot_of:
            return None
        cs = self._cluster_bm25(self._tokens(memory.content))
        if not len(cs):
            return None
        top = np.argsort(-cs, kind="stable")[:2]
        best = float(cs[top[0]])
        second = float(cs[top[1]]) if len(top) > 1 else 0.0
        if best >= self.ingest.route_min_score and best - second >= self.ingest.route_margin:
            return self._clusters[int(top[0])].id
        return None


def _line(h: Hit) -> str:
    return f"[Memory · {h.cluster_name}] {h.memory.content}"


def format_context(hits: list[Hit]) -> str:
    """Hits grouped by cluster (groups in order of their best hit), one line per memory."""
    groups: dict[str, list[Hit]] = {}
    for h in hits:
        groups.setdefault(h.cluster_id or "", []).append(h)
    return "\n".join(_line(h) for g in groups.values() for h in g)
