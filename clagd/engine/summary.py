"""What `status` and `clusters` report, computed from the state once per change (on the
writer thread) so that those reads never walk the store."""

from __future__ import annotations

from collections.abc import Mapping

from clagd.engine.results import ClusterInfo, Counts
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
)


def new_counters() -> dict[str, int]:
    return dict.fromkeys(COUNTERS, 0)


def summarize(state: StoreState) -> list[ClusterInfo]:
    """One entry per hot and archived cluster: what `clusters` lists, without memories (and
    without access statistics, added when it is asked)."""
    return [
        ClusterInfo.of(c, archived)
        for archived, area in ((False, state.clusters), (True, state.archived))
        for c in area.values()
    ]


def counts(
    summaries: list[ClusterInfo], memories: int, unsorted: Mapping[str, int] | None = None
) -> Counts:
    """The `counts` section of `status`; `memories`: how many the index holds (hot);
    `unsorted`: the index's unsorted memories per scope (for the per-scope counts)."""
    hot = sum(c.size for c in summaries if not c.archived)
    return Counts(
        memories,
        sum(1 for c in summaries if not c.archived),
        sum(1 for c in summaries if c.archived),
        sum(c.size for c in summaries if c.archived),
        memories - hot,
        scope_counts(summaries, unsorted or {}),
    )


def scope_counts(
    summaries: list[ClusterInfo], unsorted: Mapping[str, int]
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
