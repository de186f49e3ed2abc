"""Reading memories without a query: `get` (one memory by id) and `list` (the memories a
metadata filter and a time let through, newest first), from the served snapshots (the hot
index, and the archive's when asked): lock-free, like a query."""

from __future__ import annotations

import math
import time
from collections.abc import Collection

from clagd.engine.results import MemoryList, MemoryRecord
from clagd.errors import BadRequest, NotFound
from clagd.model import MEMORY_ID_RE, parse_epoch
from clagd.protocol import ListParams, since_epoch
from clagd.retrieval.index import Index


def get_memory(
    hot: Index, archive: Index | None, mid: object, scopes: Collection[str]
) -> MemoryRecord:
    """Memory `mid` of one of `scopes` from the hot snapshot, else from the archive's (when
    given); NotFound naming the id when neither holds it (another scope's memory is not
    found either: a request cannot learn what another scope holds)."""
    if not isinstance(mid, str) or not mid.strip():
        raise BadRequest("'memory_id' must be a memory id (m- and 16 hex digits)")
    mid = mid.strip()
    if not MEMORY_ID_RE.match(mid):
        raise BadRequest(f"{mid[:80]!r} is not a memory id (m- and 16 hex digits)")
    hit = hot.find(mid, scopes)
    if hit is not None:
        return MemoryRecord.of(hit, False)
    hit = archive.find(mid, scopes) if archive is not None else None
    if hit is not None:
        return MemoryRecord.of(hit, True)
    raise NotFound(
        f"no memory {mid} in scope {', '.join(sorted(scopes))} of this store "
        "(forgotten, reverted, never added, or another scope's)"
    )


def list_memories(
    hot: Index, archive: Index | None, p: ListParams, now: float | None = None
) -> MemoryList:
    """The newest `p.limit` memories of the hot snapshot (and the archive's, when given)
    that `p.where` and `p.since` let through, and how many do in all."""
    since = None if p.since is None else since_epoch(p.since, time.time() if now is None else now)
    scopes = p.visible()
    hits, total = hot.newest(p.where, since, p.limit, scopes, p.superseded)
    records = [MemoryRecord.of(h, False) for h in hits]
    if archive is not None:
        a_hits, a_total = archive.newest(p.where, since, p.limit, scopes, p.superseded)
        records += [MemoryRecord.of(h, True) for h in a_hits]
        total += a_total
        records.sort(key=_when, reverse=True)
    return MemoryList(tuple(records[: p.limit]), total, p.limit)


def _when(r: MemoryRecord) -> tuple[float, str]:
    """The order `Index.newest` gives (reversed): by time, then id; unknown times first."""
    t = parse_epoch(r.created_at)
    return (-math.inf if t is None else t, r.id)
