"""What `status` and `clusters` report, computed from the state once per change (on the
writer thread) so that those reads never walk the store."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from clagd.engine.results import ClusterInfo, Counts
from clagd.model import Cluster
from clagd.scopes import check_scope
from clagd.store.changes import StoreChange
from clagd.store.files import StoreState

# the event counters `status` shows (Engine.counters), all starting at 0
COUNTERS = (
    "queries",
    "added",
    "duplicates",
    "ingest_batches",
    "ingest_failures",
    "superseded",
    "sessions",
    "sessions_accepted",
    "sessions_rolled_back",
    "sessions_fallback",
    "sessions_failed",
    "archived",
    "thawed",
    "reverts",
    "forgotten",
    "outside_edits",
    "outside_edit_errors",
    "routed",
    "route_passes",
    "route_failures",
    "named",  # clusters whose profile a model wrote (the gate let it name, not group)
    "naming_asked",  # clusters a model was asked to name
    "naming_rejected",  # ... whose answer was not used (the last session's reasons say why)
)


def new_counters() -> dict[str, int]:
    return dict.fromkeys(COUNTERS, 0)


def summarize(state: StoreState) -> dict[str, ClusterInfo]:
    """One entry per hot and archived cluster (by id): what `clusters` lists, without
    memories (and without access statistics, added when it is asked)."""
    return {
        c.id: ClusterInfo.of(c, archived)
        for archived, area in ((False, state.clusters), (True, state.archived))
        for c in area.values()
    }


def after(
    summaries: dict[str, ClusterInfo], state: StoreState, change: StoreChange
) -> dict[str, ClusterInfo]:
    """The summaries once `change` is published: all made again after a reload (or an
    archive change that does not say which clusters), only the changed clusters'
    otherwise."""
    idx = change.index
    if idx.build or (change.archive_changed and not change.archive_ids):
        return summarize(state)
    if idx.upsert_clusters or idx.remove_clusters or change.archive_ids:
        out = refreshed(summaries, idx.upsert_clusters, idx.remove_clusters)
        for cid in change.archive_ids:
            c = state.archived.get(cid)
            if c is not None:
                out[cid] = ClusterInfo.of(c, True)
            elif out.get(cid) is not None and out[cid].archived:
                del out[cid]
        return out
    return summaries


def refreshed(
    summaries: dict[str, ClusterInfo], upsert: Iterable[Cluster], remove: Iterable[str]
) -> dict[str, ClusterInfo]:
    """`summaries` after a change to these hot clusters only: a new dict (readers iterate
    the old one meanwhile), the entries of the others as they were (issue 26: every
    commit summarized every cluster again, ~50 ms at 4,500 clusters)."""
    out = dict(summaries)
    for cid in remove:
        out.pop(cid, None)
    for c in upsert:
        out[c.id] = ClusterInfo.of(c, False)
    return out


def counts(
    summaries: Collection[ClusterInfo],
    memories: int,
    unsorted: Mapping[str, int] | None = None,
    scope: str | None = None,
) -> Counts:
    """The `counts` section of `status`; `memories`: how many the index holds (hot);
    `unsorted`: the index's unsorted memories per scope (for the per-scope counts);
    `scope`: that scope's counts only (`scope_only`)."""
    if scope is not None:
        return scope_only(summaries, unsorted or {}, check_scope(scope))
    hot = sum(c.size for c in summaries if not c.archived)
    return Counts(
        memories,
        sum(1 for c in summaries if not c.archived),
        sum(1 for c in summaries if c.archived),
        sum(c.size for c in summaries if c.archived),
        memories - hot,
        scope_counts(summaries, unsorted or {}),
    )


class CountsMemo:
    """`counts`, made again only when the summaries (a new dict at each change), the
    index's size, its unsorted counts or the scope asked for differ from the last call:
    clients poll `status` (a benchmark waiting for a route pass every 20 ms), and walking
    11k clusters' summaries took ~5 ms of the daemon's GIL a call. One per engine."""

    def __init__(self) -> None:
        self._last: tuple[object, tuple, Counts] | None = None

    def get(
        self,
        summaries: Mapping[str, ClusterInfo],
        memories: int,
        unsorted: Mapping[str, int],
        scope: str | None,
    ) -> Counts:
        key = (memories, tuple(sorted(unsorted.items())), scope)
        last = self._last
        if last is not None and last[0] is summaries and last[1] == key:
            return last[2]
        out = counts(summaries.values(), memories, unsorted, scope)
        self._last = (summaries, key, out)
        return out


def scope_only(
    summaries: Collection[ClusterInfo], unsorted: Mapping[str, int], scope: str
) -> Counts:
    """`status --scope`: the counts of `scope`'s memories and clusters alone."""
    mine = [c for c in summaries if c.scope == scope]
    loose = unsorted.get(scope, 0)
    return Counts(
        sum(c.size for c in mine if not c.archived) + loose,
        sum(1 for c in mine if not c.archived),
        sum(1 for c in mine if c.archived),
        sum(c.size for c in mine if c.archived),
        loose,
        scope_counts(mine, {scope: loose}),
        scope,
    )


def scope_counts(
    summaries: Collection[ClusterInfo], unsorted: Mapping[str, int]
) -> dict[str, dict[str, int]]:
    """Per scope: hot memories, hot clusters, archived memories, unsorted memories."""
    out: dict[str, dict[str, int]] = {}

    def row(scope: str) -> dict[str, int]:
        return out.setdefault(
            scope, {"memories": 0, "clusters": 0, "archived_memories": 0, "unsorted": 0}
        )

    for c in summaries:
        r = row(c.scope)
        if c.archived:
            r["archived_memories"] += c.size
        else:
            r["memories"] += c.size
            r["clusters"] += 1
    for scope, n in unsorted.items():
        r = row(scope)
        r["memories"] += n
        r["unsorted"] += n
    return dict(sorted(out.items()))
