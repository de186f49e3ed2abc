"""The archive: clusters nobody has read for `archive.cold_after_days` move from
`clusters/` to `archive/` (`ARCHIVE_SLICE` clusters a commit, writes running between the
slices: the cold ones are found off the writer, on the committed copies of the hot
clusters), and come back ("thaw") when a query that includes
the archive hits them. Pinned and small clusters stay hot.

The functions here are writer operations' bodies: they run on the writer thread with its
`WriteContext` and return what the socket reply shows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from clagd.config import ArchiveConfig
from clagd.engine.requests import ArchiveRun
from clagd.engine.results import Archived, Thawed
from clagd.engine.stats import AccessStats
from clagd.model import Cluster, parse_epoch
from clagd.scopes import scopes_trailer
from clagd.store.files import StoreState
from clagd.store.writer import WriteContext

# clusters one archive commit moves at most (issue 26: one commit for every cold cluster
# held the writer in proportion to the store). An `add` that meets a slice waits for all
# of it: at 11k clusters 50 held the writer 90-106 ms, 20 holds it 58-66 (the job is
# daily; it takes twice the commits)
ARCHIVE_SLICE = 20


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
    return sorted(c.id for c in state.clusters.values() if is_cold(c, stats, cfg, now, scope))


def is_cold(
    c: Cluster, stats: AccessStats, cfg: ArchiveConfig, now: float, scope: str | None
) -> bool:
    """Whether this hot cluster (of `scope`, when given) is due for the archive."""
    if c.pinned or len(c.memories) < cfg.min_size or scope not in (None, c.scope):
        return False
    _count, last = stats.cluster(c.id)
    if last is None:
        # never read since the statistics began: as cold as its last change or their
        # start, whichever is later (lost statistics are "unknown", not "cold")
        changed = max(parse_epoch(c.updated_at) or 0.0, parse_epoch(c.created_at) or 0.0)
        last = max(changed, stats.since)
    return now - last >= cfg.cold_after_days * 86400


def still_cold(
    state: StoreState,
    stats: AccessStats,
    cfg: ArchiveConfig,
    cids: Iterable[str],
    now: float | None = None,
    scope: str | None = None,
) -> list[str]:
    """Of `cids` (found cold on a snapshot, off the writer), the ones still hot and cold
    now: one slice's work, in proportion to the slice, not the store."""
    now = time.time() if now is None else now
    hot = state.clusters
    return sorted(cid for cid in cids if cid in hot and is_cold(hot[cid], stats, cfg, now, scope))


def archive_cold(
    ctx: WriteContext,
    stats: AccessStats,
    cfg: ArchiveConfig,
    dry_run: bool,
    now: float | None,
    scope: str | None = None,
    only: Iterable[str] | None = None,
) -> Archived:
    """Move the cold clusters (of `scope`, when given; of `only`, when given: one slice)
    to the archive in one commit (or only list them)."""
    if only is None:
        cold = cold_clusters(ctx.state, stats, cfg, now, scope)
    else:
        cold = still_cold(ctx.state, stats, cfg, only, now, scope)
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


def _hot_op(ctx: WriteContext) -> dict[str, Cluster]:
    return ctx.hot_clusters()


def archive_slices(
    call: Callable[..., Any],
    op: Callable[[WriteContext, ArchiveRun], Archived],
    stats: AccessStats,
    cfg: ArchiveConfig,
    run: ArchiveRun,
) -> Archived:
    """The archive job (`call`: the writer's): the cold clusters found on the committed
    copies of the hot ones (one dict copy on the writer, the scan off it), then moved
    `ARCHIVE_SLICE` at a time, each slice one writer operation `op` (which checks them
    again and commits them), the writes queued meanwhile running between the slices.
    Always at least one `op`: a write waits for the person's staged changes, even when
    nothing is cold. The reply names every cluster moved and the last commit."""
    hot: dict[str, Cluster] = call(_hot_op)
    cold = cold_clusters(StoreState(hot), stats, cfg, run.now, run.scope)
    parts = [cold[i : i + ARCHIVE_SLICE] for i in range(0, len(cold), ARCHIVE_SLICE)] or [[]]
    done: list[str] = []
    names: list[str] = []
    sha = None
    for part in parts:
        out: Archived = call(op, replace(run, clusters=tuple(part)))
        done += out.clusters
        names += out.names
        sha = out.commit or sha
    return Archived(run.dry_run, tuple(done), tuple(names), sha)


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
