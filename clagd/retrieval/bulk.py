"""Building a whole index at once from the parts of a store (the start-up loader's path).

`Index.apply` is made for changes: it walks the memories one by one (slots, chains, term
ids, times) and builds postings for what changed. Loading a large store from its files that
way cost about as much as parsing them (docs/retrieval.md, "Scale"). Here the per-memory
work is done by `prepare`, in the loader's worker processes, part by part, into plain arrays
(cheap to send between processes): each memory's term ids in the part's own small
vocabulary, already counted per memory and per cluster profile, its time, importance and
token estimate, the clusters' members in chain order. `build` then maps each part's
vocabulary onto the index's with one lookup array and builds every array of the snapshot
from the concatenated parts with a few numpy passes.

The result is the snapshot `Index.build(clusters, unsorted)` gives for the parts' clusters
and unsorted memories in the same order (tests/retrieval/test_bulk.py compares them), except
for the ids given to terms and so the order of a memory's terms in its forward postings,
which nothing outside the index sees.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from clagd.config import IngestConfig, RetrievalConfig
from clagd.model import Cluster, Memory
from clagd.retrieval.postings import (
    PROFILE_FIELD_WEIGHT,
    ClusterSlots,
    IdMap,
    MemorySlots,
    Segment,
    Slots,
    chain_key,
    epoch,
    importance,
    inverted,
    label,
    ptr,
    superseded,
)
from clagd.retrieval.snapshot import Index
from clagd.retrieval.timeline import Timeline
from clagd.text import (
    WORD_SEP,
    estimate_tokens_many,
    tokenize,
    word_stream,
    word_terms,
    words,
)

_SEP, _DROP = -2, -1  # word ids of the separator after each text and of a dropped word


def _i64() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


@dataclass
class Prepared:
    """One part of a store, ready for `build`: its memories in slot order (each cluster's
    members in chain order, then the unsorted memories) and, per memory and per cluster,
    arrays over the part's own vocabulary (`vocab`: local term id -> term)."""

    vocab: list[str] = field(default_factory=list)
    clusters: list[Cluster] = field(default_factory=list)
    mems: list[Memory] = field(default_factory=list)
    sizes: np.ndarray = field(default_factory=_i64)  # members per cluster
    ts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float64))
    imp: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    hid: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    tok: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    lens: np.ndarray = field(default_factory=_i64)  # terms per memory (with repeats)
    # memory postings, memory by memory: how many distinct terms, which, how often
    fcnt: np.ndarray = field(default_factory=_i64)
    ftid: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    ftf: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    # cluster profiles (members' terms plus the weighted label), cluster by cluster
    ccnt: np.ndarray = field(default_factory=_i64)
    ctid: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    ctf: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    clen: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float64))

    @property
    def n_clustered(self) -> int:
        """How many of `mems` (the first ones) are members of `clusters`."""
        return int(self.sizes.sum())


_MAX_WORDS = 500_000


class _Words(dict[bytes, int]):
    """A thread's vocabulary, kept across the chunks it prepares (each chunk then takes
    the part it uses, `_local`): word (bytes, from `word_stream`) -> term id in `terms`,
    `_DROP` for a word that is no term, `_SEP` for WORD_SEP; a word is learned the first
    time it is looked up, so a chunk calls into Python only for words new to the process."""

    def __init__(self, stem: bool, stopwords: bool) -> None:
        super().__init__({WORD_SEP: _SEP})
        self.stem, self.stopwords = stem, stopwords
        self.terms: list[str] = []
        self.term_id: dict[str, int] = {}

    def __missing__(self, word: bytes) -> int:
        t = word_terms([word.decode("ascii")], self.stem, self.stopwords)[0]
        i = self[word] = self.term(t) if t else _DROP
        return i

    def term(self, t: str) -> int:
        i = self.term_id.get(t)
        if i is None:
            i = self.term_id[t] = len(self.terms)
            self.terms.append(t)
        return i

    def ids(self, ws: list[str]) -> list[int]:
        """The ids of these words' terms (dropped words left out)."""
        return [self.term(t) for t in word_terms(ws, self.stem, self.stopwords) if t]


# one vocabulary per thread (and tokenizer setting): two threads preparing at once (two
# engines starting in one process) must not number terms in one list
_LOCAL = threading.local()


def _words(stem: bool, stopwords: bool) -> _Words:
    mine: dict[tuple[bool, bool], _Words] = _LOCAL.__dict__.setdefault("words", {})
    got = mine.get((stem, stopwords))
    if got is None or len(got) > _MAX_WORDS:
        got = mine[(stem, stopwords)] = _Words(stem, stopwords)
    return got


def _terms(texts: list[str], vocab: _Words) -> tuple[np.ndarray, np.ndarray]:
    """(term ids of all texts, in order; terms per text): `tokenize` of each text, as ids
    in `vocab`. The ASCII texts go through `word_stream` together, the rest one by one."""
    plain = [t if t.isascii() else "" for t in texts]
    stream = word_stream(plain)
    raw = np.fromiter(map(vocab.__getitem__, stream), dtype=np.int32, count=len(stream))
    sep = np.flatnonzero(raw == _SEP)
    kept = np.zeros(len(raw) + 1, dtype=np.int64)
    np.cumsum(raw >= 0, out=kept[1:])
    lens = np.diff(kept[sep], prepend=0)
    terms = raw[raw >= 0]
    other = [i for i, t in enumerate(plain) if not t and texts[i]]
    if other:  # not ASCII: the regex path (`words`), spliced in where the text's terms go
        ids = [vocab.ids(words(texts[i])) for i in other]
        at = ptr(lens)[other]
        terms = np.insert(
            terms,
            np.repeat(at, [len(x) for x in ids]),
            np.asarray([x for xs in ids for x in xs], dtype=np.int32),
        )
        lens[other] = [len(x) for x in ids]
    return terms.astype(np.int32), lens


def _local(vocab: _Words, *ids: np.ndarray) -> tuple[list[str], list[np.ndarray]]:
    """The terms these ids use (the chunk's own vocabulary, sent with it) and the ids as
    indices into it."""
    seen = np.zeros(len(vocab.terms), dtype=bool)
    for x in ids:
        seen[x] = True
    used = np.flatnonzero(seen)
    lut = np.zeros(len(vocab.terms), dtype=np.int32)
    lut[used] = np.arange(len(used), dtype=np.int32)
    terms = vocab.terms
    return [terms[i] for i in used.tolist()], [lut[x] for x in ids]


def _count(
    doc: np.ndarray, tid: np.ndarray, w: np.ndarray | None, n_docs: int, n_terms: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(distinct terms per doc, their ids, their summed weights) of (doc, term, weight)
    entries (weight 1 when `w` is None; weights are positive), doc by doc."""
    key = doc.astype(np.int64) * max(n_terms, 1) + tid
    cells = n_docs * max(n_terms, 1)
    if cells <= 8 * len(key):  # few docs (a chunk's clusters): count in a dense table
        sums = np.bincount(key, weights=w, minlength=cells)
        uk = np.flatnonzero(sums)
        d = uk // max(n_terms, 1)
        cnt = np.bincount(d, minlength=n_docs)[:n_docs]
        tf = sums[uk].astype(np.float64)
        return cnt.astype(np.int64), (uk - d * max(n_terms, 1)).astype(np.int32), tf
    order = np.argsort(key)
    ks = key[order]
    if not len(ks):
        return np.zeros(n_docs, dtype=np.int64), tid[:0].astype(np.int32), np.zeros(0)
    first = np.empty(len(ks), dtype=bool)
    first[0] = True
    np.not_equal(ks[1:], ks[:-1], out=first[1:])
    runs = np.flatnonzero(first)
    if w is None:
        tf = np.diff(runs, append=len(ks)).astype(np.float64)
    else:
        tf = np.add.reduceat(w[order], runs)
    uk = ks[runs]
    d = uk // max(n_terms, 1)
    cnt = np.bincount(d, minlength=n_docs)[:n_docs]
    return cnt.astype(np.int64), (uk - d * max(n_terms, 1)).astype(np.int32), tf


def prepare(
    clusters: Sequence[Cluster], unsorted: Sequence[Memory], stem: bool, stopwords: bool
) -> Prepared:
    """The arrays `build` needs for these clusters and unsorted memories (see `Prepared`);
    `stem` and `stopwords` are the index's tokenizer settings."""
    p = Prepared(clusters=list(clusters))
    ts: list[float] = []
    sizes: list[int] = []
    for c in p.clusters:
        times = {id(m): epoch(m.created_at) for m in c.memories}
        ordered = sorted(c.memories, key=lambda m: chain_key(m, times[id(m)]))
        p.mems += ordered
        ts += [times[id(m)] for m in ordered]
        sizes.append(len(ordered))
    p.mems += unsorted
    ts += [epoch(m.created_at) for m in unsorted]
    p.sizes = np.asarray(sizes, dtype=np.int64)
    p.ts = np.asarray(ts, dtype=np.float64)
    p.imp = np.asarray([importance(m) for m in p.mems], dtype=np.float32)
    p.hid = superseded(p.mems)
    texts = [m.content for m in p.mems]
    p.tok = estimate_tokens_many(texts).astype(np.int32)
    vocab = _words(stem, stopwords)
    terms, p.lens = _terms(texts, vocab)
    labels = [[vocab.term(t) for t in tokenize(label(c), stem, stopwords)] for c in p.clusters]
    flat = np.asarray([t for lb in labels for t in lb], dtype=np.int32)
    p.vocab, (terms, flat) = _local(vocab, terms, flat)
    n = len(p.mems)
    doc = np.repeat(np.arange(n, dtype=np.int64), p.lens)
    p.fcnt, p.ftid, ftf = _count(doc, terms, None, n, len(p.vocab))
    p.ftf = ftf.astype(np.float32)
    _profiles(p, flat, [len(lb) for lb in labels])
    return p


def _profiles(p: Prepared, labels: np.ndarray, label_lens: list[int]) -> None:
    """Each cluster's profile: its members' term counts plus its label's terms (`labels`,
    `label_lens` per cluster), weighted PROFILE_FIELD_WEIGHT (what `Index.apply` sums from
    the members' postings)."""
    nc, n_in = len(p.clusters), p.n_clustered
    owner = np.repeat(np.repeat(np.arange(nc, dtype=np.int64), p.sizes), p.fcnt[:n_in])
    m_tid = p.ftid[: len(owner)].astype(np.int64)
    lab_doc = np.repeat(np.arange(nc, dtype=np.int64), label_lens)
    lab_tid = labels.astype(np.int64)
    w = np.concatenate(
        (p.ftf[: len(owner)].astype(np.float64), np.full(len(lab_tid), float(PROFILE_FIELD_WEIGHT)))
    )
    doc = np.concatenate((owner, lab_doc))
    p.clen = np.bincount(doc, weights=w, minlength=nc)[:nc]
    p.ccnt, p.ctid, ctf = _count(doc, np.concatenate((m_tid, lab_tid)), w, nc, len(p.vocab))
    p.ctf = ctf.astype(np.float32)


def build(
    parts: Sequence[Prepared],
    cfg: RetrievalConfig | None = None,
    ingest: IngestConfig | None = None,
) -> Index:
    """One snapshot of every part's clusters, then every part's unsorted memories: the one
    `Index.build` gives for them in that order. Memory or cluster ids named twice (a store
    `apply_update` would refuse) are left to `Index.build`, which resolves them."""
    cfg = cfg or RetrievalConfig()
    mems = [m for p in parts for m in p.mems[: p.n_clustered]]
    mems += [m for p in parts for m in p.mems[p.n_clustered :]]
    clusters = [c for p in parts for c in p.clusters]
    ids = [m.id for m in mems]
    slot_of = dict(zip(ids, range(len(ids))))
    cslot_of = {c.id: i for i, c in enumerate(clusters)}
    if len(slot_of) != len(mems) or len(cslot_of) != len(clusters):
        unsorted = [m for p in parts for m in p.mems[p.n_clustered :]]
        return Index.build(clusters, unsorted, cfg, ingest)
    # the index's vocabulary: every part's terms, numbered in order of first appearance
    vocab = dict.fromkeys(chain.from_iterable(p.vocab for p in parts), 0)
    for i, t in enumerate(vocab):
        vocab[t] = i
    gmaps = [np.fromiter(map(vocab.__getitem__, p.vocab), np.int32, len(p.vocab)) for p in parts]
    n_terms = len(vocab)
    memories = _memories(parts, gmaps, n_terms, mems, IdMap(slot_of, {}, len(slot_of)), cfg)
    profiles = _clusters(parts, gmaps, n_terms, clusters, cslot_of)
    return Index(cfg, ingest, vocab, memories, profiles)


def _sections(parts: Sequence[Prepared]) -> list[tuple[int, int, int]]:
    """(part, first, stop) memory ranges in slot order: the parts' clustered memories, then
    their unsorted ones."""
    ranges = [(i, 0, p.n_clustered) for i, p in enumerate(parts)]
    return ranges + [(i, p.n_clustered, len(p.mems)) for i, p in enumerate(parts)]


def _memories(
    parts: Sequence[Prepared],
    gmaps: list[np.ndarray],
    n_terms: int,
    mems: list[Memory],
    slot_of: IdMap,
    cfg: RetrievalConfig,
) -> MemorySlots:
    """The memory slots: their arrays, chain links and postings."""
    secs = _sections(parts)
    ptrs = [ptr(p.fcnt) for p in parts]

    def cat(name: str, dtype: type) -> np.ndarray:
        arrs = [getattr(parts[i], name)[a:b] for i, a, b in secs]
        return np.concatenate(arrs).astype(dtype) if arrs else np.zeros(0, dtype=dtype)

    n = len(mems)
    lens = cat("lens", np.int64)
    cnt = cat("fcnt", np.int64)
    tid = [gmaps[i][parts[i].ftid[ptrs[i][a] : ptrs[i][b]]] for i, a, b in secs]
    tf = [parts[i].ftf[ptrs[i][a] : ptrs[i][b]] for i, a, b in secs]
    tids = np.concatenate(tid) if tid else np.zeros(0, dtype=np.int32)
    tfs = np.concatenate(tf) if tf else np.zeros(0, dtype=np.float32)
    sizes = np.concatenate([p.sizes for p in parts]) if parts else _i64()
    n_in = int(sizes.sum())
    group = np.full(n, -1, dtype=np.int32)
    group[:n_in] = np.repeat(np.arange(len(sizes), dtype=np.int32), sizes)
    prev, nxt = _chains(n, sizes)
    alive = np.ones(n, dtype=bool)
    ts = cat("ts", np.float64)
    time = Timeline(cfg.neighbor_gap_minutes * 60.0)
    if cfg.neighbors == "time":
        time = time.updated(alive, ts, 0, [m.id for m in mems])
    return MemorySlots(
        mems=Slots().extended(mems),
        length=lens.astype(np.float32),
        alive=alive,
        group=group,
        prev=prev,
        nxt=nxt,
        time=time,
        ts=ts,
        imp=cat("imp", np.float32),
        hid=cat("hid", np.bool_),
        tok=cat("tok", np.int32),
        segs=(inverted(0, n, cnt, tids, tfs, n_terms),) if n else (),
        slot_of=slot_of,
        n_alive=n,
        total_len=float(lens.sum()),
    )


def _chains(n: int, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(prev, next) along each cluster's run of slots (its chain); -1 at the ends and for
    the unsorted slots after them."""
    slots = np.arange(n, dtype=np.int32)
    prev, nxt = slots - 1, slots + 1
    ends = np.cumsum(sizes)
    starts = ends - sizes
    full = sizes > 0
    prev[starts[full]] = -1
    nxt[ends[full] - 1] = -1
    n_in = int(ends[-1]) if len(ends) else 0
    prev[n_in:] = -1
    nxt[n_in:] = -1
    return prev, nxt


def _clusters(
    parts: Sequence[Prepared],
    gmaps: list[np.ndarray],
    n_terms: int,
    clusters: list[Cluster],
    cslot_of: dict[str, int],
) -> ClusterSlots:
    """The cluster slots: members (runs of memory slots), profiles and their postings."""
    nc = len(clusters)
    sizes = np.concatenate([p.sizes for p in parts]) if parts else _i64()
    ends = np.cumsum(sizes)
    members = [
        np.arange(a, b, dtype=np.int32) for a, b in zip((ends - sizes).tolist(), ends.tolist())
    ]
    clen = np.concatenate([p.clen for p in parts]) if parts else np.zeros(0)
    segs: tuple[Segment, ...] = ()
    if nc:
        cnt = np.concatenate([p.ccnt for p in parts])
        tid = np.concatenate([g[p.ctid] for g, p in zip(gmaps, parts)])
        tf = np.concatenate([p.ctf for p in parts])
        segs = (inverted(0, nc, cnt, tid, tf, n_terms),)
    return ClusterSlots(
        clusters=clusters,
        members=members,
        length=clen.astype(np.float32),
        alive=np.ones(nc, dtype=bool),
        segs=segs,
        slot_of=cslot_of,
        total_len=float(clen.sum()),
    )
