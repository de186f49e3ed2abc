"""A query's answer from one index snapshot: what the daemon, the query processes and the
benchmarks all call, so that each answers a query exactly alike."""

from __future__ import annotations

import time

from clagd.engine.results import ClusterScore, MemoryHit, QueryResult
from clagd.protocol import QueryParams
from clagd.retrieval.index import Index


def answer(
    index: Index,
    q: QueryParams,
    archive: Index | None = None,
    clusters: list[str] | None = None,
    archived_ids: set[str] | frozenset[str] = frozenset(),
    *,
    started: float | None = None,
) -> tuple[QueryResult, list[str], list[str]]:
    """A query's reply from one index snapshot (`took_ms`: since `started`, a
    `time.perf_counter()`; 0 without it), with the memory and cluster ids it returned
    (what the access statistics count)."""
    res = index.search(
        q.text,
        q.max_memories,
        q.token_budget,
        archive=archive,
        clusters=clusters,
        where=q.where,
        scopes=q.visible(),
        superseded=q.superseded,
    )
    out = QueryResult(
        tuple(MemoryHit.of(h, h.cluster_id in archived_ids) for h in res.memories),
        tuple(ClusterScore(cid, name, round(float(sc), 4)) for cid, name, sc in res.clusters),
        res.context,
        res.tokens,
        0.0 if started is None else round((time.perf_counter() - started) * 1000, 3),
    )
    memory_ids = [h.memory.id for h in res.memories]
    cluster_ids = sorted({h.cluster_id for h in res.memories if h.cluster_id})
    return out, memory_ids, cluster_ids
