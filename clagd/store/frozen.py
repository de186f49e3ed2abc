"""Copies of the hot clusters as the last published change left them, kept by the writer
(issue 26): a clustering session's snapshot is a copy of this table (one dict copy on the
writer thread), not a copy of every cluster. A change updates the copies of the clusters
it changed only, so the writer's work is proportional to what changed."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from clagd.model import Cluster
from clagd.store.changes import StoreChange
from clagd.store.files import StoreState


def frozen_copy(c: Cluster) -> Cluster:
    """A copy no later change reaches: its own member list, tags and supersedes (a memory
    is never changed in place: a change makes a new object, so the members are shared)."""
    # every field through __init__ (copy.copy took 5 times as long: 100 ms at 11k clusters)
    own = {"memories": list(c.memories), "tags": list(c.tags), "supersedes": dict(c.supersedes)}
    return Cluster(**{**vars(c), **own})


class FrozenClusters:
    """The table, made on first use and then kept in step with every published change
    (on the writer thread only)."""

    def __init__(self) -> None:
        self._copies: dict[str, Cluster] | None = None
        self._names: ClusterNames | None = None

    def changed(self, change: StoreChange) -> None:
        idx = change.index
        if idx.build:  # read again from scratch: made again on the next use
            self._copies = self._names = None
            return
        if self._names is not None:
            self._names.changed(idx.remove_clusters, idx.upsert_clusters)
        copies = self._copies
        if copies is None:
            return
        for cid in idx.remove_clusters:
            copies.pop(cid, None)
        for c in idx.upsert_clusters:
            copies[c.id] = frozen_copy(c)

    def names(self, state: StoreState) -> ClusterNames:
        """The hot clusters' names as the last published change left them (made from
        `state` when there is none yet, or when it does not count `state`'s clusters)."""
        names = self._names
        if names is None or len(names) != len(state.clusters):
            names = self._names = ClusterNames(state.clusters)
        return names

    def view(self, state: StoreState) -> dict[str, Cluster]:
        """The copies of `state`'s hot clusters (a new dict; the copies are never changed).
        Those missing are made from `state` (none yet, or `prime` has not finished), and
        those of clusters `state` does not hold dropped (a change that was not published:
        never expected, but never served either)."""
        copies = self._copies
        if copies is None or len(copies) != len(state.clusters):
            self.prime(state)
            copies = self._copies
            assert copies is not None
        return dict(copies)

    def prime(self, state: StoreState, limit: int | None = None) -> bool:
        """Make up to `limit` (None: all) of the missing copies; True when none is missing.
        The writer makes them after its start in slices, writes in between (at 11k clusters
        all of them at once were 0.15-0.3 s of the start, before the first answer)."""
        copies = self._copies if self._copies is not None else {}
        self._copies = copies
        for cid in [cid for cid in copies if cid not in state.clusters]:
            del copies[cid]
        made = 0
        for cid, c in state.clusters.items():
            if cid not in copies:
                if limit is not None and made >= limit:
                    return False
                copies[cid] = frozen_copy(c)
                made += 1
        return True


def name_key(scope: str, name: str) -> tuple[str, str]:
    """What makes two cluster names the same: within one scope, case and outer spaces aside."""
    return scope, name.strip().casefold()


class ClusterNames:
    """Which hot clusters bear each name, by scope (issue 26): a plan's names are checked
    against every other cluster's on the writer, a pass over 11k clusters (three in a
    session's apply, ~25 ms at 100k memories); this table answers from the names the plan
    uses, and a published change updates the clusters it changed only."""

    def __init__(self, clusters: Mapping[str, Cluster]) -> None:
        self._key: dict[str, tuple[str, str]] = {}  # cluster id -> its name key
        self._ids: dict[tuple[str, str], set[str]] = {}  # name key -> the clusters bearing it
        self._shared: set[tuple[str, str]] = set()  # keys borne by more than one cluster
        self._bare: dict[str, set[str]] = {}  # casefolded name -> the clusters, any scope
        for c in clusters.values():
            self._add(c)

    def __len__(self) -> int:
        return len(self._key)

    def _add(self, c: Cluster) -> None:
        key = name_key(c.scope, c.name)
        self._key[c.id] = key
        ids = self._ids.setdefault(key, set())
        ids.add(c.id)
        if len(ids) > 1:
            self._shared.add(key)
        self._bare.setdefault(key[1], set()).add(c.id)

    def _remove(self, cid: str) -> None:
        key = self._key.pop(cid, None)
        if key is None:
            return
        ids = self._ids[key]
        ids.discard(cid)
        if len(ids) < 2:
            self._shared.discard(key)
        if not ids:
            del self._ids[key]
        bare = self._bare[key[1]]
        bare.discard(cid)
        if not bare:
            del self._bare[key[1]]

    def changed(self, removed: Iterable[str], upserted: Iterable[Cluster]) -> None:
        for cid in removed:
            self._remove(cid)
        for c in upserted:
            self._remove(c.id)
            self._add(c)

    def bearing(self, scope: str, name: str) -> set[str]:
        """The clusters named `name` in `scope` (a new set)."""
        return set(self._ids.get(name_key(scope, name), ()))

    def in_any_scope(self, name: str) -> set[str]:
        """The clusters named `name` in any scope (a new set)."""
        return set(self._bare.get(name.strip().casefold(), ()))

    def shared(self) -> dict[tuple[str, str], set[str]]:
        """Every name key more than one cluster bears, with those clusters."""
        return {key: set(self._ids[key]) for key in self._shared}
