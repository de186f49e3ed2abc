"""What one commit (or one reload) changed, in the terms the index needs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from clagd.model import Cluster, Memory
from clagd.store.files import ARCHIVE, CLUSTERS, UNSORTED, StoreState, read_files

DATA_DIRS = (CLUSTERS, ARCHIVE, UNSORTED)


@dataclass
class Changes:
    """What one commit changed, in the terms the index needs."""

    upsert_clusters: list[Cluster] = field(default_factory=list)
    remove_clusters: list[str] = field(default_factory=list)
    add_unsorted: list[Memory] = field(default_factory=list)
    remove_unsorted: list[str] = field(default_factory=list)
    archive_changed: bool = False
    full: bool = False
    commit: str | None = None
    reloaded: bool = False  # taken in from outside (the set of stored ids may have shrunk)

    @property
    def empty(self) -> bool:
        return not (
            self.reloaded
            or self.upsert_clusters
            or self.remove_clusters
            or self.add_unsorted
            or self.remove_unsorted
            or self.archive_changed
            or self.full
            or self.commit
        )


def read_changes(
    root: Path, base: StoreState, rel_paths: list[str], texts: dict[str, str] | None = None
) -> tuple[StoreState, Changes]:
    """`read_files`, plus the index changes that take `base` to the new state. `texts`: the
    files as a commit holds them, instead of the working tree (see `parse_files`)."""
    state, upd = read_files(root, base, rel_paths, texts)
    changes = Changes(archive_changed=bool(upd.archive))
    for cid, c in upd.clusters.items():
        if c is None:
            changes.remove_clusters.append(cid)
        else:
            changes.upsert_clusters.append(c)
    for name in upd.shards:
        before = {m.id for m in base.unsorted.get(name, [])}
        after_list = state.unsorted.get(name, [])
        after = {m.id for m in after_list}
        changes.add_unsorted.extend(m for m in after_list if m.id not in before)
        changes.remove_unsorted.extend(sorted(before - after))
    return state, changes
