"""`check_invariants`: the store after a plan's commit against the memories before it;
`check_touched`: the same for the places the plan changed (what a session runs)."""

from __future__ import annotations

from collections.abc import Iterable
from operator import attrgetter

from clagd.model import Cluster, Memory
from clagd.organize.plan import NAME_MAX_CHARS, StateLike, Toucher
from clagd.organize.plan_checks import name_problem
from clagd.store.frozen import ClusterNames, name_key


def check_invariants(
    before_ids: set[str],
    state: StateLike,
    dropped: Iterable[str] = (),
    renamed: Iterable[str] = (),
) -> list[str]:
    """Every memory exactly once (none lost, none duplicated, none appeared), no empty
    cluster, no cluster holding another scope's memory, names distinct (within a scope)
    and within limits. `dropped` are ids a plan merged into a
    near-identical memory on purpose; `renamed` cluster ids get the 2-5 word check too."""
    problems: list[str] = []
    seen: dict[str, str] = {}
    areas: list[tuple[str, Iterable[tuple[str, list[Memory]]]]] = [
        ("clusters", ((k, c.memories) for k, c in state.clusters.items())),
        ("archive", ((k, c.memories) for k, c in state.archived.items())),
        ("unsorted", state.unsorted.items()),
    ]
    for area, groups in areas:
        for key, mems in groups:
            for m in mems:
                where = f"{area}/{key}"
                if m.id in seen:
                    problems.append(f"memory {m.id} is in {seen[m.id]} and {where}")
                seen[m.id] = where
    expected = set(before_ids) - set(dropped)
    for mid in sorted(expected - set(seen)):
        problems.append(f"memory {mid} was lost")
    for mid in sorted(set(seen) - set(before_ids)):
        problems.append(f"memory {mid} appeared from nowhere")
    names: dict[tuple[str, str], str] = {}
    for area, table in (("clusters", state.clusters), ("archive", state.archived)):
        for cid, c in table.items():
            _cluster_problems(cid, c, problems)
            if area == "clusters":
                named = name_key(c.scope, c.name)
                if named in names:
                    problems.append(f"two clusters are named {c.name!r}")
                names[named] = cid
    for cid in renamed:
        rc = state.clusters.get(cid)
        if rc is not None and (p := name_problem(rc.name)):
            problems.append(p)
    return problems


class Before:
    """The places a plan changes, each with its members' ids before the change: a
    `Toucher` in front of the writer's (`apply_plan` marks a place before it changes it),
    so `check_touched` compares exactly what the plan changed."""

    def __init__(self, state: StateLike, inner: Toucher | None = None) -> None:
        self.state, self.inner = state, inner
        self.clusters: dict[str, list[str]] = {}
        self.shards: dict[str, list[str]] = {}
        self.total = total_memories(state)

    def touch_cluster(self, cid: str) -> None:
        if cid not in self.clusters:
            c = self.state.clusters.get(cid)
            self.clusters[cid] = [m.id for m in c.memories] if c is not None else []
        if self.inner is not None:
            self.inner.touch_cluster(cid)

    def touch_shard(self, name: str) -> None:
        if name not in self.shards:
            self.shards[name] = [m.id for m in self.state.unsorted.get(name) or []]
        if self.inner is not None:
            self.inner.touch_shard(name)


def total_memories(state: StateLike) -> int:
    """How many memories the store holds (a length per place, no memory read)."""
    members = attrgetter("memories")  # map, not a generator: ~10x faster at 11k clusters
    return (
        sum(map(len, map(members, state.clusters.values())))
        + sum(map(len, map(members, state.archived.values())))
        + sum(map(len, state.unsorted.values()))
    )


def check_touched(
    before: Before,
    state: StateLike,
    dropped: Iterable[str] = (),
    renamed: Iterable[str] = (),
    names: ClusterNames | None = None,
) -> list[str]:
    """`check_invariants` for the places a plan changed (issue 26: the whole store was
    read after every plan): every memory they held exactly once among them (none lost,
    none duplicated, none appeared, `dropped` folded on purpose), the store's count
    unchanged otherwise (a memory put anywhere else, or taken from anywhere else, changes
    it), each changed cluster non-empty, of one scope and well named, and its name
    distinct from every other hot cluster's in its scope (`names`: the hot clusters' names
    as `state` has them now, kept by the writer; made from `state` when not given)."""
    problems: list[str] = []
    seen: dict[str, str] = {}
    had: set[str] = set()
    places = [("clusters", k, ids) for k, ids in before.clusters.items()]
    places += [("unsorted", k, ids) for k, ids in before.shards.items()]
    for area, key, ids in places:
        had.update(ids)
        now = (state.unsorted.get(key) or []) if area == "unsorted" else _hot(state, key)
        for m in now:
            where = f"{area}/{key}"
            if m.id in seen:
                problems.append(f"memory {m.id} is in {seen[m.id]} and {where}")
            seen[m.id] = where
    gone = set(dropped)
    for mid in sorted(had - gone - set(seen)):
        problems.append(f"memory {mid} was lost")
    for mid in sorted(set(seen) - had):
        problems.append(f"memory {mid} appeared from nowhere")
    total, expected = total_memories(state), before.total - len(gone & had)
    if not problems and total != expected:
        problems.append(f"the store holds {total} memories, {expected} expected")
    changed = [c for cid in before.clusters if (c := state.clusters.get(cid)) is not None]
    keys: set[tuple[str, str]] = set()
    for c in changed:
        _cluster_problems(c.id, c, problems)
        named = name_key(c.scope, c.name)
        if named in keys:
            problems.append(f"two clusters are named {c.name!r}")
        keys.add(named)
    names = ClusterNames(state.clusters) if names is None else names
    for scope, name in sorted(keys):
        for cid in sorted(names.bearing(scope, name) - before.clusters.keys()):
            problems.append(f"two clusters are named {state.clusters[cid].name!r}")
    for cid in renamed:
        rc = state.clusters.get(cid)
        if rc is not None and (p := name_problem(rc.name)):
            problems.append(p)
    return problems


def _hot(state: StateLike, cid: str) -> list[Memory]:
    c = state.clusters.get(cid)
    return c.memories if c is not None else []


def _cluster_problems(cid: str, c: Cluster, problems: list[str]) -> None:
    if c.id != cid:
        problems.append(f"cluster {cid} has id {c.id}")
    if any(m.scope != c.scope for m in c.memories):
        problems.append(f"cluster {c.name!r} ({cid}) mixes scopes")
    if not c.memories:
        problems.append(f"cluster {c.name!r} ({cid}) is empty")
    if not c.name.strip() or len(c.name) > NAME_MAX_CHARS:
        problems.append(f"cluster {cid} has an invalid name {c.name!r}")
