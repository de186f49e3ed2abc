"""Postings and the slots they point into: what one index snapshot stores, level by level.

Documents (memories; cluster profiles) live in slots. A level's postings are segments, each
over a contiguous range of slots in CSR form, inverted (term -> slots, tf) and forward (slot
-> terms, tf); a change appends one segment for its new slots and merges the tail like a
binary counter (`with_segment`: the merge policy). Removing a document only clears its
`alive` bit. The id map and the memory slots are persistent structures shared between
snapshots, so a change costs what changed, not a copy of the store. `MemorySlots` and
`ClusterSlots` are everything a snapshot stores about each level (`snapshot.Index` derives
the rest): a new stored field is declared there, once.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from clagd.model import Cluster, Memory, parse_epoch
from clagd.retrieval.timeline import Timeline

# how many times a cluster's name, description and tags count in its profile, relative to
# one occurrence in one member
PROFILE_FIELD_WEIGHT = 2

# postings whose BM25 contributions a snapshot keeps per level (`TermCache`; 4 bytes each)
TERM_CACHE_POSTINGS = 1 << 21

EMPTY_I = np.zeros(0, dtype=np.int32)
EMPTY_F = np.zeros(0, dtype=np.float32)


def epoch(created_at: str) -> float:
    """NaN for an unknown time: a neutral freshness, and first in a cluster's chain."""
    t = parse_epoch(created_at)
    return math.nan if t is None else t


def chain_key(m: Memory, t: float) -> tuple[float, str]:
    """Where a memory of time `t` (`epoch`) goes in its cluster's chain (time order)."""
    return (-math.inf if math.isnan(t) else t, m.id)


def label(c: Cluster) -> str:
    """The text of a cluster's label: name, description and tags (its profile's fields)."""
    return " ".join([c.name, c.description, *c.tags])


def superseded(mems: list[Memory]) -> np.ndarray:
    """Whether each memory is superseded by another (`Memory.superseded_by`)."""
    return np.asarray([m.superseded_by is not None for m in mems], dtype=bool)


def importance(m: Memory) -> float:
    """metadata.importance on its 0-1 scale (checked when a memory arrives; a hand-edited
    value outside it is clamped), 0.5 when absent or not a number."""
    try:
        v = float(m.metadata.get("importance", 0.5))
    except (TypeError, ValueError):
        return 0.5
    return min(1.0, max(0.0, v)) if math.isfinite(v) else 0.5


class IdMap:
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

    def updated(self, changes: dict[str, int]) -> IdMap:
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
            base = dict(IdMap(self.base, over).items())
            return IdMap(base, {}, len(base))
        return IdMap(self.base, over, size)


class Slots:
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

    def extended(self, items: list[Memory]) -> Slots:
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
        return Slots(chunks, self.size + len(items))


class Segment:
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
Weighted = tuple[list[tuple[np.ndarray, np.ndarray]], float]


class TermCache:
    """The query terms' BM25 contributions (`scoring.BM25.weighted`) of one snapshot and level:
    the postings of a term with `w * tf / (tf + dn)` per posting, computed on the term's
    first query. Every input (live document frequency, average length, the postings) is
    fixed for the snapshot, so a kept run equals a recomputed one; a new snapshot starts
    empty. At most `limit` postings are kept, the oldest terms go first. Filled without a
    lock, like the hot cache: dict operations are atomic under the GIL and a race costs
    at most a recomputation or a wrong size by one term."""

    __slots__ = ("terms", "size", "limit")

    def __init__(self, limit: int) -> None:
        self.terms: dict[int, Weighted | None] = {}
        self.size = 0
        self.limit = limit

    def put(self, tid: int, value: Weighted | None, postings: int) -> None:
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


def ptr(counts: np.ndarray) -> np.ndarray:
    out = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def make_segment(
    start: int, n_docs: int, doc: np.ndarray, tid: np.ndarray, w: np.ndarray, n_terms: int
) -> Segment:
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
        uk, tf = ks, EMPTY_F
    t = uk // n
    d = (uk - t * n).astype(np.int32)
    indptr = ptr(np.bincount(t, minlength=n_terms)[:n_terms])
    forward = np.argsort(d, kind="stable")
    fptr = ptr(np.bincount(d, minlength=n_docs)[:n_docs])
    return Segment(
        start,
        start + n_docs,
        indptr,
        (d + start).astype(np.int32),
        tf,
        fptr,
        t[forward].astype(np.int32),
        tf[forward],
    )


def merge(a: Segment, b: Segment, alive: np.ndarray, n_terms: int) -> Segment:
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
    indptr = ptr(np.bincount(tid, minlength=n_terms)[:n_terms])
    fptr = np.concatenate((a.fptr, b.fptr[1:] + a.fptr[-1]))
    return Segment(
        a.start,
        b.stop,
        indptr,
        slots[order],
        tf[order],
        fptr,
        np.concatenate((a.ftid, b.ftid)),
        np.concatenate((a.ftf, b.ftf)),
    )


def with_segment(
    segs: tuple[Segment, ...], new: Segment | None, alive: np.ndarray, n_terms: int
) -> tuple[Segment, ...]:
    """Append a segment, then merge the tail like a binary counter: a small segment merges
    into its predecessor once it is half its size, so every posting is copied O(log n)
    times and a query looks at O(log n) segments."""
    if new is None:
        return segs
    out = [*segs, new]
    while len(out) > 1 and (out[-1].nnz * 2 >= out[-2].nnz or len(out) > 16):
        b = out.pop()
        out[-1] = merge(out[-1], b, alive, n_terms)
    return tuple(out)


def forward(
    segs: tuple[Segment, ...], slots: np.ndarray
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
        return EMPTY_I, EMPTY_I, EMPTY_F
    return np.concatenate(pos_l), np.concatenate(tid_l), np.concatenate(tf_l)


def inverted(
    start: int, n_docs: int, cnt: np.ndarray, tid: np.ndarray, tf: np.ndarray, n_terms: int
) -> Segment:
    """A segment from postings given doc by doc (`cnt` distinct terms each, ids `tid` in the
    index's vocabulary): the term -> docs side is one stable sort by term id (docs stay in
    order within a term), a radix sort when the ids fit in 16 bits."""
    doc = np.repeat(np.arange(n_docs, dtype=np.int32), cnt)
    if n_terms <= 1 << 16:
        order = np.argsort(tid.astype(np.uint16), kind="stable")
    else:
        order = np.argsort(tid.astype(np.int64) * max(n_docs, 1) + doc)
    indptr = ptr(np.bincount(tid, minlength=n_terms)[:n_terms])
    return Segment(
        start, start + n_docs, indptr, doc[order] + np.int32(start), tf[order], ptr(cnt), tid, tf
    )


def profiles(
    start: int,
    n: int,
    owner: np.ndarray,
    tid: np.ndarray,
    tf: np.ndarray,
    labels: list[list[int]],
    n_terms: int,
) -> tuple[Segment, np.ndarray]:
    """The segment of `n` cluster profiles from slot `start` on, and each one's length: the
    members' term counts (entries: owning profile, term id, count) plus the terms of each
    cluster's label (name, description, tags), weighted PROFILE_FIELD_WEIGHT."""
    lab_doc = np.repeat(np.arange(n), [len(lb) for lb in labels])
    lab_tid = np.asarray([t for lb in labels for t in lb], dtype=np.int64)
    cdoc = np.concatenate((owner, lab_doc)).astype(np.int64)
    ctid = np.concatenate((tid.astype(np.int64), lab_tid))
    cw = np.concatenate((tf.astype(np.float64), np.full(len(lab_tid), float(PROFILE_FIELD_WEIGHT))))
    lengths = np.bincount(cdoc, weights=cw, minlength=n)[:n]
    return make_segment(start, n, cdoc, ctid, cw, n_terms), lengths


@dataclass(frozen=True, eq=False)
class MemorySlots:
    """Everything a snapshot stores about its memories, by slot (arrays of one length)."""

    mems: Slots
    length: np.ndarray  # float32: terms (with repeats)
    alive: np.ndarray  # bool
    group: np.ndarray  # int32: cluster slot, -1 = unsorted
    prev: np.ndarray  # int32: temporal neighbours inside the cluster, -1 = none
    nxt: np.ndarray
    # time neighbours wherever filed (`neighbors: time`; see clagd/retrieval/timeline.py)
    time: Timeline
    ts: np.ndarray  # float64: created_at (NaN: unknown)
    imp: np.ndarray  # float32: `importance`
    hid: np.ndarray  # bool: superseded (`Memory.superseded_by`), left out unless asked for
    tok: np.ndarray  # int32: estimated tokens of the content
    segs: tuple[Segment, ...]
    slot_of: IdMap  # memory id -> its live slot
    n_alive: int
    total_len: float  # of the live slots

    @classmethod
    def empty(cls, gap_seconds: float) -> MemorySlots:
        none = np.zeros(0, dtype=bool)
        i, f = EMPTY_I, EMPTY_F
        ts = np.zeros(0, dtype=np.float64)
        t = Timeline(gap_seconds)
        return cls(Slots(), f, none, i, i, i, t, ts, f, none, i, (), IdMap(), 0, 0.0)


@dataclass(frozen=True, eq=False)
class ClusterSlots:
    """Everything a snapshot stores about its clusters, by cluster slot: each one's profile
    (its members' terms plus its label, `profiles`) is one document."""

    clusters: list[Cluster]
    members: list[np.ndarray]  # int32 memory slots, in chain (time) order
    length: np.ndarray  # float32: profile length
    alive: np.ndarray  # bool
    segs: tuple[Segment, ...]
    slot_of: dict[str, int]  # cluster id -> its live slot
    total_len: float

    @classmethod
    def empty(cls) -> ClusterSlots:
        return cls([], [], EMPTY_F, np.zeros(0, dtype=bool), (), {}, 0.0)
