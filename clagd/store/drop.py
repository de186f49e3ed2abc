"""Memories taken out of a state: what a forget does to HEAD's files, and what a revert
does to a forgotten memory that its result would bring back."""

from __future__ import annotations

import re
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


_WORD = re.compile(r"\w+", re.UNICODE)
Labels = tuple[str, str, list[str]]  # a cluster's name, description, tags


def label_words(labels: Labels, kept: list[str], gone: list[str]) -> Labels:
    """A cluster's labels without the words that only the `gone` memories' texts had, not
    the `kept` ones' (a name made from a forgotten memory's words would keep them). A name
    left empty becomes "Notes"."""
    have = {w.casefold() for text in kept for w in _WORD.findall(text)}
    only = {w.casefold() for text in gone for w in _WORD.findall(text)} - have
    if not only:
        return labels

    def clean(text: str) -> str:
        out = _WORD.sub(lambda mo: "" if mo.group(0).casefold() in only else mo.group(0), text)
        return " ".join(out.split())

    name, description, tags = labels
    cleaned = [t for t in (clean(t) for t in tags) if t]
    return clean(name) or "Notes", clean(description), cleaned
