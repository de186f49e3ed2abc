"""Turning validated items into stored memories: dedupe by content hash, route fast to a
cluster or to a new unsorted shard, one commit per batch. Runs on the writer thread."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .inbox import Item
from .model import Memory, memory_id, now_iso
from .store import new_shard_name
from .writer import WriteContext


@dataclass
class IngestResult:
    batch: str
    added: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    routed: dict[str, int] = field(default_factory=dict)
    unsorted: int = 0
    commit: str | None = None
    files: int = 0

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
        }


def new_batch_id() -> str:
    return "b-" + secrets.token_hex(4)


def ingest_items(
    ctx: WriteContext,
    items: list[Item],
    route: Callable[[list[Memory]], Sequence[str | None]],
    source: str,
    files: int = 0,
    known: set[str] | None = None,
    blocked: set[str] | None = None,
) -> IngestResult:
    """Add the items that are new; return what happened. `route` is a batch router: it
    gets every new memory of the batch at once and returns a cluster id (or None: the
    unsorted area) for each, in order. `known` is the set of memory ids and content hashes
    already stored (kept by the engine so this is not O(store)). `blocked` clusters have a
    broken hand edit on disk: nothing is routed into them (their file is not rewritten)."""
    res = IngestResult(batch=new_batch_id(), files=files)
    keys = known if known is not None else ctx.state.content_keys()
    fresh: list[Memory] = []
    stamp = now_iso()
    batch_keys: set[str] = set()
    for it in items:
        mid = memory_id(it.content)
        if mid in keys or mid in batch_keys:
            res.duplicates.append(mid)
            continue
        batch_keys.add(mid)
        fresh.append(Memory(mid, it.content, it.created_at or stamp, dict(it.metadata)))
    if not fresh:
        return res
    shard: list[Memory] = []
    targets = route(fresh)
    if len(targets) != len(fresh):
        raise ValueError(f"the router gave {len(targets)} answers for {len(fresh)} memories")
    for m, cid in zip(fresh, targets):
        cluster = ctx.state.clusters.get(cid) if cid and cid not in (blocked or ()) else None
        if cluster is not None:
            ctx.touch_cluster(cluster.id)
            cluster.memories.append(m)
            cluster.updated_at = stamp
            res.routed[cluster.id] = res.routed.get(cluster.id, 0) + 1
        else:
            shard.append(m)
    if shard:
        name = new_shard_name()
        while name in ctx.state.unsorted:
            name = new_shard_name()
        ctx.touch_shard(name)
        ctx.state.unsorted[name] = shard
        res.unsorted = len(shard)
    res.added = [m.id for m in fresh]
    body_lines = [f"- {m.id}: {m.content[:72]}" for m in fresh[:20]]
    if len(fresh) > 20:
        body_lines.append(f"- ... and {len(fresh) - 20} more")
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
        },
    )
    if keys is known:
        keys.update(res.added)
    return res
