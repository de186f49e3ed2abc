"""What one commit (or one reload) changed: the index's change, and what only the engine
needs besides. The writer makes a `StoreChange` and hands it to its publisher (the
engine), in the two phases of `clagd.change.Publisher`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from clagd.change import IndexChange
from clagd.model import Memory
from clagd.store.files import ARCHIVE, CLUSTERS, UNSORTED, StoreState, read_files

DATA_DIRS = (CLUSTERS, ARCHIVE, UNSORTED)


@dataclass(frozen=True)
class StoreChange:
    """What one commit changed: `index`, the change every copy of the index applies (a
    whole one, `index.build`, when the store was read again from scratch); whether the
    archive changed; the commit (None: not committed yet, or nothing to commit); and
    `reloaded`: taken in from outside (the set of stored ids may have shrunk)."""

    index: IndexChange = field(default_factory=IndexChange)
    archive_changed: bool = False
    commit: str | None = None
    reloaded: bool = False
    # the archived clusters it wrote or removed (empty with `archive_changed`: unknown)
    archive_ids: tuple[str, ...] = ()

    @classmethod
    def whole(cls, state: StoreState, commit: str | None) -> StoreChange:
        """The whole store in `state`, read again from scratch (at `commit`)."""
        index = IndexChange.whole(state.clusters.values(), state.unsorted_memories())
        return cls(index, commit=commit)

    @property
    def empty(self) -> bool:
        return self.index.empty and not (self.reloaded or self.archive_changed or self.commit)


def unsorted_change(
    before: Mapping[str, Memory], after: list[Memory], added: list[Memory], removed: list[str]
) -> None:
    """The memories of one shard (`before`: by id) that came or changed (a memory marked
    superseded is a changed copy: onto `added`) and went (onto `removed`, sorted)."""
    added.extend(m for m in after if before.get(m.id) != m)
    removed.extend(sorted(before.keys() - {m.id for m in after}))


def read_changes(
    root: Path, base: StoreState, rel_paths: list[str], texts: dict[str, str] | None = None
) -> tuple[StoreState, StoreChange]:
    """`read_files`, plus the change that takes `base` to the new state. `texts`: the files
    as a commit holds them, instead of the working tree (see `parse_files`)."""
    state, upd = read_files(root, base, rel_paths, texts)
    added: list[Memory] = []
    removed: list[str] = []
    for name in upd.shards:
        before = {m.id: m for m in base.unsorted.get(name, [])}
        unsorted_change(before, state.unsorted.get(name, []), added, removed)
    index = IndexChange(
        upsert_clusters=tuple(c for c in upd.clusters.values() if c is not None),
        remove_clusters=tuple(cid for cid, c in upd.clusters.items() if c is None),
        add_unsorted=tuple(added),
        remove_unsorted=tuple(removed),
    )
    return state, StoreChange(
        index, archive_changed=bool(upd.archive), archive_ids=tuple(sorted(upd.archive))
    )
