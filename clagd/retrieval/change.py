"""The one change to an index snapshot: what the writer did, as `Index.apply` takes it.

The same object goes from the engine (which makes its next snapshot with it) to every copy
of the index (a query process applies it to its own snapshot), so it is small, immutable
and picklable: the clusters that were written whole, the ids that went, the unsorted
memories that came and went. `build` means "the whole store, taken in from outside" (a
reload): the snapshot is then built afresh from `upsert_clusters` and `add_unsorted`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

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
