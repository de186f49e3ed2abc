"""Routing new memories to clusters (ingest, route passes): `Index.route_many`.

A memory goes to the cluster it clearly belongs to: its best cluster-profile BM25 score is at
least `route_min_score` and beats the runner-up by `route_margin` (`scoring.routed`, one
text at a time; here a whole batch in one pass). Otherwise it stays unsorted.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from clagd.model import Memory
from clagd.retrieval.scoping import cluster_scopes, scopes_held
from clagd.scopes import DEFAULT_SCOPE

if TYPE_CHECKING:
    from clagd.retrieval.snapshot import Index

# cells of the (memories x cluster slots) score matrix that route_many fills at a time
ROUTE_CELLS = 1 << 20
# memories whose score rows are summed together (`_chunk`)
ROUTE_BLOCK = 32

# a term's dense BM25 row over the cluster slots: (cluster slots, contributions)
_Row = tuple[np.ndarray, np.ndarray]


def route_many(ix: Index, memories: Sequence[Memory]) -> list[str | None]:
    """`Index.route_many` (see there)."""
    return [cid for part in route_steps(ix, memories) for cid in part]


def route_steps(ix: Index, memories: Sequence[Memory], step: int = 0) -> Iterator[list[str | None]]:
    """`route_many`'s answers, `step` memories at a time (0: as many as one score matrix
    holds): the scoring thread pauses between steps for the writer. Every term's dense row
    is made once for the whole batch, not again at each step: a common term reaches ~40%
    of the cluster slots, and remaking the rows for steps of 32 memories cost more than the
    scoring itself (2,000 memories at 11k clusters: 1.73 s against 0.73 s)."""
    if not memories or not ix.profiles.slot_of:
        yield [None] * len(memories)
        return
    term_rows, qs = _terms(ix, memories)
    rows = max(1, ROUTE_CELLS // len(ix.profiles.alive))
    rows = min(rows, step) if step > 0 else rows
    scoped = not scopes_held(ix) | {m.scope for m in memories} <= {DEFAULT_SCOPE}
    for r0 in range(0, len(qs), rows):
        own = [m.scope for m in memories[r0 : r0 + rows]] if scoped else None
        yield _chunk(ix, qs[r0 : r0 + rows], term_rows, own)


def _terms(ix: Index, memories: Sequence[Memory]) -> tuple[dict[int, _Row], list[list[int]]]:
    """The dense BM25 row (cluster slots, contributions) of every term of these memories
    that some live cluster has, and each memory's such terms in text order."""
    bm25 = ix.cluster_bm25
    dn = bm25.dn
    term_of: dict[int, _Row | None] = {}
    qs: list[list[int]] = []
    loose = ix.loose_tids
    for m in memories:
        q = []
        known = loose.get(m.id)
        if known is not None and known[0] == m.content:
            tids = known[1]
        else:
            tids = ix.term_ids(m.content)
        for tid in tids:
            if tid not in term_of:
                got = bm25.term(tid)
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


def _chunk(
    ix: Index, chunk: list[list[int]], term_rows: dict[int, _Row], own: list[str] | None
) -> list[str | None]:
    """The cluster of each memory (its term ids) of one chunk, or None. `own`: each
    memory's scope (None: every memory and cluster is of the default scope); a cluster of
    another scope scores nothing for it, as a dead one does."""
    nr, nc = len(chunk), len(ix.profiles.alive)
    mat = _score_matrix(chunk, term_rows, nc)
    if len(ix.profiles.slot_of) != nc:
        mat[:, ix.cluster_bm25.dead] = 0.0
    if own is not None:
        theirs = np.asarray(cluster_scopes(ix), dtype=object)
        for scope in set(own):
            rows = np.asarray([i for i, sc in enumerate(own) if sc == scope], dtype=np.int64)
            mat[np.ix_(rows, np.flatnonzero(theirs != scope))] = 0.0
    best_col = np.argmax(mat, axis=1)  # the first of equal maxima, as a stable sort
    ridx = np.arange(nr)
    # compared in float64, as `scoring.routed` does with Python floats
    best = mat[ridx, best_col].astype(np.float64)
    if nc > 1:
        mat[ridx, best_col] = -np.inf
        second = mat.max(axis=1).astype(np.float64)
    else:
        second = np.zeros(nr, dtype=np.float64)
    ok = (best >= ix.ingest.route_min_score) & (best - second >= ix.ingest.route_margin)
    clusters = ix.profiles.clusters
    return [clusters[int(best_col[i])].id if ok[i] else None for i in range(nr)]


def _score_matrix(chunk: list[list[int]], term_rows: dict[int, _Row], nc: int) -> np.ndarray:
    """The profile scores of a chunk of memories against all cluster slots: one dense
    (memories x cluster slots) float32 matrix, from one dense row of BM25 contributions
    per distinct term. Pass j adds the row of every memory's j-th term (a block of
    memories at a time), so a cell gets the same float32 additions in the same order as
    the cluster score vector of one memory (`BM25.scores`, plus exact zeros), and the
    answers equal scoring each memory on its own (tests/retrieval/test_routing.py keeps
    that reference)."""
    nr = len(chunk)
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
    buf = np.empty((ROUTE_BLOCK, nc), dtype=np.float32)
    for b0 in range(0, nr, ROUTE_BLOCK):
        rows = order[b0 : b0 + ROUTE_BLOCK]
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
    return mat
