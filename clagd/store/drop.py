"""Memories taken out of a state: what a forget does to HEAD's files, and what a revert
does to a forgotten memory that its result would bring back."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from clagd.store.files import StoreState

# mark(area, key) is called before the file behind it changes: area is "cluster",
# "archive" or "unsorted", key a cluster id or a shard name
Mark = Callable[[str, str], None]


def drop_memories(state: StoreState, ids: set[str] | frozenset[str], mark: Mark) -> int:
    """Take `ids` out of every cluster, archived cluster and shard of `state` (in place:
    new cluster objects and lists, nothing another state shares is changed), and out of
    every cluster's supersedes links; a cluster left empty is removed, an empty shard too.
    Returns how many memories left."""
    gone = 0
    for area_name, area in (("cluster", state.clusters), ("archive", state.archived)):
        for cid, c in list(area.items()):
            keep = [m for m in c.memories if m.id not in ids]
            links = {k: v for k, v in c.supersedes.items() if k not in ids and v not in ids}
            if len(keep) == len(c.memories) and len(links) == len(c.supersedes):
                continue
            mark(area_name, cid)
            gone += len(c.memories) - len(keep)
            if keep:
                area[cid] = replace(c, memories=keep, supersedes=links)
            else:
                del area[cid]
    for name, mems in list(state.unsorted.items()):
        keep = [m for m in mems if m.id not in ids]
        if len(keep) != len(mems):
            mark("unsorted", name)
            gone += len(mems) - len(keep)
            state.unsorted[name] = keep
    return gone
