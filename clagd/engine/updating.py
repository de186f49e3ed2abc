"""`update`: a new memory that supersedes an older one (`clagd update ID TEXT`).

The new memory takes the old one's place (its cluster, or the unsorted area), its scope
(an update names the old memory's scope: another scope's memory is not found)
and its metadata (what the update gives replaces keys of it); the old one stays in the
store and in git, marked `metadata.superseded_by`, and the new one names it in
`metadata.supersedes` (linked both ways, `ingest.supersede`). Queries leave the old one
out unless they ask for superseded memories. One commit of kind `update`. Runs on the
writer thread.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from clagd.errors import BadRequest, Conflict, NotFound
from clagd.ingest import supersede
from clagd.ingest.inbox import Item
from clagd.model import LINK_KEYS, MEMORY_ID_RE, SUPERSEDES, memory_id, now_iso
from clagd.store.files import new_shard_name
from clagd.store.writer import WriteContext

# metadata of the old memory that is about that memory only, not carried to the new one
_NOT_CARRIED = (*LINK_KEYS, "merged")


@dataclass(frozen=True)
class UpdateRequest:
    """The update operation's argument: the old memory's id and the new text, checked."""

    old_id: str
    item: Item
    scope: str  # the old memory's: a memory of another scope is not found


@dataclass(frozen=True)
class Updated:
    """`update`: the new memory, the one it supersedes, and the commit."""

    id: str
    supersedes: str
    cluster_id: str | None
    commit: str | None


def check_id(value: object) -> str:
    if not isinstance(value, str) or not MEMORY_ID_RE.match(value.strip()):
        raise BadRequest(f"'memory_id' must be a memory id (m- and 16 hex digits), got {value!r}")
    return value.strip()


def update(ctx: WriteContext, req: UpdateRequest, known: set[str]) -> Updated:
    """Store the new memory beside the old one and link the two (see the module).
    `known`: the engine's set of stored ids, which the new one joins."""
    state = ctx.state
    found = state.locate_many([req.old_id]).get(req.old_id)
    if found is None or found[2].scope != req.scope:
        raise NotFound(
            f"no memory {req.old_id} in scope {req.scope!r} (`clagd query`, `clagd list`)"
        )
    area, key, old = found
    if old.superseded_by is not None:
        raise Conflict(
            f"memory {old.id} is superseded by {old.superseded_by} already: update that one"
        )
    new_id = memory_id(req.item.content)
    if new_id == old.id:
        raise BadRequest(f"the new text is memory {old.id}'s own: nothing to update")
    if new_id in known or state.locate_many([new_id]):
        raise Conflict(f"that text is stored already, as memory {new_id}")
    meta = {k: v for k, v in old.metadata.items() if k not in _NOT_CARRIED}
    meta.update(req.item.metadata)
    meta[SUPERSEDES] = old.id
    stamp = now_iso()
    new = replace(
        old,
        id=new_id,
        content=req.item.content,
        created_at=req.item.created_at or stamp,
        metadata=meta,
    )
    cluster_id = key if area == "cluster" else None
    if cluster_id is not None:
        ctx.touch_cluster(cluster_id)
        c = state.clusters[cluster_id]
        c.memories.append(new)
        c.updated_at = stamp
    else:  # unsorted or archived: the new memory is hot, in a shard of its own
        name = new_shard_name()
        while name in state.unsorted:
            name = new_shard_name()
        ctx.touch_shard(name)
        state.unsorted[name] = [new]
    supersede.link(ctx, old.id, new.id)
    sha = ctx.commit(
        f"update: {new.id} supersedes {old.id}",
        f"- old {old.id}: {old.content[:72]}\n- new {new.id}: {new.content[:72]}",
        {"kind": "update", "supersedes": old.id, "memory": new.id},
    )
    known.add(new.id)
    return Updated(new.id, old.id, cluster_id, sha)
