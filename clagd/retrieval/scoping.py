"""Which slots of a snapshot a query may see: its scopes (`clagd.scopes`).

One snapshot holds every scope's memories (BM25's document frequencies are the store's);
a query names the scopes it sees, and every other memory and cluster scores nothing: the
cluster choice, the candidates, neighbour evidence and the answer all come from the visible
ones only. A memory filed in a cluster has the cluster's scope (a cluster holds one scope),
so the mask over memory slots is the clusters' mask read through `group`, plus the unsorted
memories' own scopes. Masks are made on first use and kept with the snapshot (snapshots
never change); a store that holds only the scopes a query sees needs none (None: every slot
is visible, the search is exactly the search of a store without scopes)."""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from clagd.retrieval.snapshot import Index

# (memory slots visible, with a last False for the -1 link; cluster slots visible)
Masks = tuple[np.ndarray, np.ndarray]


def scopes_held(ix: Index) -> frozenset[str]:
    """The scopes of the live clusters and unsorted memories of this snapshot."""
    got = ix.scope_cache.get("held")
    if isinstance(got, frozenset):
        return got
    c = ix.profiles
    held = {c.clusters[cslot].scope for cslot in c.slot_of.values()}
    mems = ix.memories.mems
    held.update(mems[slot].scope for slot in ix.uslots.tolist())
    out = frozenset(held)
    ix.scope_cache["held"] = out
    return out


def masks(ix: Index, scopes: Collection[str] | None) -> Masks | None:
    """The visible memory and cluster slots for these scopes (None: all scopes, or every
    scope the snapshot holds is among them: nothing to hide)."""
    if scopes is None:
        return None
    key = frozenset(scopes)
    if scopes_held(ix) <= key:
        return None
    got = ix.scope_cache.get(key)
    if isinstance(got, tuple):
        return got
    c, m = ix.profiles, ix.memories
    cvis = np.zeros(len(c.alive), dtype=bool)
    for cslot in c.slot_of.values():
        cvis[cslot] = c.clusters[cslot].scope in key
    n = len(m.alive)
    gvis = np.append(cvis, False)  # group -1 (unsorted) reads the last entry
    mvis = np.zeros(n + 1, dtype=bool)
    mvis[:n] = gvis[m.group]
    mems = m.mems
    for slot in ix.uslots.tolist():
        mvis[slot] = mems[slot].scope in key
    out = (mvis, cvis)
    ix.scope_cache[key] = out
    return out


def cluster_scopes(ix: Index) -> list[str]:
    """The scope of every cluster slot ("" for a dead slot), for routing."""
    got = ix.scope_cache.get("clusters")
    if isinstance(got, list):
        return got
    c = ix.profiles
    out = [""] * len(c.alive)
    for cslot in c.slot_of.values():
        out[cslot] = c.clusters[cslot].scope
    ix.scope_cache["clusters"] = out
    return out
