"""Reading a snapshot without a query: one memory by id, and the memories a metadata
filter and a time let through, newest first (the `get` and `list` ops)."""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

import numpy as np

from clagd.protocol import Where
from clagd.retrieval.results import UNSORTED_NAME, Hit
from clagd.retrieval.scoping import masks
from clagd.retrieval.searching import where_mask
from clagd.retrieval.timeline import id_keys

if TYPE_CHECKING:
    from clagd.retrieval.snapshot import Index


def find(ix: Index, mid: str, scopes: Collection[str] | None = None) -> Hit | None:
    """The memory `mid` where this snapshot files it (score 0), or None; with `scopes`,
    None too when it belongs to none of them (another scope's memory is not there)."""
    slot = ix.memories.slot_of.get(mid)
    if slot is None or (scopes is not None and ix.memories.mems[slot].scope not in scopes):
        return None
    return _hit(ix, slot)


def newest(
    ix: Index,
    where: Where,
    since: float | None,
    limit: int,
    scopes: Collection[str] | None = None,
    superseded: bool = False,
) -> tuple[list[Hit], int]:
    """The `limit` newest memories (by created_at, then id; unknown times last) of
    `scopes` (None: all) whose metadata holds every pair of `where` and, with `since`
    (epoch seconds), made at or after it; and how many memories match in all. A memory
    another supersedes (`clagd update`) is left out unless `superseded`."""
    m = ix.memories
    keep = m.alive.copy()
    if not superseded and ix.any_hidden:
        keep &= ~m.hid
    vis = masks(ix, scopes)
    if vis is not None:
        keep &= vis[0][: len(keep)]
    if where:
        keep &= where_mask(ix, where)[: len(keep)]
    if since is not None:
        with np.errstate(invalid="ignore"):  # NaN (an unknown time) is never after
            keep &= m.ts >= since
    slots = np.flatnonzero(keep)
    total = len(slots)
    if not total or limit <= 0:
        return [], total
    ts = np.nan_to_num(m.ts[slots], nan=-np.inf)
    if total > limit:  # only the newest `limit` (and ties with the last) are sorted
        kth = np.partition(ts, total - limit)[total - limit]
        slots, ts = slots[ts >= kth], ts[ts >= kth]
    keys = id_keys([m.mems[s].id for s in slots.tolist()])
    order = np.lexsort((keys, ts))[::-1][:limit]
    return [_hit(ix, int(s)) for s in slots[order].tolist()], total


def _hit(ix: Index, slot: int) -> Hit:
    g = int(ix.memories.group[slot])
    c = ix.profiles.clusters[g] if g >= 0 else None
    name = (c.name or c.id) if c else UNSORTED_NAME
    return Hit(ix.memories.mems[slot], c.id if c else None, name, 0.0)
