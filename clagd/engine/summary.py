"""What `status` and `clusters` report, computed from the state once per change (on the
writer thread) so that those reads never walk the store."""

from __future__ import annotations

from typing import Any

from clagd.store.files import StoreState

# the event counters `status` shows (Engine.counters), all starting at 0
COUNTERS = (
    "queries",
    "added",
    "duplicates",
    "ingest_batches",
    "ingest_failures",
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


def summarize(state: StoreState) -> list[dict[str, Any]]:
    """One entry per hot and archived cluster: what `clusters` lists, without memories."""
    out = []
    for archived, area in ((False, state.clusters), (True, state.archived)):
        for c in area.values():
            out.append(
                {
                    "id": c.id,
                    "name": c.name,
                    "description": c.description,
                    "tags": list(c.tags),
                    "size": len(c.memories),
                    "archived": archived,
                    "pinned": c.pinned,
                    "created_at": c.created_at,
                    "updated_at": c.updated_at,
                }
            )
    return out


def counts(summaries: list[dict[str, Any]], memories: int) -> dict[str, int]:
    """The `counts` section of `status`; `memories`: how many the index holds (hot)."""
    hot = sum(c["size"] for c in summaries if not c["archived"])
    return {
        "memories": memories,
        "clusters": sum(1 for c in summaries if not c["archived"]),
        "archived_clusters": sum(1 for c in summaries if c["archived"]),
        "archived_memories": sum(c["size"] for c in summaries if c["archived"]),
        "unsorted": memories - hot,
    }
