"""The incremental change: what `Index.apply` stores for the next snapshot.

A snapshot is never mutated: a change makes the parts of a new one (`MemorySlots`,
`ClusterSlots`) on copies of the old snapshot's arrays, sharing every unchanged one. Removing
a memory only clears its `alive` bit; adding appends slots and one segment of postings for
the terms they have (merged by `postings.with_segment`). A memory that is placed again
unchanged keeps its slot and its postings. The steps, in order: `free` the slots of removed
(and re-upserted) clusters and removed unsorted memories, `place_clusters`,
`place_unsorted`, then `parts()`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from clagd.model import Cluster, Memory
from clagd.retrieval.postings import (
    EMPTY_F,
    EMPTY_I,
    ClusterSlots,
    MemorySlots,
    Segment,
    chain_key,
    epoch,
    forward,
    importance,
    inverted,
    label,
    make_segment,
    profiles,
    superseded,
    with_segment,
)
from clagd.text import estimate_tokens

if TYPE_CHECKING:
    from clagd.retrieval.snapshot import Index

# a change adding more unsorted memories than this keeps no term ids for the route pass
LOOSE_TIDS_MAX = 20_000

# a memory's term ids and their counts (None: each id counts once), instead of tokenizing
TermsOf = Callable[[Memory], tuple[np.ndarray, np.ndarray | None]]
# memory id -> (its text, its term ids in text order): see `Index.loose_tids`
LooseTids = dict[str, tuple[str, list[int]]]


def written(
    old: Index,
    upsert: list[Cluster],
    removed: list[str],
    add_unsorted: list[Memory],
    remove_unsorted: list[str],
    terms_of: TermsOf | None = None,
    routes: bool = False,
) -> tuple[MemorySlots, ClusterSlots, LooseTids]:
    """The parts of the snapshot this change makes of `old`, and the term ids of the
    added unsorted memories when `routes` (see `Index.apply`). `upsert` holds each
    cluster once; `removed` names no upserted cluster."""
    # every memory that has a place after this change (the last place named wins)
    claimed: set[str] = {m.id for c in upsert for m in c.memories}
    claimed.update(m.id for m in add_unsorted)
    w = _Writer(old, claimed, terms_of)
    w.free([*removed, *(c.id for c in upsert)], remove_unsorted)
    w.place_clusters(upsert)
    w.place_unsorted(add_unsorted, keep_tids=routes)
    memories = w.memory_slots()
    return memories, w.cluster_slots(memories, upsert), w.loose_tids or {}


class _Writer:
    """One change in progress, on copies of the old snapshot's arrays."""

    def __init__(self, old: Index, claimed: set[str], terms_of: TermsOf | None) -> None:
        self.old = old
        self.m, self.c = old.memories, old.profiles
        self.terms_of = terms_of
        self.claimed = claimed  # every memory that has a place after this change
        self.base, self.cbase = len(self.m.mems), len(self.c.clusters)
        self.alive = self.m.alive.copy()
        self.c_alive = self.c.alive.copy()
        self.group = self.m.group.copy()
        self.changes: dict[str, int] = {}  # memory id -> new slot, or -1: gone
        self.cslot_of = dict(self.c.slot_of)
        self.n_alive, self.total_len = self.m.n_alive, self.m.total_len
        self.c_total_len = self.c.total_len
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
        # their text and term ids in text order, tokenized here (`Index.loose_tids`)
        self.loose_tids: LooseTids | None = None

    def lookup(self, mid: str) -> int | None:
        v = self.changes.get(mid)
        if v is None:
            return self.m.slot_of.get(mid)
        return None if v < 0 else v

    def kill(self, slot: int) -> None:
        m, base = self.m, self.base
        if slot >= base:
            if self.new_alive[slot - base]:
                self.new_alive[slot - base] = False
                self.n_alive -= 1
                self.total_len -= self.new_len[slot - base]
        elif self.alive[slot]:
            self.alive[slot] = False
            self.n_alive -= 1
            self.total_len -= float(m.length[slot])
        mid = (m.mems[slot] if slot < base else self.new_mems[slot - base]).id
        if self.lookup(mid) == slot:
            self.changes[mid] = -1

    def free(self, clusters: Iterable[str], unsorted: Iterable[str]) -> None:
        """Free the slots of these clusters and unsorted memories, except the memories that
        are placed again (an unchanged memory keeps its slot)."""
        m, c = self.m, self.c
        for cid in clusters:
            cslot = self.cslot_of.pop(cid, None)
            if cslot is None:
                continue
            self.c_alive[cslot] = False
            self.c_total_len -= float(c.length[cslot])
            for slot in c.members[cslot].tolist():
                if self.alive[slot] and m.mems[slot].id not in self.claimed:
                    self.kill(slot)
        for mid in unsorted:
            slot = m.slot_of.get(mid)
            if slot is not None and m.group[slot] < 0 and mid not in self.claimed:
                self.kill(slot)

    def place(self, mem: Memory, g: int) -> int:
        """The slot of `mem` in cluster slot `g` (-1: unsorted): its old one when
        unchanged."""
        mems = self.m.mems
        slot = self.lookup(mem.id)
        if slot is not None:
            if mem.id in self.placed:  # named twice in one change: the later place wins
                self.kill(slot)
            elif slot < self.base and (mems[slot] is mem or mems[slot] == mem):
                self.group[slot] = g  # unchanged memory: keep its slot (and postings)
                self.placed.add(mem.id)
                return slot
            else:
                self.kill(slot)
        self.placed.add(mem.id)
        slot = self.base + len(self.new_mems)
        self.new_mems.append(mem)
        self.new_alive.append(True)
        self.new_group.append(g)
        self._add_terms(mem)
        self.changes[mem.id] = slot
        self.n_alive += 1
        self.total_len += self.new_len[-1]
        return slot

    def _add_terms(self, mem: Memory) -> None:
        if self.terms_of is None:
            ids = self.old.learn(mem.content)
            self.all_tids.extend(ids)
            if self.loose_tids is not None:
                self.loose_tids[mem.id] = (mem.content, ids)
            self.new_len.append(float(len(ids)))
        else:
            tid, tf = self.terms_of(mem)
            self.doc_terms.append((tid, tf))
            self.new_len.append(float(len(tid) if tf is None else tf.sum()))

    def place_clusters(self, clusters: Iterable[Cluster]) -> None:
        """New cluster slots; each one's members placed in time order (its chain)."""
        epoch_of = self.epoch_of
        for j, c in enumerate(clusters):
            cslot = self.cbase + j
            self.cslot_of[c.id] = cslot
            seen: set[str] = set()
            chain: list[int] = []
            for m in c.memories:
                epoch_of[id(m)] = epoch(m.created_at)
            for m in sorted(c.memories, key=lambda m: chain_key(m, epoch_of[id(m)])):
                if m.id not in seen:
                    seen.add(m.id)
                    chain.append(self.place(m, cslot))
            self.chains.append(chain)
            self.labels.append(self.old.learn(label(c)))

    def place_unsorted(self, memories: list[Memory], keep_tids: bool) -> None:
        if keep_tids and len(memories) <= LOOSE_TIDS_MAX:
            self.loose_tids = {}
        self.loose = [self.place(m, -1) for m in memories]

    def memory_slots(self) -> MemorySlots:
        """The new snapshot's memory slots and postings."""
        m, mems = self.m, self.new_mems
        alive = np.concatenate((self.alive, np.asarray(self.new_alive, dtype=bool)))
        prev, nxt = self._neighbours()
        epoch_of = self.epoch_of
        times = [epoch_of[id(x)] if id(x) in epoch_of else epoch(x.created_at) for x in mems]
        ts = np.concatenate((m.ts, np.asarray(times, dtype=np.float64)))
        time = m.time
        if self.old.cfg.neighbors == "time":
            time = time.updated(alive, ts, self.base, [x.id for x in mems])
        n_terms = len(self.old.vocab)
        return MemorySlots(
            mems=m.mems.extended(mems),
            length=np.concatenate((m.length, np.asarray(self.new_len, dtype=np.float32))),
            alive=alive,
            group=np.concatenate((self.group, np.asarray(self.new_group, dtype=np.int32))),
            prev=prev,
            nxt=nxt,
            time=time,
            ts=ts,
            imp=np.concatenate((m.imp, np.asarray([importance(x) for x in mems], np.float32))),
            hid=np.concatenate((m.hid, superseded(mems))),
            tok=np.concatenate(
                (m.tok, np.asarray([estimate_tokens(x.content) for x in mems], dtype=np.int32))
            ),
            segs=with_segment(m.segs, self._memory_segment(n_terms), alive, n_terms),
            slot_of=m.slot_of.updated(self.changes),
            n_alive=self.n_alive,
            total_len=self.total_len,
        )

    def _neighbours(self) -> tuple[np.ndarray, np.ndarray]:
        """The temporal neighbour links (prev, next) along every chain; none for unsorted."""
        k = len(self.new_mems)
        prev = np.concatenate((self.m.prev, np.full(k, -1, dtype=np.int32)))
        nxt = np.concatenate((self.m.nxt, np.full(k, -1, dtype=np.int32)))
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

    def _memory_segment(self, n_terms: int) -> Segment | None:
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
            tid = np.concatenate([t for t, _ in doc_terms] or [EMPTY_I])
            if all(f is None for _, f in doc_terms):
                w = np.ones(len(tid), dtype=np.float64)
            else:
                w = np.concatenate(
                    [np.ones(len(t), dtype=np.float32) if f is None else f for t, f in doc_terms]
                    or [EMPTY_F]
                ).astype(np.float64)
        return make_segment(self.base, k, doc, tid, w, n_terms)

    def cluster_slots(self, memories: MemorySlots, clusters: list[Cluster]) -> ClusterSlots:
        """Cluster profiles: the members' term counts (from the new memory postings, never
        re-tokenized) plus the label terms, weighted (`postings.profiles`)."""
        c, chains = self.c, self.chains
        n_terms = len(self.old.vocab)
        nc = len(clusters)
        members = [np.asarray(ch, dtype=np.int32) for ch in chains]
        cseg = None
        lengths: np.ndarray = np.zeros(nc, dtype=np.float64)
        if nc:
            all_members = np.concatenate(members) if members else EMPTY_I
            owner = np.repeat(np.arange(nc), [len(ch) for ch in chains])
            pos, tid_m, tf_m = forward(memories.segs, all_members)
            cseg, lengths = profiles(self.cbase, nc, owner[pos], tid_m, tf_m, self.labels, n_terms)
            self.c_total_len += float(lengths.sum())
        alive = np.concatenate((self.c_alive, np.ones(nc, dtype=bool)))
        return ClusterSlots(
            clusters=c.clusters + clusters,
            members=c.members + members,
            length=np.concatenate((c.length, lengths.astype(np.float32))),
            alive=alive,
            segs=with_segment(c.segs, cseg, alive, n_terms),
            slot_of=self.cslot_of,
            total_len=self.c_total_len,
        )


# a snapshot whose dead cluster slots outnumber its live clusters (and this many) gets
# its cluster level compacted (`clusters_compacted`)
DEAD_CLUSTERS_MIN = 1024


def clusters_compacted(
    c: ClusterSlots, m: MemorySlots, n_terms: int
) -> tuple[ClusterSlots, MemorySlots, np.ndarray]:
    """The cluster level without its dead slots, and the memory slots' `group` renumbered
    (a dead memory of a dead cluster gets -1), and the old slot -> new slot map (-1: dead).

    Every change that rewrites a cluster gives it a new slot (a route pass, a session), and
    nothing but a compaction of the memories (when dead memories outnumber live ones)
    dropped the old ones, so the cluster level grew with every change while the memories
    did not: each query's cluster scores, `route_many`'s matrix and each change's copies
    are over all slots, dead or alive. The live slots keep their order (new slot = rank),
    so every tie between clusters breaks as before, and their profiles their postings,
    lengths and total: the scores are the same floats."""
    live = np.flatnonzero(c.alive)
    remap = np.full(len(c.alive) + 1, -1, dtype=np.int32)  # the last: group -1 stays -1
    remap[live] = np.arange(len(live), dtype=np.int32)
    pos, tid, tf = forward(c.segs, live.astype(np.int32))
    cnt = np.bincount(pos, minlength=len(live))[: len(live)]
    segs = (inverted(0, len(live), cnt, tid, tf, n_terms),) if len(live) else ()
    at = live.tolist()
    clusters = ClusterSlots(
        clusters=[c.clusters[s] for s in at],
        members=[c.members[s] for s in at],
        length=c.length[live],
        alive=np.ones(len(live), dtype=bool),
        segs=segs,
        slot_of={cid: int(remap[s]) for cid, s in c.slot_of.items()},
        total_len=c.total_len,
    )
    return clusters, replace(m, group=remap[m.group]), remap
