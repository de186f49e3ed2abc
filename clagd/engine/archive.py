"""The archive: clusters nobody has read for `archive.cold_after_days` move from
`clusters/` to `archive/` (one commit), and come back ("thaw") when a query that includes
the archive hits them. Pinned and small clusters stay hot.

The functions here are writer operations' bodies: they run on the writer thread with its
`WriteContext` and return what the socket reply shows.
"""

from __future__ import annotations

import time

from clagd.config import ArchiveConfig
from clagd.engine.results import Archived, Thawed
from clagd.engine.stats import AccessStats
from clagd.model import parse_epoch
from clagd.scopes import scopes_trailer
from clagd.store.files import StoreState
from clagd.store.writer import WriteContext


def cold_clusters(
    state: StoreState,
    stats: AccessStats,
    cfg: ArchiveConfig,
    now: float | None = None,
    scope: str | None = None,
) -> list[str]:
    """The ids of the hot clusters (of `scope`, when given) due for the archive: last read
    (or, never read, last changed) at least `cold_after_days` ago."""
    now = time.time() if now is None else now
    cold = []
    for c in state.clusters.values():
        if c.pinned or len(c.memories) < cfg.min_size or scope not in (None, c.scope):
            continue
        _count, last = stats.cluster(c.id)
        if last is None:
            # never read since the statistics began: as cold as its last change or their
            # start, whichever is later (lost statistics are "unknown", not "cold")
            changed = max(parse_epoch(c.updated_at) or 0.0, parse_epoch(c.created_at) or 0.0)
            last = max(changed, stats.since)
        if now - last >= cfg.cold_after_days * 86400:
            cold.append(c.id)
    return sorted(cold)


def archive_cold(
    ctx: WriteContext,
    stats: AccessStats,
    cfg: ArchiveConfig,
    dry_run: bool,
    now: float | None,
    scope: str | None = None,
) -> Archived:
    """Move the cold clusters (of `scope`, when given) to the archive in one commit (or
    only list them)."""
    cold = cold_clusters(ctx.state, stats, cfg, now, scope)
    names = tuple(ctx.state.clusters[c].name for c in cold)
    if dry_run or not cold:
        return Archived(dry_run, tuple(cold), names, None)
    for cid in cold:
        ctx.touch_cluster(cid)
        ctx.touch_archive(cid)
        ctx.state.archived[cid] = ctx.state.clusters.pop(cid)
    scopes = sorted({ctx.state.archived[cid].scope for cid in cold})
    sha = ctx.commit(
        f"archive: {len(cold)} cold cluster(s)",
        "\n".join(f"- {cid}: {n}" for cid, n in zip(cold, names)),
        {"kind": "archive", "clusters": len(cold), **scopes_trailer(scopes)},
    )
    return Archived(False, tuple(cold), names, sha)


def thaw(ctx: WriteContext, stats: AccessStats, cids: list[str]) -> Thawed:
    """Bring archived clusters back to `clusters/` in one commit; ids no longer archived
    (thawed by an earlier query) are skipped."""
    cids = [c for c in cids if c in ctx.state.archived]
    if not cids:
        return Thawed((), None)
    for cid in cids:
        ctx.touch_cluster(cid)
        ctx.touch_archive(cid)
        ctx.state.clusters[cid] = ctx.state.archived.pop(cid)
        stats.touch_cluster(cid)  # just used: not cold again at the next archive run
    sha = ctx.commit(
        f"thaw: {len(cids)} cluster(s) back from the archive",
        "\n".join(f"- {c}: {ctx.state.clusters[c].name}" for c in cids),
        {"kind": "thaw", "clusters": len(cids)},
    )
    return Thawed(tuple(cids), sha)
