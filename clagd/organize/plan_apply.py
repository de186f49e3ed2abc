"""`apply_plan`: the store's state changed as a plan says, and nothing else."""

from __future__ import annotations

from dataclasses import dataclass, field

from clagd.model import Cluster, Memory, new_cluster_id, now_iso, parse_epoch
from clagd.organize.plan import (
    MAX_TAGS,
    NEW_PREFIX,
    Plan,
    PlanCluster,
    StateLike,
    Toucher,
    ref_scopes,
)
from clagd.scopes import DEFAULT_SCOPE


@dataclass
class Applied:
    """What `apply_plan` changed, so the writer writes exactly those files."""

    changed: set[str] = field(default_factory=set)  # hot cluster ids created or updated
    removed: set[str] = field(default_factory=set)  # hot cluster ids deleted
    shards: set[str] = field(default_factory=set)  # unsorted shards changed (maybe emptied)
    created: dict[str, str] = field(default_factory=dict)  # "new:k" -> new cluster id
    moved: int = 0
    dropped: list[Memory] = field(default_factory=list)  # merged near-identical memories
    notes: list[str] = field(default_factory=list)  # provenance lines for the commit body


def _newer_first(a: Memory, b: Memory) -> tuple[Memory, Memory]:
    """Recency decides which memory supersedes the other, then metadata confidence."""

    def key(m: Memory) -> tuple[float, float]:
        t = parse_epoch(m.created_at) or 0.0  # an unknown time counts as the oldest
        conf = m.metadata.get("confidence", 0) if isinstance(m.metadata, dict) else 0
        try:
            c = float(conf)
        except (TypeError, ValueError):
            c = 0.0
        return (t, c)

    return (a, b) if key(a) >= key(b) else (b, a)


def apply_plan(
    state: StateLike, plan: Plan, now: str | None = None, touch: Toucher | None = None
) -> Applied:
    """Mutate `state` as the plan says. Memories the plan does not name stay where they are;
    existing clusters left empty are removed. Call `validate_plan` first. `touch` (the writer
    context) is told about every file before it changes."""
    run = _Applying(state, touch, now or now_iso())
    target = run.declare(plan.clusters, ref_scopes(plan, state))
    run.merge(plan.clusters, target)
    run.move(plan.assign, target)
    run.dedupe(plan.dedupe)
    run.supersede(plan.conflicts)
    run.tidy()
    return run.out


class _Applying:
    """One `apply_plan` in progress: the state it changes and what it has changed."""

    def __init__(self, state: StateLike, touch: Toucher | None, now: str) -> None:
        self.state, self.touch, self.now = state, touch, now
        self.out = Applied()

    def mark_cluster(self, cid: str) -> None:
        out = self.out
        if self.touch is not None and cid not in out.changed and cid not in out.removed:
            self.touch.touch_cluster(cid)
        out.changed.add(cid)

    def mark_shard(self, name: str) -> None:
        if self.touch is not None and name not in self.out.shards:
            self.touch.touch_shard(name)
        self.out.shards.add(name)

    def declare(self, clusters: list[PlanCluster], scopes: dict[str, set[str]]) -> dict[str, str]:
        """Create the new clusters (each of the one scope its memories have, `scopes`) and
        update the kept ones; ref -> cluster id."""
        state, now = self.state, self.now
        target: dict[str, str] = {}
        for pc in clusters:
            if pc.ref.startswith(NEW_PREFIX):
                cid = new_cluster_id()
                while cid in state.clusters or cid in state.archived:
                    cid = new_cluster_id()
                state.clusters[cid] = Cluster(
                    cid,
                    pc.name,
                    pc.description,
                    list(pc.tags[:MAX_TAGS]),
                    now,
                    now,
                    scope=min(scopes.get(pc.ref) or {DEFAULT_SCOPE}),
                )
                self.out.created[pc.ref] = cid
                target[pc.ref] = cid
                self.mark_cluster(cid)
            else:
                c = state.clusters[pc.ref]
                target[pc.ref] = pc.ref
                new_fields = (
                    pc.name or c.name,
                    pc.description or c.description,
                    list(pc.tags[:MAX_TAGS]) or c.tags,
                )
                if new_fields != (c.name, c.description, c.tags):
                    c.name, c.description, c.tags = new_fields
                    self.mark_cluster(c.id)
        return target

    def merge(self, clusters: list[PlanCluster], target: dict[str, str]) -> None:
        state, out = self.state, self.out
        for pc in clusters:
            dest = state.clusters[target[pc.ref]]
            for src in pc.merge_from:
                if src == dest.id or src not in state.clusters:
                    continue
                self.mark_cluster(dest.id)
                if self.touch is not None:
                    self.touch.touch_cluster(src)  # before it changes, as every mark
                victim = state.clusters.pop(src)
                out.removed.add(src)
                out.changed.discard(src)
                dest.memories.extend(victim.memories)
                dest.supersedes.update(victim.supersedes)
                out.moved += len(victim.memories)
                out.notes.append(f"merged {victim.name!r} ({src}) into {dest.name!r}")

    def move(self, assign: dict[str, str], target: dict[str, str]) -> None:
        state = self.state
        found = state.locate_many(assign)  # one pass; a move changes no other's place
        for mid, ref in assign.items():
            cid = target.get(ref, ref)
            if cid not in state.clusters or mid not in found:
                continue
            where = found[mid][:2]
            if where == ("cluster", cid) or where[0] == "archive":
                continue
            mem = self._take(mid, *where)
            self.mark_cluster(cid)
            state.clusters[cid].memories.append(mem)
            self.out.moved += 1

    def _take(self, mid: str, area: str, key: str) -> Memory:
        """Remove a memory from its unsorted shard or cluster, and return it."""
        state = self.state
        if area == "unsorted":
            self.mark_shard(key)
            shard = state.unsorted[key]
            idx = next(i for i, m in enumerate(shard) if m.id == mid)
            return shard.pop(idx)
        self.mark_cluster(key)
        src_c = state.clusters[key]
        idx = next(i for i, m in enumerate(src_c.memories) if m.id == mid)
        mem = src_c.memories.pop(idx)
        # a supersedes pair only means something inside one cluster
        if mid in src_c.supersedes:
            del src_c.supersedes[mid]
        for newer in [n for n, o in src_c.supersedes.items() if o == mid]:
            del src_c.supersedes[newer]
        return mem

    def dedupe(self, pairs: list[tuple[str, str]]) -> None:
        state = self.state
        # one pass over the store for every pair (`locate` is a pass each)
        where = state.locate_many(mid for pair in pairs for mid in pair) if pairs else {}
        for keep_id, drop_id in pairs:
            kw, dw = where.get(keep_id), where.get(drop_id)
            if kw is None or dw is None or kw[0] != "cluster" or dw[0] != "cluster":
                continue
            where.pop(drop_id)  # folded away: a later pair cannot name it
            keep_c, drop_c = state.clusters[kw[1]], state.clusters[dw[1]]
            self.mark_cluster(keep_c.id)
            self.mark_cluster(drop_c.id)
            keep = next(m for m in keep_c.memories if m.id == keep_id)
            drop = next(m for m in drop_c.memories if m.id == drop_id)
            drop_c.memories.remove(drop)
            for newer in [n for n, o in drop_c.supersedes.items() if drop_id in (n, o)]:
                del drop_c.supersedes[newer]
            merged = list(keep.metadata.get("merged") or [])
            merged.append({"id": drop.id, "content": drop.content, "created_at": drop.created_at})
            # a new object, not a change of the kept one: the served index snapshot holds
            # that one (snapshots are immutable; a query may be reading its metadata now)
            at = keep_c.memories.index(keep)
            keep = Memory(
                keep.id,
                keep.content,
                keep.created_at,
                {**keep.metadata, "merged": merged},
                keep.scope,
            )
            keep_c.memories[at] = keep
            self.out.dropped.append(drop)
            self.out.notes.append(
                f"merged memory {drop.id} {drop.content!r} into {keep.id} {keep.content!r}"
            )

    def supersede(self, conflicts: list[tuple[str, str]]) -> None:
        state = self.state
        for a_id, b_id in conflicts:
            wa, wb = state.locate(a_id), state.locate(b_id)
            if wa is None or wa != wb or wa[0] != "cluster":
                continue
            c = state.clusters[wa[1]]
            ma, mb = state.memory(a_id), state.memory(b_id)
            assert ma is not None and mb is not None
            new_m, old_m = _newer_first(ma, mb)
            if c.supersedes.get(new_m.id) != old_m.id and c.supersedes.get(old_m.id) != new_m.id:
                c.supersedes[new_m.id] = old_m.id
                self.mark_cluster(c.id)
                self.out.notes.append(f"{new_m.id} supersedes {old_m.id} in {c.name!r}")

    def tidy(self) -> None:
        """Remove the clusters left empty and the emptied shards; date the changed ones."""
        state, out = self.state, self.out
        for cid in sorted(out.changed):
            cur = state.clusters.get(cid)
            if cur is None:
                continue
            if not cur.memories:
                del state.clusters[cid]
                out.changed.discard(cid)
                out.removed.add(cid)
            else:
                cur.updated_at = self.now
        for name in out.shards:
            if not state.unsorted.get(name):
                state.unsorted.pop(name, None)  # the writer deletes the emptied shard's file
