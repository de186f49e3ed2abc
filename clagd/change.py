"""The one change to an index snapshot, and the one way it is published.

`IndexChange` is what the writer did, as `Index.apply` takes it. The writer makes it (in
`store.changes.StoreChange`), the engine makes its next snapshot with it, and every copy of
the index (a query process) applies the same object to its own snapshot, so it is small,
immutable and picklable: the clusters that were written whole, the ids that went, the
unsorted memories that came and went. `build` means "the whole store, taken in from
outside" (a reload): the snapshot is then built afresh from `upsert_clusters` and
`add_unsorted`. It lives in the core, beside `model`, because both `store/` (which makes
it) and `retrieval/` (which applies it) take it and neither may import the other.

`Publisher` is the one interface a change goes through, in two phases, at every hop (the
writer to the engine, the engine to the query processes): `prepare(change)` while git
builds the commit (the next snapshot is made beside it, never served yet), returning what
it made; then, once the commit exists, `publish(change, prepared)` with exactly that (None:
nothing was prepared, or the change was made again: do it all now). A commit that fails is
never published: what was prepared for it is dropped with it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from clagd.model import Cluster, Memory


@dataclass(frozen=True)
class IndexChange:
    """One change to an index snapshot (see the module docstring). The fields take any
    iterable and keep a tuple of it."""

    build: bool = False
    upsert_clusters: tuple[Cluster, ...] = ()
    remove_clusters: tuple[str, ...] = ()
    add_unsorted: tuple[Memory, ...] = ()
    remove_unsorted: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("upsert_clusters", "remove_clusters", "add_unsorted", "remove_unsorted"):
            value = getattr(self, name)
            if not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))

    @classmethod
    def whole(cls, clusters: Iterable[Cluster], unsorted: Iterable[Memory]) -> IndexChange:
        """The whole store, taken in from outside: a snapshot built afresh from these."""
        return cls(True, tuple(clusters), (), tuple(unsorted))

    @property
    def empty(self) -> bool:
        """Nothing changes (a `build` is never empty: it replaces the snapshot)."""
        return not (
            self.build
            or self.upsert_clusters
            or self.remove_clusters
            or self.add_unsorted
            or self.remove_unsorted
        )


C = TypeVar("C", contravariant=True)
P = TypeVar("P")


class Publisher(Protocol[C, P]):
    """Where a change goes, in two phases (see the module docstring): `prepare` may make
    the next snapshot (it must not touch git or the files), `publish` serves it."""

    def prepare(self, change: C) -> P | None: ...

    def publish(self, change: C, prepared: P | None) -> None: ...
