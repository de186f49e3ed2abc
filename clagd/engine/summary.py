"""What `status` and `clusters` report, computed from the state once per change (on the
writer thread) so that those reads never walk the store."""

from __future__ import annotations

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


def counts(summaries: list[ClusterInfo], memories: int) -> Counts:
    """The `counts` section of `status`; `memories`: how many the index holds (hot)."""
    hot = sum(c.size for c in summaries if not c.archived)
    return Counts(
        memories,
        sum(1 for c in summaries if not c.archived),
        sum(1 for c in summaries if c.archived),
        sum(c.size for c in summaries if c.archived),
        memories - hot,
    )
