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
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any

import numpy as np

from clagd.config import Config, IngestConfig, RetrievalConfig
from clagd.model import Cluster, Memory, one_line, parse_epoch
from clagd.retrieval.change import IndexChange
from clagd.retrieval.timeline import Timeline
from clagd.text import estimate_tokens, tokenize

UNSORTED_NAME = "unsorted"
# how many times a cluster's name, description and tags count in its profile, relative to
# one occurrence in one member
PROFILE_FIELD_WEIGHT = 2
# a change adding more unsorted memories than this keeps no term ids for the route pass
LOOSE_TIDS_MAX = 20_000

# queries remembered per snapshot (the hot cache; a new snapshot starts empty)
HOT_CACHE_SIZE = 256

# postings whose BM25 contributions a snapshot keeps per level (`_TermCache`; 4 bytes each)
TERM_CACHE_POSTINGS = 1 << 21

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


# a ranked hit inside a search, before the cut-offs: the hit, the estimated tokens of its
# context line, the highest weight (IDF) of the query terms the memory has itself, and of
# those it or a time neighbour in its cluster has (both 0 unless the rare-term cut is on).
# A plain tuple: this is built for every hit of every query.
_Ranked = tuple[Hit, int, float, float]


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


def idf(n_docs: int, df: np.ndarray | int, mode: str = "lucene") -> np.ndarray | float:
    """BM25 IDF. `lucene` is always positive; `okapi` is rank-bm25's (before its floor)."""
    if mode == "okapi":
        return np.log((n_docs - df + 0.5) / (df + 0.5))
    return np.log1p((n_docs - df + 0.5) / (df + 0.5))


def _epoch(created_at: str) -> float:
    """NaN for an unknown time: a neutral freshness, and first in a cluster's chain."""
    t = parse_epoch(created_at)
    return math.nan if t is None else t


def _chain_key(m: Memory, t: float) -> tuple[float, str]:
    return (-math.inf if math.isnan(t) else t, m.id)


def _importance(m: Memory) -> float:
    """metadata.importance on its 0-1 scale (checked when a memory arrives; a hand-edited
    value outside it is clamped), 0.5 when absent."""
    try:
        v = float(m.metadata.get("importance", 0.5))
    except (TypeError, ValueError):
        return 0.5
    return min(1.0, max(0.0, v)) if math.isfinite(v) else 0.5


class _IdMap:
    """memory id -> slot, persistent: a base dict that is never mutated plus a small overlay
    (-1 = deleted) copied by each change. The overlay is folded into a new base when it
    outgrows a quarter of the base, so a change costs O(overlay), amortized O(1) per id,
    instead of a copy of the whole map per snapshot."""

    __slots__ = ("base", "over", "size")

    def __init__(
        self, base: dict[str, int] | None = None, over: dict[str, int] | None = None, size: int = 0
    ) -> None:
        self.base = base if base is not None else {}
        self.over = over if over is not None else {}
        self.size = size

    def get(self, key: str) -> int | None:
        v = self.over.get(key)
        if v is None:
            return self.base.get(key)
        return None if v < 0 else v

    def __len__(self) -> int:
        return self.size

    def items(self) -> Iterator[tuple[str, int]]:
        over = self.over
        for k, v in self.base.items():
            if k not in over:
                yield k, v
        for k, v in over.items():
            if v >= 0:
                yield k, v

    def updated(self, changes: dict[str, int]) -> _IdMap:
        """A new map with `changes` (slot, or -1 to delete) applied."""
        if not changes:
            return self
        over = dict(self.over)
        size = self.size
        for k, v in changes.items():
            had = self.get(k) is not None
            if v >= 0:
                over[k] = v
                size += not had
            else:
                if k in self.base:
                    over[k] = -1
                else:
                    over.pop(k, None)
                size -= had
        if len(over) > max(4096, len(self.base) // 4):
            base = dict(_IdMap(self.base, over).items())
            return _IdMap(base, {}, len(base))
        return _IdMap(self.base, over, size)


class _Slots:
    """An append-only sequence of memories (by slot) shared between snapshots: chunks of
    fixed size; extending copies the list of chunks and the last chunk only, not every
    reference (docs/retrieval.md, "Slots", says what a flat copy costs)."""

    __slots__ = ("chunks", "size")
    CHUNK = 4096

    def __init__(self, chunks: list[list[Memory]] | None = None, size: int = 0) -> None:
        self.chunks = chunks if chunks is not None else []
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, slot: int) -> Memory:
        return self.chunks[slot >> 12][slot & 4095]

    def extended(self, items: list[Memory]) -> _Slots:
        if not items:
            return self
        chunks = list(self.chunks)
        i = 0
        if chunks and len(chunks[-1]) < self.CHUNK:
            room = self.CHUNK - len(chunks[-1])
            chunks[-1] = chunks[-1] + items[:room]
            i = room
        while i < len(items):
            chunks.append(items[i : i + self.CHUNK])
            i += self.CHUNK
        return _Slots(chunks, self.size + len(items))


class _Segment:
    """Postings of a contiguous range of slots [start, stop), in CSR form over term ids:
    inverted (term -> slots, tf) and forward (slot -> terms, tf). Immutable."""

    __slots__ = ("start", "stop", "indptr", "slots", "tf", "fptr", "ftid", "ftf")

    def __init__(
        self,
        start: int,
        stop: int,
        indptr: np.ndarray,
        slots: np.ndarray,
        tf: np.ndarray,
        fptr: np.ndarray,
        ftid: np.ndarray,
        ftf: np.ndarray,
    ) -> None:
        self.start, self.stop = start, stop
        self.indptr = indptr
        self.slots = slots
        self.tf = tf
        self.fptr = fptr
        self.ftid = ftid
        self.ftf = ftf

    @property
    def nnz(self) -> int:
        return len(self.slots)

    def postings(self, tid: int) -> tuple[np.ndarray, np.ndarray] | None:
        if tid + 1 >= len(self.indptr):
            return None
        a, b = int(self.indptr[tid]), int(self.indptr[tid + 1])
        if a == b:
            return None
        return self.slots[a:b], self.tf[a:b]


# a query term's postings runs (slots, BM25 contribution of each) and its weight
_Weighted = tuple[list[tuple[np.ndarray, np.ndarray]], float]


class _TermCache:
    """The query terms' BM25 contributions (`Index._weighted`) of one snapshot and level:
    the postings of a term with `w * tf / (tf + dn)` per posting, computed on the term's
    first query. Every input (live document frequency, average length, the postings) is
    fixed for the snapshot, so a kept run equals a recomputed one; a new snapshot starts
    empty. At most `limit` postings are kept, the oldest terms go first. Filled without a
    lock, like the hot cache: dict operations are atomic under the GIL and a race costs
    at most a recomputation or a wrong size by one term."""

    __slots__ = ("terms", "size", "limit")

    def __init__(self, limit: int) -> None:
        self.terms: dict[int, _Weighted | None] = {}
        self.size = 0
        self.limit = limit

    def put(self, tid: int, value: _Weighted | None, postings: int) -> None:
        if postings > self.limit:
            return
        terms = self.terms
        try:
            while terms and self.size + postings > self.limit:
                old = terms.pop(next(iter(terms)))
                self.size -= sum(len(sl) for sl, _ in old[0]) if old is not None else 0
        except (KeyError, RuntimeError, StopIteration):
            return
        terms[tid] = value
        self.size += postings


def _ptr(counts: np.ndarray) -> np.ndarray:
    out = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def _make_segment(
    start: int, n_docs: int, doc: np.ndarray, tid: np.ndarray, w: np.ndarray, n_terms: int
) -> _Segment:
    """A segment of `n_docs` documents from (local doc, term id, weight) entries, in one
    numpy pass: entries of the same (term, doc) are summed."""
    n = max(n_docs, 1)
    key = tid.astype(np.int64) * n + doc.astype(np.int64)
    order = np.argsort(key)
    ks = key[order]
    if len(ks):
        first = np.empty(len(ks), dtype=bool)
        first[0] = True
        np.not_equal(ks[1:], ks[:-1], out=first[1:])
        runs = np.flatnonzero(first)
        uk = ks[runs]
        tf = np.add.reduceat(w[order], runs).astype(np.float32)
    else:
        uk, tf = ks, _EMPTY_F
    t = uk // n
    d = (uk - t * n).astype(np.int32)
    indptr = _ptr(np.bincount(t, minlength=n_terms)[:n_terms])
    forward = np.argsort(d, kind="stable")
    fptr = _ptr(np.bincount(d, minlength=n_docs)[:n_docs])
    return _Segment(
        start,
        start + n_docs,
        indptr,
        (d + start).astype(np.int32),
        tf,
        fptr,
        t[forward].astype(np.int32),
        tf[forward],
    )


def _merge(a: _Segment, b: _Segment, alive: np.ndarray, n_terms: int) -> _Segment:
    """Two adjacent segments as one; postings of dead slots are dropped."""
    tid = np.concatenate(
        (
            np.repeat(np.arange(len(a.indptr) - 1), np.diff(a.indptr)),
            np.repeat(np.arange(len(b.indptr) - 1), np.diff(b.indptr)),
        )
    )
    slots = np.concatenate((a.slots, b.slots))
    tf = np.concatenate((a.tf, b.tf))
    keep = alive[slots]
    tid, slots, tf = tid[keep], slots[keep], tf[keep]
    order = np.argsort(tid, kind="stable")  # two sorted runs: a linear merge
    indptr = _ptr(np.bincount(tid, minlength=n_terms)[:n_terms])
    fptr = np.concatenate((a.fptr, b.fptr[1:] + a.fptr[-1]))
    return _Segment(
        a.start,
        b.stop,
        indptr,
        slots[order],
        tf[order],
        fptr,
        np.concatenate((a.ftid, b.ftid)),
        np.concatenate((a.ftf, b.ftf)),
    )


def _with_segment(
    segs: tuple[_Segment, ...], new: _Segment | None, alive: np.ndarray, n_terms: int
) -> tuple[_Segment, ...]:
    """Append a segment, then merge the tail like a binary counter: a small segment merges
    into its predecessor once it is half its size, so every posting is copied O(log n)
    times and a query looks at O(log n) segments."""
    if new is None:
        return segs
    out = [*segs, new]
    while len(out) > 1 and (out[-1].nnz * 2 >= out[-2].nnz or len(out) > 16):
        b = out.pop()
        out[-1] = _merge(out[-1], b, alive, n_terms)
    return tuple(out)


@lru_cache(maxsize=65536)
def _label_tokens(name: str) -> int:
    """Estimated tokens of a context line's `[Memory · <name>]` prefix."""
    return estimate_tokens(f"[Memory · {name}]")


def _top(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the `k` highest scores, highest first, ties by index: the same as
    `np.argsort(-scores, kind="stable")[:k]` without sorting everything."""
    if len(scores) > 4 * k:
        kth = np.partition(scores, len(scores) - k)[len(scores) - k]
        cand = np.flatnonzero(scores >= kth)  # the top k and everything tied with the last
        return cand[np.argsort(-scores[cand], kind="stable")][:k]
    return np.argsort(-scores, kind="stable")[:k]


def _forward(
    segs: tuple[_Segment, ...], slots: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(position in `slots`, term id, tf) of every term of these slots."""
    pos_l, tid_l, tf_l = [], [], []
    for seg in segs:
        m = (slots >= seg.start) & (slots < seg.stop)
        if not m.any():
            continue
        pos = np.flatnonzero(m)
        loc = slots[m] - seg.start
        a = seg.fptr[loc]
        lens = seg.fptr[loc + 1] - a
        total = int(lens.sum())
        if not total:
            continue
        offs = np.repeat(a - (np.cumsum(lens) - lens), lens) + np.arange(total)
        pos_l.append(np.repeat(pos, lens))
        tid_l.append(seg.ftid[offs])
        tf_l.append(seg.ftf[offs])
    if not pos_l:
        return _EMPTY_I, _EMPTY_I, _EMPTY_F
    return np.concatenate(pos_l), np.concatenate(tid_l), np.concatenate(tf_l)


TermsOf = Callable[[Memory], tuple[np.ndarray, np.ndarray | None]]


class _Change:
    """One `Index._apply` in progress, on copies of the old snapshot's arrays. The steps, in
    order: `free` the slots of removed (and re-upserted) clusters and removed unsorted
    memories, `place_clusters`, `place_unsorted`, then `into(new)` writes the new snapshot's
    memory arrays, postings and cluster profiles."""

    def __init__(self, old: Index, claimed: set[str], terms_of: TermsOf | None) -> None:
        self.old = old
        self.terms_of = terms_of
        self.claimed = claimed  # every memory that has a place after this change
        self.base, self.cbase = len(old._mems), len(old._clusters)
        self.alive = old._alive.copy()
        self.c_alive = old._c_alive.copy()
        self.group = old._group.copy()
        self.changes: dict[str, int] = {}  # memory id -> new slot, or -1: gone
        self.cslot_of = dict(old._cslot_of)
        self.n_alive, self.total_len = old._n_alive, old._total_len
        self.c_total_len = old._c_total_len
        # the memories given new slots (from `base` on)
        self.new_mems: list[Memory] = []
        self.new_len: list[float] = []
        self.new_alive: list[bool] = []
        self.new_group: list[int] = []
        self.all_tids: list[int] = []  # tokenized here: the new memories' term ids, in order
        self.doc_terms: list[tuple[np.ndarray, np.ndarray | None]] = []  # from `terms_of`
        self.placed: set[str] = set()
        self.chains: list[list[int]] = []  # per upserted cluster: member slots in time order
        self.labels: list[list[int]] = []  # per upserted cluster: its label's term ids
        self.epoch_of: dict[int, float] = {}  # parsed once for the chain order and the times
        self.loose: list[int] = []  # slots of the added unsorted memories
        # their text and term ids in text order, tokenized here (`Index._loose_tids`)
        self.loose_tids: dict[str, tuple[str, list[int]]] | None = None

    def lookup(self, mid: str) -> int | None:
        v = self.changes.get(mid)
        if v is None:
            return self.old._slot_of.get(mid)
        return None if v < 0 else v

    def kill(self, slot: int) -> None:
        old, base = self.old, self.base
        if slot >= base:
            if self.new_alive[slot - base]:
                self.new_alive[slot - base] = False
                self.n_alive -= 1
                self.total_len -= self.new_len[slot - base]
        elif self.alive[slot]:
            self.alive[slot] = False
            self.n_alive -= 1
            self.total_len -= float(old._len[slot])
        mid = (old._mems[slot] if slot < base else self.new_mems[slot - base]).id
        if self.lookup(mid) == slot:
            self.changes[mid] = -1

    def free(self, clusters: Iterable[str], unsorted: Iterable[str]) -> None:
        """Free the slots of these clusters and unsorted memories, except the memories that
        are placed again (an unchanged memory keeps its slot)."""
        old = self.old
        for cid in clusters:
            cslot = self.cslot_of.pop(cid, None)
            if cslot is None:
                continue
            self.c_alive[cslot] = False
            self.c_total_len -= float(old._c_len[cslot])
            for slot in old._members[cslot].tolist():
                if self.alive[slot] and old._mems[slot].id not in self.claimed:
                    self.kill(slot)
        for mid in unsorted:
            slot = old._slot_of.get(mid)
            if slot is not None and old._group[slot] < 0 and mid not in self.claimed:
                self.kill(slot)

    def place(self, m: Memory, g: int) -> int:
        """The slot of `m` in cluster slot `g` (-1: unsorted): its old one when unchanged."""
        old = self.old
        slot = self.lookup(m.id)
        if slot is not None:
            if m.id in self.placed:  # named twice in one change: the later place wins
                self.kill(slot)
            elif slot < self.base and (old._mems[slot] is m or old._mems[slot] == m):
                self.group[slot] = g  # unchanged memory: keep its slot (and postings)
                self.placed.add(m.id)
                return slot
            else:
                self.kill(slot)
        self.placed.add(m.id)
        slot = self.base + len(self.new_mems)
        self.new_mems.append(m)
        self.new_alive.append(True)
        self.new_group.append(g)
        self._add_terms(m)
        self.changes[m.id] = slot
        self.n_alive += 1
        self.total_len += self.new_len[-1]
        return slot

    def _add_terms(self, m: Memory) -> None:
        if self.terms_of is None:
            vocab = self.old._vocab
            ids = [vocab.setdefault(t, len(vocab)) for t in self.old._tokens(m.content)]
            self.all_tids.extend(ids)
            if self.loose_tids is not None:
                self.loose_tids[m.id] = (m.content, ids)
            self.new_len.append(float(len(ids)))
        else:
            tid, tf = self.terms_of(m)
            self.doc_terms.append((tid, tf))
            self.new_len.append(float(len(tid) if tf is None else tf.sum()))

    def place_clusters(self, clusters: Iterable[Cluster]) -> None:
        """New cluster slots; each one's members placed in time order (its chain)."""
        vocab, tokens = self.old._vocab, self.old._tokens
        epoch_of = self.epoch_of
        for j, c in enumerate(clusters):
            cslot = self.cbase + j
            self.cslot_of[c.id] = cslot
            seen: set[str] = set()
            chain: list[int] = []
            for m in c.memories:
                epoch_of[id(m)] = _epoch(m.created_at)
            for m in sorted(c.memories, key=lambda m: _chain_key(m, epoch_of[id(m)])):
                if m.id not in seen:
                    seen.add(m.id)
                    chain.append(self.place(m, cslot))
            self.chains.append(chain)
            label = " ".join([c.name, c.description, *c.tags])
            self.labels.append([vocab.setdefault(t, len(vocab)) for t in tokens(label)])

    def place_unsorted(self, memories: list[Memory], keep_tids: bool) -> None:
        if keep_tids and len(memories) <= LOOSE_TIDS_MAX:
            self.loose_tids = {}
        self.loose = [self.place(m, -1) for m in memories]

    def into(self, new: Index, clusters: list[Cluster]) -> None:
        """Write the new snapshot's memory arrays, postings and cluster profiles."""
        n_terms = len(self.old._vocab)
        self._memory_arrays(new)
        new._segs = _with_segment(
            self.old._segs, self._memory_segment(n_terms), new._alive, n_terms
        )
        self._cluster_profiles(new, clusters, n_terms)

    def _memory_arrays(self, new: Index) -> None:
        old, mems = self.old, self.new_mems
        new._alive = np.concatenate((self.alive, np.asarray(self.new_alive, dtype=bool)))
        new._group = np.concatenate((self.group, np.asarray(self.new_group, dtype=np.int32)))
        new._prev, new._next = self._neighbours()
        new._mems = old._mems.extended(mems)
        new._len = np.concatenate((old._len, np.asarray(self.new_len, dtype=np.float32)))
        epoch_of = self.epoch_of
        times = [epoch_of[id(m)] if id(m) in epoch_of else _epoch(m.created_at) for m in mems]
        new._ts = np.concatenate((old._ts, np.asarray(times, dtype=np.float64)))
        new._imp = np.concatenate(
            (old._imp, np.asarray([_importance(m) for m in mems], dtype=np.float32))
        )
        new._tok = np.concatenate(
            (old._tok, np.asarray([estimate_tokens(m.content) for m in mems], dtype=np.int32))
        )
        new._slot_of = old._slot_of.updated(self.changes)
        new._n_alive = self.n_alive
        new._total_len = self.total_len

    def _neighbours(self) -> tuple[np.ndarray, np.ndarray]:
        """The temporal neighbour links (prev, next) along every chain; none for unsorted."""
        k = len(self.new_mems)
        prev = np.concatenate((self.old._prev, np.full(k, -1, dtype=np.int32)))
        nxt = np.concatenate((self.old._next, np.full(k, -1, dtype=np.int32)))
        for chain in self.chains:
            if chain:
                sl = np.asarray(chain, dtype=np.int64)
                prev[sl[0]] = -1
                nxt[sl[-1]] = -1
                prev[sl[1:]] = sl[:-1]
                nxt[sl[:-1]] = sl[1:]
        if self.loose:
            sl = np.asarray(self.loose, dtype=np.int64)
            prev[sl] = -1
            nxt[sl] = -1
        return prev, nxt

    def _memory_segment(self, n_terms: int) -> _Segment | None:
        """The postings of the new slots, from their term ids (and counts, when given)."""
        k = len(self.new_mems)
        if not k:
            return None
        if self.terms_of is None:
            lens = np.asarray(self.new_len, dtype=np.int64)
            doc = np.repeat(np.arange(k, dtype=np.int64), lens)
            tid = np.asarray(self.all_tids, dtype=np.int64)
            w = np.ones(len(tid), dtype=np.float64)
        else:
            doc_terms = self.doc_terms
            doc = np.repeat(np.arange(k), [len(t) for t, _ in doc_terms])
            tid = np.concatenate([t for t, _ in doc_terms] or [_EMPTY_I])
            if all(f is None for _, f in doc_terms):
                w = np.ones(len(tid), dtype=np.float64)
            else:
                w = np.concatenate(
                    [np.ones(len(t), dtype=np.float32) if f is None else f for t, f in doc_terms]
                    or [_EMPTY_F]
                ).astype(np.float64)
        return _make_segment(self.base, k, doc, tid, w, n_terms)

    def _cluster_profiles(self, new: Index, clusters: list[Cluster], n_terms: int) -> None:
        """Cluster profiles: the members' term counts (from the forward postings, never
        re-tokenized) plus the label terms, weighted."""
        old, chains, labels = self.old, self.chains, self.labels
        nc = len(clusters)
        members = [np.asarray(ch, dtype=np.int32) for ch in chains]
        cseg = None
        c_lens: np.ndarray = np.zeros(nc, dtype=np.float64)
        if nc:
            all_members = np.concatenate(members) if members else _EMPTY_I
            owner = np.repeat(np.arange(nc), [len(ch) for ch in chains])
            pos, tid_m, tf_m = _forward(new._segs, all_members)
            lab_doc = np.repeat(np.arange(nc), [len(lb) for lb in labels])
            lab_tid = np.asarray([t for lb in labels for t in lb], dtype=np.int64)
            cdoc = np.concatenate((owner[pos], lab_doc)).astype(np.int64)
            ctid = np.concatenate((tid_m.astype(np.int64), lab_tid))
            cw = np.concatenate(
                (tf_m.astype(np.float64), np.full(len(lab_tid), float(PROFILE_FIELD_WEIGHT)))
            )
            c_lens = np.bincount(cdoc, weights=cw, minlength=nc)[:nc]
            self.c_total_len += float(c_lens.sum())
            cseg = _make_segment(self.cbase, nc, cdoc, ctid, cw, n_terms)
        new._clusters = old._clusters + clusters
        new._members = old._members + members
        new._c_len = np.concatenate((old._c_len, c_lens.astype(np.float32)))
        new._c_alive = np.concatenate((self.c_alive, np.ones(nc, dtype=bool)))
        new._csegs = _with_segment(old._csegs, cseg, new._c_alive, n_terms)
        new._cslot_of = self.cslot_of
        new._c_total_len = self.c_total_len


class Index:
    """One immutable snapshot of the store for retrieval; share it freely between threads."""

    FORMAT = 3  # of the pickled form (the engine's start-up snapshot)

    def __init__(
        self, cfg: RetrievalConfig | None = None, ingest: IngestConfig | None = None
    ) -> None:
        self.cfg: RetrievalConfig = cfg or RetrievalConfig()
        self.ingest: IngestConfig = ingest or IngestConfig()
        self._format = self.FORMAT
        # term -> id; append-only and shared by every snapshot of one lineage (an old
        # snapshot ignores ids beyond its segments)
        self._vocab: dict[str, int] = {}
        # memory slots
        self._mems = _Slots()
        self._len = _EMPTY_F
        self._alive = np.zeros(0, dtype=bool)
        self._group = _EMPTY_I  # cluster slot, -1 = unsorted
        self._unsorted = np.zeros(0, dtype=bool)
        self._prev = _EMPTY_I  # temporal neighbours inside the cluster, -1 = none
        self._next = _EMPTY_I
        # time neighbours wherever filed (`neighbors: time`; see clagd/retrieval/timeline.py)
        self._time = Timeline(self.cfg.neighbor_gap_minutes * 60.0)
        self._ts = np.zeros(0, dtype=np.float64)
        self._imp = _EMPTY_F
        self._tok = _EMPTY_I  # estimated tokens of each memory's content
        self._dn = _EMPTY_F
        self._c_dn = _EMPTY_F
        self._segs: tuple[_Segment, ...] = ()
        self._slot_of = _IdMap()
        self._n_alive = 0
        self._total_len = 0.0
        # cluster slots
        self._clusters: list[Cluster] = []
        self._members: list[np.ndarray] = []
        self._c_len = _EMPTY_F
        self._c_alive = np.zeros(0, dtype=bool)
        self._csegs: tuple[_Segment, ...] = ()
        self._cslot_of: dict[str, int] = {}
        self._c_total_len = 0.0
        # superseded memory slot -> successor slot (both alive)
        self._sup_old = _EMPTY_I
        self._sup_new = _EMPTY_I
        # derived: dead memory and cluster slots, live unsorted slots (see `_derive`)
        self._dead = np.zeros(0, dtype=np.int64)
        self._c_dead = np.zeros(0, dtype=np.int64)
        self._uslots = np.zeros(0, dtype=np.int64)
        # the query terms' BM25 contributions at each level (`_weighted`)
        self._m_terms = _TermCache(TERM_CACHE_POSTINGS)
        self._c_terms = _TermCache(TERM_CACHE_POSTINGS)
        self._cache: dict[tuple, SearchResult] = {}
        self.cache_hits = 0
        self._route_key = object()
        # the term ids (text order) of the unsorted memories the change that made this
        # snapshot added: `route_many` on them (the route pass) does not tokenize again
        self._loose_tids: dict[str, tuple[str, list[int]]] = {}

    @property
    def route_key(self) -> object:
        """Stays the same object from one snapshot to the next while no cluster changes
        (only unsorted memories came or went): `route_many` then gives the same answers, so
        answers computed on an older snapshot with this key still hold."""
        return self._route_key

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_cache"] = {}
        for k in (
            "_dead",
            "_c_dead",
            "_uslots",
            "_m_terms",
            "_c_terms",
            "_route_key",
            "_loose_tids",
        ):
            state.pop(k, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if state.get("_format") != self.FORMAT:
            raise ValueError("index snapshot of an older format")
        self.__dict__.update(state)
        self._route_key = object()
        self._loose_tids = {}
        self._derive()

    # ----------------------------------------------------------------- building
    @classmethod
    def for_config(cls, config: Config) -> Index:
        """An empty index with the store's `retrieval` and `ingest` settings."""
        return cls(config.retrieval, config.ingest)

    @classmethod
    def build(
        cls,
        clusters: Mapping[str, Cluster] | Iterable[Cluster],
        unsorted: Iterable[Memory],
        cfg: RetrievalConfig | None = None,
        ingest: IngestConfig | None = None,
    ) -> Index:
        values = clusters.values() if isinstance(clusters, Mapping) else clusters
        return cls(cfg, ingest).apply(IndexChange(True, tuple(values), (), tuple(unsorted)))

    def __len__(self) -> int:
        return self._n_alive

    @property
    def n_clusters(self) -> int:
        return len(self._cslot_of)

    def cluster(self, cid: str) -> Cluster | None:
        cslot = self._cslot_of.get(cid)
        return self._clusters[cslot] if cslot is not None else None

    def memory_ids(self) -> set[str]:
        return {mid for mid, _ in self._slot_of.items()}

    def _tokens(self, text: str) -> list[str]:
        return tokenize(text, stem=self.cfg.stemmer, stopwords=self.cfg.stopwords)

    def _term_ids(self, text: str) -> list[int]:
        """Query term ids (terms no memory has are dropped: they score nothing)."""
        get = self._vocab.get
        return [i for i in map(get, self._tokens(text)) if i is not None]

    def apply(self, change: IndexChange, routes: bool = False) -> Index:
        """The snapshot `change` makes of this one; the work is proportional to what
        changed. A `build` change makes a fresh snapshot (same settings) of its clusters
        and unsorted memories. (A whole store loaded at start-up is built at once instead:
        `retrieval.bulk`.)

        `routes` (default False): keep the term ids of the added unsorted memories, so
        that `route_many` on them (the writer's route pass) does not tokenize them again.
        Only the writer's own snapshot routes, so only it passes True; a copy that only
        answers queries (a query process) keeps the default."""
        if change.build:
            fresh = Index(self.cfg, self.ingest)
            return fresh._apply(change.upsert_clusters, (), change.add_unsorted, (), routes=routes)
        return self._apply(
            change.upsert_clusters,
            change.remove_clusters,
            change.add_unsorted,
            change.remove_unsorted,
            routes=routes,
        )

    @property
    def vocab(self) -> dict[str, int]:
        """term -> id; it only grows, and the snapshots of one index share it."""
        return self._vocab

    def _apply(
        self,
        upsert_clusters: Iterable[Cluster],
        remove_clusters: Iterable[str],
        add_unsorted: Iterable[Memory],
        remove_unsorted: Iterable[str],
        terms_of: TermsOf | None = None,
        routes: bool = False,
    ) -> Index:
        """`terms_of` gives a memory's term ids and their counts (None: each id counts once)
        instead of tokenizing its text."""
        upsert: dict[str, Cluster] = {c.id: c for c in upsert_clusters}
        removed = [cid for cid in remove_clusters if cid not in upsert]
        add_u = list(add_unsorted)
        rm_u = list(remove_unsorted)
        if not (upsert or removed or add_u or rm_u):
            return self
        # every memory that has a place after this change (the last place named wins)
        claimed: set[str] = {m.id for c in upsert.values() for m in c.memories}
        claimed.update(m.id for m in add_u)
        change = _Change(self, claimed, terms_of)
        change.free([*removed, *upsert], rm_u)
        change.place_clusters(upsert.values())
        change.place_unsorted(add_u, keep_tids=routes)

        new = Index.__new__(Index)
        new.__dict__.update(self.__dict__)
        new._cache = {}
        new.cache_hits = 0
        if upsert or removed:
            new._route_key = object()
        new._loose_tids = change.loose_tids or {}
        change.into(new, list(upsert.values()))
        if self.cfg.neighbors == "time":
            ids = [m.id for m in change.new_mems]
            new._time = self._time.updated(new._alive, new._ts, change.base, ids)
        new._link_supersedes()
        new._unsorted = new._group < 0
        new._length_norms()
        new._derive()

        dead = len(new._mems) - new._n_alive
        if dead > max(1024, new._n_alive):
            return new._compacted()
        return new

    def _link_supersedes(self) -> None:
        old: list[int] = []
        newer: list[int] = []
        for cslot in self._cslot_of.values():
            sup = self._clusters[cslot].supersedes
            if not sup:
                continue
            for new_mid, old_mid in sup.items():
                a, b = self._slot_of.get(old_mid), self._slot_of.get(new_mid)
                if a is not None and b is not None and a != b:
                    old.append(a)
                    newer.append(b)
        self._sup_old = np.asarray(old, dtype=np.int32)
        self._sup_new = np.asarray(newer, dtype=np.int32)

    def _compacted(self) -> Index:
        """A rebuild from the live memories, reusing their postings (no re-tokenizing)."""
        live = sorted(slot for _, slot in self._slot_of.items())
        slots = np.asarray(live, dtype=np.int32)
        pos, tid, tf = _forward(self._segs, slots)
        order = np.argsort(pos, kind="stable")
        pos, tid, tf = pos[order], tid[order], tf[order]
        bounds = np.searchsorted(pos, np.arange(len(live) + 1))
        terms = {
            self._mems[s].id: (tid[bounds[i] : bounds[i + 1]], tf[bounds[i] : bounds[i + 1]])
            for i, s in enumerate(live)
        }
        clusters = [self._clusters[cslot] for cslot in self._cslot_of.values()]
        unsorted = [self._mems[s] for s in live if self._group[s] < 0]
        fresh = Index(self.cfg, self.ingest)
        fresh._vocab = self._vocab

        def terms_of(m: Memory) -> tuple[np.ndarray, np.ndarray]:
            got = terms.get(m.id)
            if got is None:  # not live (an inconsistent change): count it afresh
                ids = [
                    fresh._vocab.setdefault(t, len(fresh._vocab)) for t in self._tokens(m.content)
                ]
                return np.asarray(ids, dtype=np.int32), np.ones(len(ids), dtype=np.float32)
            return got

        return fresh._apply(clusters, (), unsorted, (), terms_of)

    # ------------------------------------------------------------------ scoring
    def _term(
        self,
        tid: int,
        segs: tuple[_Segment, ...],
        alive: np.ndarray,
        n_docs: int,
    ) -> tuple[list[tuple[np.ndarray, np.ndarray]], float] | None:
        """The postings of one term in these segments and its BM25 weight (IDF * (k1 + 1)),
        or None when no live document has it. Document frequencies count live slots only."""
        parts = [p for p in (seg.postings(tid) for seg in segs) if p is not None]
        if not parts:
            return None
        if n_docs == len(alive):
            df = sum(len(sl) for sl, _ in parts)
        else:
            df = sum(int(np.count_nonzero(alive[sl])) for sl, _ in parts)
        if df == 0:
            return None
        return parts, float(idf(n_docs, df, self.cfg.idf)) * (self.cfg.k1 + 1.0)

    def _weighted(self, tid: int, cluster: bool) -> _Weighted | None:
        """The postings of one query term at one level (`cluster`: the cluster profiles)
        with each one's BM25 contribution `w * tf / (tf + dn)`, and the term's weight `w`
        (`_term`), or None when no live document has it. Computed on the term's first
        query on this snapshot and kept (`_TermCache`): IDF, average length and the live
        slots change only with a new snapshot."""
        cache = self._c_terms if cluster else self._m_terms
        terms = cache.terms
        if tid in terms:
            try:
                return terms[tid]
            except KeyError:  # dropped meanwhile by another thread: computed again
                pass
        if cluster:
            segs, alive, dn, n_docs = self._csegs, self._c_alive, self._c_dn, len(self._cslot_of)
        else:
            segs, alive, dn, n_docs = self._segs, self._alive, self._dn, self._n_alive
        term = self._term(tid, segs, alive, n_docs)
        if term is None:
            cache.put(tid, None, 0)
            return None
        parts, w = term
        runs = []
        for slots, tf in parts:
            x = dn.take(slots)
            x += tf
            y = w * tf
            y /= x  # w * tf / (tf + dn): the same float32 steps as the plain expression
            runs.append((slots, y))
        out = (runs, w)
        cache.put(tid, out, sum(len(sl) for sl, _ in runs))
        return out

    def _bm25(self, q: list[int], cluster: bool = False, pad: int = 0) -> np.ndarray:
        """BM25 of every memory slot (`cluster`: every cluster slot), plus `pad` zeros at
        the end; 0 for a dead slot. Only the postings of the query terms are touched: the
        array is allocated zeroed and their contributions (`_weighted`) are added into it,
        term by term in query order (each term's slots are distinct within a run and the
        runs' slots are disjoint, so `np.add.at` adds exactly what `scores[sl] += y`
        does, without the gather and scatter of a fancy index)."""
        if cluster:
            alive, n_docs, dead = self._c_alive, len(self._cslot_of), self._c_dead
        else:
            alive, n_docs, dead = self._alive, self._n_alive, self._dead
        scores = np.zeros(len(alive) + pad, dtype=np.float32)
        if n_docs == 0:
            return scores
        add = np.add.at
        for tid in q:
            got = self._weighted(tid, cluster)
            if got is not None:
                for slots, y in got[0]:
                    add(scores, slots, y)
        if n_docs != len(alive):
            scores[dead] = 0.0  # dead slots score nothing
        return scores

    def _derive(self) -> None:
        """Slot lists derived from the arrays (not pickled: recomputed on load)."""
        self._dead = np.flatnonzero(~self._alive)
        self._c_dead = np.flatnonzero(~self._c_alive)
        self._uslots = np.flatnonzero(self._unsorted & self._alive).astype(np.int64)
        self._m_terms = _TermCache(TERM_CACHE_POSTINGS)
        self._c_terms = _TermCache(TERM_CACHE_POSTINGS)

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
        s = self._mem_bm25(self._term_ids(text))
        return {m: float(s[slot]) for m, slot in self._slot_of.items()}

    def _mem_bm25(self, q: list[int]) -> np.ndarray:
        return self._bm25(q)

    def _cluster_bm25(self, q: list[int]) -> np.ndarray:
        return self._bm25(q, cluster=True)

    def _rank(
        self,
        words: list[str],
        limit: int,
        now: float | None,
        only: Sequence[str] | None = None,
        rarity: bool = False,
    ) -> tuple[list[_Ranked], list[tuple[str, str, float]]]:
        """The best `limit` memories for these query words (with the token cost of each and,
        with `rarity` (the rare-term cut is on), their query terms' weights) and the clusters
        chosen for them. `only`: the clusters the caller (SLM refinement) chose."""
        get = self._vocab.get
        q = [i for i in map(get, words) if i is not None]
        if not q or self._n_alive == 0:
            return [], []
        n = len(self._alive)
        # BM25 of every slot, plus one zero at index n: a neighbour link of -1 reads it
        s = self._bm25(q, pad=1)
        smax = float(s[:n].max()) if n else 0.0
        c_norm, selected, chosen = self._choose_clusters(self._cluster_bm25(q), only)
        if smax <= 0 and not chosen:
            return [], []
        cand = self._candidates(s, selected)
        score = self._score(cand, s, smax, c_norm, selected, now)
        weight = self._query_weights(q) if rarity else None
        return self._top_hits(cand, score, limit, weight), chosen

    def _query_weights(self, q: list[int]) -> dict[int, float]:
        """The BM25 weight (IDF x (k1 + 1)) of each query term some live memory has."""
        out: dict[int, float] = {}
        for tid in dict.fromkeys(q):
            got = self._weighted(tid, False)
            if got is not None:
                out[tid] = got[1]
        return out

    def _rarity(self, slot: int, weight: dict[int, float]) -> tuple[float, float]:
        """The highest weight among the query terms this memory has, and among those it or
        one of its neighbours (the ones that lift its score: `_links`) has."""
        starts = [seg.start for seg in self._segs]
        prev, nxt = self._links()
        own = self._rarest(slot, weight, starts)
        near = max(own, self._rarest(int(prev[slot]), weight, starts))
        return own, max(near, self._rarest(int(nxt[slot]), weight, starts))

    def _rarest(self, slot: int, weight: dict[int, float], starts: list[int]) -> float:
        """The highest weight among the query terms this memory has (0 for none, or for the
        slot -1 of a missing neighbour), read from the forward postings of the segment that
        holds the slot (`starts`: the segments' first slots)."""
        if slot < 0 or not weight:
            return 0.0
        segs = self._segs
        i = bisect_right(starts, slot) - 1
        if i < 0 or slot >= segs[i].stop:
            return 0.0
        seg = segs[i]
        j = slot - seg.start
        terms = seg.ftid[int(seg.fptr[j]) : int(seg.fptr[j + 1])].tolist()
        return max((weight.get(t, 0.0) for t in terms), default=0.0)

    def _choose_clusters(
        self, c_scores: np.ndarray, only: Sequence[str] | None
    ) -> tuple[np.ndarray, np.ndarray, list[tuple[str, str, float]]]:
        """(normalized cluster score, chosen?) per cluster slot, each with a last entry for
        unsorted (-1), and the chosen clusters: the `top_clusters` best with a positive
        score, or the ones `only` names."""
        c_norm = np.zeros(len(c_scores) + 1, dtype=np.float32)
        selected = np.zeros(len(c_scores) + 1, dtype=bool)
        order = np.zeros(0, dtype=np.int64)
        if only is not None:
            picked = [self._cslot_of[c] for c in dict.fromkeys(only) if c in self._cslot_of]
            order = np.asarray(picked, dtype=np.int64)
            if len(order):
                cmax = float(c_scores[order].max())
                if cmax > 0:
                    c_norm[:-1] = np.maximum(c_scores / cmax, 0.0)
        elif len(c_scores) and self.cfg.top_clusters > 0:
            order = _top(c_scores, self.cfg.top_clusters)
            order = order[c_scores[order] > 0]
            if len(order):
                c_norm[:-1] = c_scores / float(c_scores[order[0]])
        selected[order] = True
        chosen = [
            (self._clusters[i].id, self._clusters[i].name, float(c_scores[i]))
            for i in order.tolist()
        ]
        return c_norm, selected, chosen

    def _candidates(self, s: np.ndarray, selected: np.ndarray) -> np.ndarray:
        """The slots worth scoring, sorted: the members of the chosen clusters, the unsorted
        memories with their own evidence, both ends of every supersedes link (the
        successor's score bounds its predecessor's) and, with time neighbours, the time
        neighbours of every one of those with its own evidence. Every other memory is not
        eligible, so the dense form over all slots gives the same result, element for
        element."""
        parts: list[np.ndarray] = [self._uslots[s[self._uslots] > 0]]
        parts.extend(self._members[i] for i in np.flatnonzero(selected[:-1]).tolist())
        if len(self._sup_old):
            parts.extend((self._sup_old, self._sup_new))
        cand = _sorted_set(np.concatenate(parts), len(s))
        if self.cfg.neighbors != "time" or not self.cfg.neighbor_weight:
            return cand
        found = cand[(s[cand] > 0) & (self._unsorted[cand] | selected[self._group[cand]])]
        near = np.concatenate((self._time.prev[found], self._time.next[found]))
        return _sorted_set(np.concatenate((cand, near[near >= 0])), len(s))

    def _links(self) -> tuple[np.ndarray, np.ndarray]:
        """(previous, next) neighbour of every slot, -1 = none: in time (`neighbors: time`)
        or inside the cluster (`cluster`)."""
        if self.cfg.neighbors == "time":
            return self._time.prev, self._time.next
        return self._prev, self._next

    def _score(
        self,
        cand: np.ndarray,
        s: np.ndarray,
        smax: float,
        c_norm: np.ndarray,
        selected: np.ndarray,
        now: float | None,
    ) -> np.ndarray:
        """Final scores of the candidates (0: not eligible): normalized BM25, plus cluster
        and neighbour evidence, times quality, superseded memories below their successors."""
        cfg = self.cfg
        group = self._group[cand]
        sc = s[cand]
        score = sc / smax if smax > 0 else sc  # a new array either way
        if cfg.cluster_weight:
            score += cfg.cluster_weight * c_norm[group]
        # eligible: own lexical evidence, or a matching neighbour, inside a chosen cluster
        # (own evidence in the unsorted area); with time neighbours also the neighbour of
        # such a memory with its own evidence, wherever it is filed
        home = self._unsorted[cand] | selected[group]
        eligible = (sc > 0) & home
        if cfg.neighbor_weight:
            prev, nxt = self._links()
            lp, lx = prev[cand], nxt[cand]
            sp, sx = s[lp], s[lx]  # a link of -1 reads the zero at the end of `s`
            if smax > 0:
                sp, sx = sp / smax, sx / smax
            nb = np.maximum(sp, sx)
            score += cfg.neighbor_weight * nb
            eligible |= (nb > 0) & selected[group]
            if cfg.neighbors == "time":
                eligible |= self._found(lp, lx, s, selected)
                if cfg.second_neighbor_weight:
                    score += cfg.second_neighbor_weight * self._second(lp, lx, s, smax)
        if self._n_alive != len(self._alive):
            eligible &= self._alive[cand]
        if cfg.use_freshness:
            score = score * self._quality(now, cand)
        if len(self._sup_old):
            old = np.searchsorted(cand, self._sup_old)
            succ = np.searchsorted(cand, self._sup_new)
            score[old] *= cfg.superseded_penalty
            # a superseded memory ranks below its successor
            score[old] = np.minimum(score[old], score[succ] * np.float32(0.999))
        return np.where(eligible & (score > 0), score, 0.0)

    def _second(self, lp: np.ndarray, lx: np.ndarray, s: np.ndarray, smax: float) -> np.ndarray:
        """The better normalized BM25 of the memories two steps away in time, given the
        previous (`lp`) and next (`lx`) time neighbours (-1: none): a question and its
        answer are often a turn apart, with a short remark between them."""
        prev, nxt = self._time.prev, self._time.next
        pp = np.where(lp >= 0, prev[np.maximum(lp, 0)], -1)
        xx = np.where(lx >= 0, nxt[np.maximum(lx, 0)], -1)
        s2 = np.maximum(s[pp], s[xx])
        return s2 / smax if smax > 0 else s2

    def _found(
        self, lp: np.ndarray, lx: np.ndarray, s: np.ndarray, selected: np.ndarray
    ) -> np.ndarray:
        """Whether the previous (`lp`) or the next (`lx`) neighbour (-1: none) of each slot
        has its own evidence inside a chosen cluster or the unsorted area. A link of -1
        reads the zero at the end of `s` (and the last slot's area, which that zero
        masks)."""
        links = np.concatenate((lp, lx))
        found = s[links] > 0
        found &= self._unsorted[links] | selected[self._group[links]]
        m = len(lp)
        return found[:m] | found[m:]

    def _top_hits(
        self,
        cand: np.ndarray,
        score: np.ndarray,
        limit: int,
        weight: dict[int, float] | None = None,
    ) -> list[_Ranked]:
        """The `limit` best candidates as hits, each with its token cost in a context and,
        given the query terms' `weight`, its rarity (`_rarity`)."""
        nz = np.flatnonzero(score)
        if len(nz) > limit:  # the top `limit` and everything tied with the last of them
            kth = np.partition(score[nz], len(nz) - limit)[len(nz) - limit]
            nz = nz[score[nz] >= kth]
        # ties broken by memory id, not by slot: the same store gives the same order
        # however its snapshot was built
        mems = self._mems
        ranked = zip(cand[nz].tolist(), score[nz].tolist())
        top = sorted(ranked, key=lambda p: (-p[1], mems[p[0]].id))[:limit]
        slots = [slot for slot, _ in top]
        groups = self._group[slots].tolist()
        toks = self._tok[slots].tolist()
        clusters = self._clusters
        hits = []
        for (slot, value), g, tok in zip(top, groups, toks):
            c = clusters[g] if g >= 0 else None
            name = (c.name or c.id) if c else UNSORTED_NAME
            hit = Hit(mems[slot], c.id if c else None, name, value)
            # conservative: the estimate of a joined context never exceeds the sum of these
            cost = tok + _label_tokens(name) + 1
            if weight is None:
                hits.append((hit, cost, 0.0, 0.0))
            else:
                hits.append((hit, cost, *self._rarity(slot, weight)))
        return hits

    def _quality(self, now: float | None, slots: np.ndarray) -> np.ndarray:
        """Confidence (metadata importance) and freshness of these slots, as a multiplier
        around 1."""
        cfg = self.cfg
        now = datetime.now(timezone.utc).timestamp() if now is None else now
        age_days = np.maximum(0.0, (now - self._ts[slots]) / 86400.0)
        fresh = np.where(
            np.isnan(age_days), 0.5, 0.5 ** (age_days / max(cfg.freshness_half_life_days, 1e-9))
        )
        mult = (
            1.0
            + cfg.confidence_weight * (self._imp[slots] - 0.5)
            + cfg.freshness_weight * (fresh - 0.5)
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
        clusters: Sequence[str] | None = None,
    ) -> SearchResult:
        """Top memories for `text`: ranked by score, deduplicated, cut to k and the budget.

        `token_budget` None means the configured budget; 0 or less means no budget.
        `archive` is another snapshot (the archived clusters) merged into the ranking.
        `clusters` replaces the lexical cluster choice (ids of hot clusters; unknown ids
        are ignored): the SLM refinement passes its pick here.

        Results are cached per snapshot (see `HOT_CACHE_SIZE`): a snapshot never changes,
        so a repeated query on it has the same answer; a new snapshot starts empty.
        """
        k = self.cfg.max_memories if max_memories is None else max_memories
        budget = self.cfg.token_budget if token_budget is None else token_budget
        if k <= 0:
            return SearchResult()
        cacheable = archive is None and now is None and not self.cfg.use_freshness
        key = (text, k, budget, tuple(clusters) if clusters is not None else None)
        if cacheable:
            hit = self._cache.get(key)
            if hit is not None:
                self.cache_hits += 1
                return hit
        q = self._tokens(text)
        ts = now.timestamp() if now is not None else None
        limit = k if budget <= 0 and archive is None else k * 3 + 8
        rarity = self.cfg.min_term_rarity > 0
        hits, chosen = self._rank(q, limit, ts, clusters, rarity)
        if archive is not None:
            a_hits, a_chosen = archive._rank(q, limit, ts, rarity=rarity)
            hits = sorted(hits + a_hits, key=lambda r: -r[0].score)
            chosen = sorted(chosen + a_chosen, key=lambda c: -c[2])
        out = self._cut(hits, k, budget)
        context = format_context(out)
        res = SearchResult(out, chosen, context, estimate_tokens(context))
        if cacheable:
            self._remember(key, res)
        return res

    def _cut(self, hits: list[_Ranked], k: int, budget: int) -> list[Hit]:
        """The ranked hits that make the answer: deduplicated, at most `k`, within the
        budget (`budget` <= 0: none), and past the relevance cut-offs (docs/retrieval.md,
        "Precision"): a hit scoring below `min_relative_score` x the best score ends the
        list; a hit that matches, by itself or through a time neighbour, no query term at
        least `min_term_rarity` x as rare (by IDF) as the rarest term the `k` best hits
        match themselves shares only generic words with the query and is skipped. The
        best hit is always kept."""
        cfg = self.cfg
        floor = cfg.min_relative_score * hits[0][0].score if hits else 0.0
        rare = 0.0
        if cfg.min_term_rarity > 0:
            rare = cfg.min_term_rarity * max((r[2] for r in hits[:k]), default=0.0)
        out: list[Hit] = []
        seen: set[str] = set()
        used = 0
        for i, (h, cost, _, near) in enumerate(hits):
            if h.score < floor:
                break
            if h.memory.id in seen or (near < rare and i):
                continue
            if budget > 0 and used + cost > budget:
                continue
            seen.add(h.memory.id)
            used += cost
            out.append(h)
            if len(out) >= k:
                break
        return out

    def _remember(self, key: tuple, res: SearchResult) -> None:
        """Insert into the per-snapshot cache without a lock: dict operations are atomic
        under the GIL; a race costs at most one extra eviction or a recomputation."""
        cache = self._cache
        cache[key] = res
        while len(cache) > HOT_CACHE_SIZE:
            try:
                del cache[next(iter(cache))]
            except (KeyError, RuntimeError, StopIteration):
                break

    def cluster_candidates(self, text: str, n: int) -> list[tuple[str, str, float]]:
        """The `n` best hot clusters for `text` by profile BM25 (positive scores only):
        the lexical pre-filter of the SLM refinement."""
        get = self._vocab.get
        q = [i for i in map(get, self._tokens(text)) if i is not None]
        if not q or not self._cslot_of or n <= 0:
            return []
        c_scores = self._cluster_bm25(q)
        order = _top(c_scores, n)
        return [
            (self._clusters[i].id, self._clusters[i].name, float(c_scores[i]))
            for i in order.tolist()
            if c_scores[i] > 0
        ]

    # cells of the (memories x cluster slots) score matrix that route_many fills at a time
    ROUTE_CELLS = 1 << 20
    ROUTE_BLOCK = 32

    def route_many(self, memories: Sequence[Memory]) -> list[str | None]:
        """The cluster each new memory clearly belongs to, or None (it goes to unsorted), in
        one pass for the whole batch (ingest, route passes).

        Clearly: its best cluster-profile BM25 score is at least `route_min_score` and beats
        the runner-up by `route_margin`.

        The profile scores of a chunk of memories against all cluster slots are one dense
        (memories x cluster slots) float32 matrix, and each distinct term of the chunk one
        dense row of its BM25 contributions. Pass j adds the row of every memory's j-th term
        (a block of memories at a time), so a cell gets the same float32 additions in the
        same order as the cluster score vector of one memory (`_cluster_bm25`, plus exact zeros), and the answers equal
        scoring each memory on its own (tests/retrieval/test_index.py keeps that reference).
        """
        out: list[str | None] = [None] * len(memories)
        if not memories or not self._cslot_of:
            return out
        term_rows, qs = self._route_terms(memories)
        rows = max(1, self.ROUTE_CELLS // len(self._c_alive))
        for r0 in range(0, len(qs), rows):
            for i, cid in enumerate(self._route_chunk(qs[r0 : r0 + rows], term_rows)):
                out[r0 + i] = cid
        return out

    def _route_terms(
        self, memories: Sequence[Memory]
    ) -> tuple[dict[int, tuple[np.ndarray, np.ndarray]], list[list[int]]]:
        """The dense BM25 row (cluster slots, contributions) of every term of these memories
        that some live cluster has, and each memory's such terms in text order."""
        alive, segs, dn = self._c_alive, self._csegs, self._c_dn
        n_docs = len(self._cslot_of)
        term_of: dict[int, tuple[np.ndarray, np.ndarray] | None] = {}
        qs: list[list[int]] = []
        loose = self._loose_tids
        for m in memories:
            q = []
            known = loose.get(m.id)
            if known is not None and known[0] == m.content:
                tids = known[1]
            else:
                tids = self._term_ids(m.content)
            for tid in tids:
                if tid not in term_of:
                    got = self._term(tid, segs, alive, n_docs)
                    if got is None:
                        term_of[tid] = None
                    else:
                        parts, w = got
                        cols = np.concatenate([sl for sl, _ in parts])
                        vals = np.concatenate([w * tf / (tf + dn[sl]) for sl, tf in parts])
                        term_of[tid] = (cols, vals)
                if term_of[tid] is not None:
                    q.append(tid)
            qs.append(q)
        return {t: row for t, row in term_of.items() if row is not None}, qs

    def _route_chunk(
        self, chunk: list[list[int]], term_rows: dict[int, tuple[np.ndarray, np.ndarray]]
    ) -> list[str | None]:
        """The cluster of each memory (its term ids) of one chunk, or None."""
        nr, nc = len(chunk), len(self._c_alive)
        row_of: dict[int, int] = {}
        for q in chunk:
            for tid in q:
                row_of.setdefault(tid, len(row_of))
        contrib = np.zeros((len(row_of), nc), dtype=np.float32)
        for tid, r in row_of.items():
            cols, vals = term_rows[tid]
            contrib[r, cols] = vals
        mat = np.zeros((nr, nc), dtype=np.float32)
        # Blocks of ROUTE_BLOCK memories, most terms first: a block's score rows and the
        # term rows gathered for one position stay in the CPU cache, and the memories that
        # still have a term at position j are a prefix of the block (no scatter)
        order = sorted(range(nr), key=lambda i: -len(chunk[i]))
        buf = np.empty((self.ROUTE_BLOCK, nc), dtype=np.float32)
        for b0 in range(0, nr, self.ROUTE_BLOCK):
            rows = order[b0 : b0 + self.ROUTE_BLOCK]
            lens = [len(chunk[i]) for i in rows]
            pos = np.zeros((len(rows), lens[0]), dtype=np.intp)  # term row per position
            for i, r in enumerate(rows):
                pos[i, : lens[i]] = [row_of[t] for t in chunk[r]]
            block = np.zeros((len(rows), nc), dtype=np.float32)
            k = len(rows)
            for j in range(lens[0]):
                while lens[k - 1] <= j:
                    k -= 1
                np.take(contrib, pos[:k, j], axis=0, out=buf[:k])
                block[:k] += buf[:k]
            mat[rows] = block
        if len(self._cslot_of) != nc:
            mat[:, self._c_dead] = 0.0
        best_col = np.argmax(mat, axis=1)  # the first of equal maxima, as a stable sort
        ridx = np.arange(nr)
        # compared in float64, as `route` does with Python floats
        best = mat[ridx, best_col].astype(np.float64)
        if nc > 1:
            mat[ridx, best_col] = -np.inf
            second = mat.max(axis=1).astype(np.float64)
        else:
            second = np.zeros(nr, dtype=np.float64)
        ok = (best >= self.ingest.route_min_score) & (best - second >= self.ingest.route_margin)
        return [self._clusters[int(best_col[i])].id if ok[i] else None for i in range(nr)]


def _line(h: Hit) -> str:
    # one line whatever a model named the cluster (files are made one-line when read)
    return f"[Memory · {one_line(h.cluster_name)}] {one_line(h.memory.content)}"


def format_context(hits: list[Hit]) -> str:
    """Hits grouped by cluster (groups in order of their best hit), one line per memory."""
    groups: dict[str, list[Hit]] = {}
    for h in hits:
        groups.setdefault(h.cluster_id or "", []).append(h)
    return "\n".join(_line(h) for g in groups.values() for h in g)


def _sorted_set(slots: np.ndarray, n: int) -> np.ndarray:
    """The distinct slots, sorted (int64), as `np.unique` gives them: by a mark over all `n`
    slots when there are many (linear, no sort: a burst leaves thousands of unsorted
    memories with their own evidence), by sorting when there are few (one sort and a mask:
    `np.unique` costs ~30 us more for a few hundred slots)."""
    if len(slots) * 16 < n:
        out = slots.astype(np.int64)  # a copy, sorted in place
        out.sort()
        if len(out) < 2:
            return out
        keep = np.empty(len(out), dtype=bool)
        keep[0] = True
        np.not_equal(out[1:], out[:-1], out=keep[1:])
        return out[keep]
    mark = np.zeros(n, dtype=bool)
    mark[slots] = True
    return np.flatnonzero(mark).astype(np.int64)
