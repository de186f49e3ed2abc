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

import itertools
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from clagd.model import Cluster, Memory
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


def carry_held(
    old: Index,
    new: Index,
    upsert: Iterable[Cluster],
    removed: Iterable[str],
    add_unsorted: Iterable[Memory],
    remove_unsorted: Iterable[str],
) -> None:
    """Give `new`, the snapshot a change makes of `old`, the scopes it holds without the
    pass over every cluster that `scopes_held` makes (~3 ms of every write at 11k
    clusters): `old`'s plus those the change adds, when every scope that a replaced or
    removed cluster or a removed unsorted memory had is among those it adds. Otherwise a
    scope may have left the store, and `scopes_held` computes them on first use."""
    held = old.scope_cache.get("held")
    if not isinstance(held, frozenset):
        return
    upsert = list(upsert)
    added = {c.scope for c in upsert} | {m.scope for m in add_unsorted}
    c, m = old.profiles, old.memories
    gone: set[str] = set()
    for cid in itertools.chain((x.id for x in upsert), removed):
        cslot = c.slot_of.get(cid)
        if cslot is not None:
            gone.add(c.clusters[cslot].scope)
    for mid in remove_unsorted:
        slot = m.slot_of.get(mid)
        if slot is not None:
            gone.add(m.mems[slot].scope)
    if gone <= added:
        new.scope_cache["held"] = held | added


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
