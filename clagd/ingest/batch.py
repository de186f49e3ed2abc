"""Turning validated items into stored memories: dedupe by content hash, route fast to a
cluster or to a new unsorted shard, one commit per batch. Runs on the writer thread."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from clagd.ingest import supersede
from clagd.ingest.inbox import Item
from clagd.model import SUPERSEDED_BY, Memory, memory_id, new_id, normalized_id, now_iso
from clagd.scopes import scopes_trailer
from clagd.store.files import new_shard_name
from clagd.store.writer import WriteContext


@dataclass
class IngestResult:
    batch: str
    added: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    routed: dict[str, int] = field(default_factory=dict)
    unsorted: int = 0
    commit: str | None = None
    files: int = 0
    shard: str | None = None  # the unsorted shard this batch created, if any
    deferred: bool = False  # too large to route in its own commit: routed by a route pass
    supersedes: dict[str, str] = field(default_factory=dict)  # new id -> the older it hides

    def to_dict(self) -> dict:
        return {
            "batch": self.batch,
            "added": len(self.added),
            "ids": self.added,
            "duplicates": len(self.duplicates),
            "duplicate_ids": self.duplicates,
            "routed": sum(self.routed.values()),
            "unsorted": self.unsorted,
            "commit": self.commit,
            "files": self.files,
            "route_deferred": self.deferred,
            "supersedes": dict(self.supersedes),
        }


def new_batch_id() -> str:
    return new_id("b-")


def ingest_items(
    ctx: WriteContext,
    items: list[Item],
    route: Callable[[list[Memory]], Sequence[str | None]],
    source: str,
    files: int = 0,
    known: set[str] | None = None,
    blocked: set[str] | None = None,
    route_limit: int | None = None,
    find_superseded: Callable[[list[Memory]], dict[str, Memory]] | None = None,
    max_size: int | None = None,
) -> IngestResult:
    """Add the items that are new; return what happened. `route` is a batch router: it
    gets every new memory of the batch at once and returns a cluster id (or None: the
    unsorted area) for each, in order. `known` is the set of memory ids and content hashes
    already stored (kept by the engine so this is not O(store)). `blocked` clusters have a
    broken hand edit on disk: nothing is routed into them (their file is not rewritten).

    A batch of more than `route_limit` new memories is not routed here: it is committed as
    one unsorted shard (one file, whatever the batch size), and `route_shards` moves its
    memories into their clusters later, in one commit for many batches. A cluster that
    holds `max_size` memories takes no more (they stay unsorted for a session)."""
    res = IngestResult(batch=new_batch_id(), files=files)
    keys = known if known is not None else ctx.state.content_keys()
    fresh: list[Memory] = []
    stamp = now_iso()
    batch_keys: set[str] = set()
    for it in items:
        mid = (
            normalized_id(it.content, it.scope)
            if it.normalized
            else memory_id(it.content, it.scope)
        )
        if mid in keys or mid in batch_keys:
            res.duplicates.append(mid)
            continue
        batch_keys.add(mid)
        fresh.append(Memory(mid, it.content, it.created_at or stamp, dict(it.metadata), it.scope))
    if not fresh:
        return res
    res.deferred = route_limit is not None and len(fresh) > route_limit
    if res.deferred:
        shard = fresh
    else:
        if find_superseded is not None:
            fresh = _supersede(ctx, fresh, find_superseded(fresh), res)
        res.routed, shard = _route_into_clusters(ctx, fresh, route, blocked, stamp, max_size)
    if shard:
        name = new_shard_name()
        while name in ctx.state.unsorted:
            name = new_shard_name()
        ctx.touch_shard(name)
        ctx.state.unsorted[name] = shard
        res.unsorted = len(shard)
        res.shard = name
    res.added = [m.id for m in fresh]
    body_lines = [f"- {m.id}: {m.content[:72]}" for m in fresh[:20]]
    if len(fresh) > 20:
        body_lines.append(f"- ... and {len(fresh) - 20} more")
    body_lines += [f"- {new} supersedes {old}" for new, old in list(res.supersedes.items())[:20]]
    res.commit = ctx.commit(
        f"ingest: {len(fresh)} memor{'y' if len(fresh) == 1 else 'ies'} from {source}",
        "\n".join(body_lines),
        {
            "kind": "ingest",
            "batch": res.batch,
            "source": source,
            "added": len(fresh),
            "duplicates": len(res.duplicates),
            "routed": sum(res.routed.values()),
            "unsorted": res.unsorted,
            **({"route": "deferred"} if res.deferred else {}),
            **({"supersedes": len(res.supersedes)} if res.supersedes else {}),
            **scopes_trailer(m.scope for m in fresh),
        },
    )
    if keys is known:
        keys.update(res.added)
    return res


def _supersede(
    ctx: WriteContext, fresh: list[Memory], found: dict[str, Memory], res: IngestResult
) -> list[Memory]:
    """Link each new memory to the older one it restates (when it is not older itself):
    a stored one where it lives, or one earlier in this batch."""
    if not found:
        return fresh
    out: list[Memory] = []
    at: dict[str, int] = {}
    for m in fresh:
        old = found.get(m.id)
        if old is not None and supersede.newer_first(m, old)[0] is m:
            if old.id in at:
                out[at[old.id]] = supersede.with_meta(out[at[old.id]], SUPERSEDED_BY, m.id)
            elif not supersede.link(ctx, old.id, m.id):
                old = None
            if old is not None:
                m = supersede.successor(m, old.id)
                res.supersedes[m.id] = old.id
        at[m.id] = len(out)
        out.append(m)
    return out


def _route_into_clusters(
    ctx: WriteContext,
    mems: list[Memory],
    route: Callable[[list[Memory]], Sequence[str | None]],
    blocked: set[str] | None,
    stamp: str,
    max_size: int | None = None,
) -> tuple[dict[str, int], list[Memory]]:
    """Append each memory with a strong match to that cluster (never to a `blocked` one,
    never to a cluster of another scope, nor to one that holds `max_size` memories
    already: `session.max_cluster_size` bounds what routing makes). Returns how many went
    into each cluster, and the memories that stay unsorted."""
    targets = route(mems)
    if len(targets) != len(mems):
        raise ValueError(f"the router gave {len(targets)} answers for {len(mems)} memories")
    per_cluster: dict[str, int] = {}
    left: list[Memory] = []
    for m, cid in zip(mems, targets):
        cluster = ctx.state.clusters.get(cid) if cid and cid not in (blocked or ()) else None
        if (
            cluster is None
            or cluster.scope != m.scope
            or (max_size is not None and len(cluster.memories) >= max_size)
        ):
            left.append(m)
            continue
        ctx.touch_cluster(cluster.id)  # before the state changes: a failure puts it back
        cluster.memories.append(m)
        cluster.updated_at = stamp
        per_cluster[cluster.id] = per_cluster.get(cluster.id, 0) + 1
    return per_cluster, left


@dataclass
class RouteResult:
    routed: int = 0
    clusters: int = 0
    shards: int = 0
    commit: str | None = None
    more: bool = False  # memories with a match left for the next slice (`max_clusters`)

    def to_dict(self) -> dict:
        return {
            "routed": self.routed,
            "clusters": self.clusters,
            "shards": self.shards,
            "commit": self.commit,
        }


def route_shards(
    ctx: WriteContext,
    shards: list[str],
    route: Callable[[list[Memory]], Sequence[str | None]],
    blocked: set[str] | None = None,
    max_size: int | None = None,
    max_clusters: int | None = None,
) -> RouteResult:
    """The route pass: every memory still in these unsorted shards that has a strong match
    goes into that cluster (while it holds fewer than `max_size`); the rest stays where it
    is. One commit (kind `route`) for all, touching at most `max_clusters` cluster files: the
    memories bound for others wait for the next slice (`more`), so one pass never holds the
    writer for the whole burst (issue 26)."""
    res = RouteResult()
    names = [n for n in dict.fromkeys(shards) if ctx.state.unsorted.get(n)]
    mems = [m for n in names for m in ctx.state.unsorted[n]]
    if not mems:
        return res

    def capped(ms: list[Memory]) -> Sequence[str | None]:
        targets = list(route(ms))
        if max_clusters is None:
            return targets
        seen: set[str] = set()
        for i, cid in enumerate(targets):
            if cid is not None and cid not in seen:
                if len(seen) >= max_clusters:
                    targets[i] = None
                    res.more = True
                    continue
                seen.add(cid)
        return targets

    per_cluster, left = _route_into_clusters(ctx, mems, capped, blocked, now_iso(), max_size)
    if not per_cluster:
        return res
    moved = {m.id for m in mems} - {m.id for m in left}
    for n in names:
        if any(m.id in moved for m in ctx.state.unsorted[n]):
            ctx.touch_shard(n)
            ctx.state.unsorted[n] = [m for m in ctx.state.unsorted[n] if m.id not in moved]
            res.shards += 1
    res.routed, res.clusters = len(moved), len(per_cluster)
    top = sorted(per_cluster.items(), key=lambda kv: -kv[1])[:20]
    body = [f"- {cid} ({ctx.state.clusters[cid].name}): +{n}" for cid, n in top]
    if len(per_cluster) > 20:
        body.append(f"- ... and {len(per_cluster) - 20} more clusters")
    res.commit = ctx.commit(
        f"route: {res.routed} memor{'y' if res.routed == 1 else 'ies'} into "
        f"{res.clusters} cluster{'' if res.clusters == 1 else 's'}",
        "\n".join(body),
        {"kind": "route", "routed": res.routed, "clusters": res.clusters, "shards": res.shards},
    )
    return res
