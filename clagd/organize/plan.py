"""Plans: what a clustering session proposes, how it is checked, and how it is applied.

A plan covers a *sample* of memories. The SLM never sees real ids: it sees short aliases
(`M1..` memories, `C1..` existing clusters, `N1..` new clusters) that the JSON schema
enumerates, so a constrained decoder cannot invent an id; `parse_plan` maps them back.

Safety comes in three layers: `validate_plan` rejects a plan before anything changes,
`apply_plan` only moves what the plan names, and `check_invariants` compares the store after
the change with the set of memories before it (the session reverts the commit if it fails).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from clagd.errors import ClagdError
from clagd.model import Cluster, Memory, new_cluster_id, now_iso, parse_epoch
from clagd.organize.similarity import count_cosine, jaccard, term_counts, terms
from clagd.slm.schema import array, closed_object, one_of, string
from clagd.text import tokenize

NAME_MIN_WORDS = 2
NAME_MAX_WORDS = 5
NAME_MAX_CHARS = 60
DESCRIPTION_MAX_CHARS = 200
TAG_MAX_CHARS = 24
MAX_TAGS = 5
REASON_MAX_CHARS = 300
NEW_PREFIX = "new:"
NAME_PATTERN = "^[A-Za-z0-9']{1,20}( [A-Za-z0-9']{1,20}){1,4}$"
_NEW_ALIAS_RE = re.compile(r"^N(\d+)$")


class PlanError(ClagdError):
    """A plan that cannot be parsed or applied; `problems` lists every reason."""

    code = "plan"

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems) if problems else "invalid plan")
        self.problems = list(problems)


@dataclass
class PlanCluster:
    ref: str  # an existing cluster id (keep/rename), or "new:<k>" (create)
    name: str
    description: str = ""
    tags: list[str] = field(default_factory=list)
    merge_from: list[str] = field(default_factory=list)  # existing cids folded into ref


@dataclass
class Plan:
    clusters: list[PlanCluster] = field(default_factory=list)
    assign: dict[str, str] = field(default_factory=dict)  # memory id -> ref
    conflicts: list[tuple[str, str]] = field(default_factory=list)  # (newer mid, older mid)
    reason: str = ""
    # near-identical memories: (kept mid, dropped mid); the dropped text is kept as provenance
    # in the kept memory's metadata["merged"] and in the commit body
    dedupe: list[tuple[str, str]] = field(default_factory=list)

    def is_empty(self) -> bool:
        return not (self.clusters or self.assign or self.conflicts or self.dedupe)

    def summary(self, state: StateLike | None = None) -> list[str]:
        """One line per cluster the plan touches, for the commit body."""
        counts: dict[str, int] = {}
        for ref in self.assign.values():
            counts[ref] = counts.get(ref, 0) + 1
        lines = []
        for pc in self.clusters:
            old = state.clusters.get(pc.ref) if state is not None else None
            if pc.ref.startswith(NEW_PREFIX):
                verb = "create"
            elif old is not None and old.name != pc.name:
                verb = f"rename {old.name!r} ->"
            else:
                verb = "keep"
            line = f"- {verb} {pc.name!r}: {counts.get(pc.ref, 0)} sampled memories"
            if pc.merge_from:
                names = [
                    state.clusters[c].name if state and c in state.clusters else c
                    for c in pc.merge_from
                ]
                line += f"; merges {', '.join(repr(n) for n in names)}"
            lines.append(line)
        for newer, older in self.conflicts:
            lines.append(f"- conflict: {newer} supersedes {older}")
        return lines


class StateLike(Protocol):
    """The part of `store.StoreState` plans need (a fake in tests is fine)."""

    clusters: dict[str, Cluster]
    archived: dict[str, Cluster]
    unsorted: dict[str, list[Memory]]

    def locate(self, mid: str) -> tuple[str, str] | None: ...

    def memory(self, mid: str) -> Memory | None: ...

    def locate_many(self, mids: Iterable[str]) -> dict[str, tuple[str, str, Memory]]: ...


class Toucher(Protocol):
    """The writer context's file marking (`ctx.touch_cluster`, `ctx.touch_shard`)."""

    def touch_cluster(self, cid: str) -> None: ...

    def touch_shard(self, name: str) -> None: ...


# -- aliases and schema ------------------------------------------------------------------


@dataclass
class Aliases:
    memories: dict[str, str]  # "M1" -> memory id
    clusters: dict[str, str]  # "C1" -> cluster id
    max_new: int

    @classmethod
    def make(cls, memory_ids: Iterable[str], cluster_ids: Iterable[str], max_new: int) -> Aliases:
        return cls(
            {f"M{i}": mid for i, mid in enumerate(memory_ids, 1)},
            {f"C{i}": cid for i, cid in enumerate(cluster_ids, 1)},
            max_new,
        )

    @property
    def new(self) -> list[str]:
        return [f"N{i}" for i in range(1, self.max_new + 1)]


def build_schema(
    memory_aliases: list[str], cluster_aliases: list[str], max_new: int
) -> dict[str, Any]:
    """The JSON schema of an answer; every id the model may name is enumerated.

    `assign` is an object with one required key per memory, so a constrained decoder cannot
    drop a memory or assign one twice.
    """
    targets = list(cluster_aliases) + [f"N{i}" for i in range(1, max_new + 1)]
    cluster_props: dict[str, Any] = {
        "id": one_of(targets),
        # 2-5 words; a grammar-constrained decoder cannot produce anything else
        "name": string(pattern=NAME_PATTERN, max_length=NAME_MAX_CHARS),
        "description": string(max_length=DESCRIPTION_MAX_CHARS),
        "tags": array(string(min_length=1, max_length=TAG_MAX_CHARS), MAX_TAGS),
    }
    if cluster_aliases:
        cluster_props["merge"] = array(one_of(cluster_aliases), len(cluster_aliases))
    memory = one_of(memory_aliases)
    return closed_object(
        {
            "clusters": array(
                closed_object(cluster_props, ["id", "name", "description", "tags"]),
                len(targets),
            ),
            "assign": closed_object({m: one_of(targets) for m in memory_aliases}),
            "conflicts": array(
                closed_object({"newer": memory, "older": memory}),
                max(1, len(memory_aliases) // 2),
            ),
            "reason": string(max_length=REASON_MAX_CHARS),
        }
    )


def parse_plan(data: Mapping[str, Any], aliases: Aliases) -> Plan:
    """Map an answer in aliases back to real ids. Raises PlanError listing every problem
    (unknown alias, a memory assigned twice, a cluster described twice, wrong types)."""
    problems: list[str] = []
    plan = Plan(reason=str(data.get("reason") or "")[:REASON_MAX_CHARS])
    plan.clusters = _parse_clusters(data.get("clusters"), aliases, problems)
    plan.assign = _parse_assign(data.get("assign"), aliases, problems)
    plan.conflicts = _parse_conflicts(data.get("conflicts"), aliases, problems)
    if problems:
        raise PlanError(problems)
    return plan


def _ref_of(alias: Any, aliases: Aliases, where: str, problems: list[str]) -> str | None:
    """The cluster ref an alias names (`C<i>`: an existing cluster, `N<k>`: a new one)."""
    if isinstance(alias, str):
        if alias in aliases.clusters:
            return aliases.clusters[alias]
        m = _NEW_ALIAS_RE.match(alias)
        if m and 1 <= int(m.group(1)) <= aliases.max_new:
            return NEW_PREFIX + m.group(1)
    problems.append(f"{where}: unknown cluster id {alias!r}")
    return None


def _parse_clusters(value: Any, aliases: Aliases, problems: list[str]) -> list[PlanCluster]:
    out: list[PlanCluster] = []
    seen_refs: set[str] = set()
    for i, item in enumerate(_as_list(value, "clusters", problems)):
        if not isinstance(item, Mapping):
            problems.append(f"clusters[{i}] is not an object")
            continue
        ref = _ref_of(item.get("id"), aliases, f"clusters[{i}]", problems)
        if ref is None:
            continue
        if ref in seen_refs:
            problems.append(f"cluster {item.get('id')} is described twice")
            continue
        seen_refs.add(ref)
        merge = []
        for alias in _as_list(item.get("merge"), f"clusters[{i}].merge", problems):
            if alias in aliases.clusters:
                merge.append(aliases.clusters[alias])
            else:
                problems.append(f"clusters[{i}].merge: unknown cluster id {alias!r}")
        out.append(
            PlanCluster(
                ref=ref,
                name=" ".join(str(item.get("name") or "").split()),
                description=" ".join(str(item.get("description") or "").split()),
                tags=[str(t).strip() for t in (item.get("tags") or []) if str(t).strip()],
                merge_from=merge,
            )
        )
    return out


def _parse_assign(raw: Any, aliases: Aliases, problems: list[str]) -> dict[str, str]:
    pairs: list[tuple[Any, Any]]
    if isinstance(raw, Mapping):
        pairs = list(raw.items())
    else:  # also accept [{"memory": "M1", "cluster": "C2"}, ...]
        pairs = [
            (p.get("memory"), p.get("cluster")) if isinstance(p, Mapping) else (None, None)
            for p in _as_list(raw, "assign", problems)
        ]
    assign: dict[str, str] = {}
    for malias, calias in pairs:
        if malias not in aliases.memories:
            problems.append(f"assign: unknown memory id {malias!r}")
            continue
        mid = aliases.memories[malias]
        ref = _ref_of(calias, aliases, f"assign.{malias}", problems)
        if ref is None:
            continue
        if mid in assign:
            problems.append(f"memory {malias} is assigned twice")
            continue
        assign[mid] = ref
    return assign


def _parse_conflicts(value: Any, aliases: Aliases, problems: list[str]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for i, item in enumerate(_as_list(value, "conflicts", problems)):
        if not isinstance(item, Mapping):
            continue
        newer, older = item.get("newer"), item.get("older")
        if newer in aliases.memories and older in aliases.memories and newer != older:
            out.append((aliases.memories[newer], aliases.memories[older]))
        elif newer != older:
            problems.append(f"conflicts[{i}]: unknown memory id {newer!r} or {older!r}")
    return out


def _as_list(value: Any, where: str, problems: list[str]) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        problems.append(f"{where} is not a list")
        return []
    return value


# -- validation --------------------------------------------------------------------------


def name_problem(name: str) -> str | None:
    words = name.split()
    if not words:
        return "a cluster has no name"
    if len(name) > NAME_MAX_CHARS:
        return f"name {name!r} is longer than {NAME_MAX_CHARS} characters"
    if not NAME_MIN_WORDS <= len(words) <= NAME_MAX_WORDS:
        return f"name {name!r} should have {NAME_MIN_WORDS}-{NAME_MAX_WORDS} words"
    return None


def validate_plan(plan: Plan, sampled_ids: Iterable[str], state: StateLike) -> list[str]:
    """Everything wrong with `plan` against the store as it is now; [] means apply it."""
    sampled = set(sampled_ids)
    problems: list[str] = []
    declared, merged = _check_clusters(plan.clusters, state, problems)
    _check_assign(plan.assign, sampled, declared, merged, state, problems)
    _check_names(declared, merged, state, problems)
    for newer, older in plan.conflicts:
        if newer not in sampled or older not in sampled:
            problems.append(f"conflict names a memory outside the sample ({newer}, {older})")
    for keep, drop in plan.dedupe:
        if keep == drop or state.memory(keep) is None or state.memory(drop) is None:
            problems.append(f"cannot merge memory {drop} into {keep}")
    return problems


def _check_clusters(
    clusters: list[PlanCluster], state: StateLike, problems: list[str]
) -> tuple[dict[str, PlanCluster], dict[str, str]]:
    """The clusters the plan declares (ref -> cluster) and merges away (cid -> into ref)."""
    declared: dict[str, PlanCluster] = {}
    merged: dict[str, str] = {}
    for pc in clusters:
        if pc.ref in declared:
            problems.append(f"cluster {pc.ref} is described twice")
            continue
        declared[pc.ref] = pc
        if not pc.ref.startswith(NEW_PREFIX) and pc.ref not in state.clusters:
            problems.append(f"unknown cluster {pc.ref}")
            continue
        _check_fields(pc, state.clusters.get(pc.ref), problems)
        for src in pc.merge_from:
            if src == pc.ref:
                continue
            if src not in state.clusters:
                problems.append(f"merge of unknown cluster {src}")
            elif state.clusters[src].pinned:
                problems.append(f"cluster {state.clusters[src].name!r} is pinned")
            elif src in merged:
                problems.append(f"cluster {src} is merged twice")
            else:
                merged[src] = pc.ref
    for src in merged:
        if src in declared:
            problems.append(f"cluster {src} is both merged away and kept")
    return declared, merged


def _check_fields(pc: PlanCluster, existing: Cluster | None, problems: list[str]) -> None:
    if existing is None or existing.name != pc.name:
        if p := name_problem(pc.name):
            problems.append(p)
    if len(pc.description) > DESCRIPTION_MAX_CHARS:
        problems.append(f"description of {pc.name!r} is too long")
    if existing is not None and existing.pinned and existing.name != pc.name:
        problems.append(f"cluster {existing.name!r} is pinned and cannot be renamed")


def _check_assign(
    assign: dict[str, str],
    sampled: set[str],
    declared: dict[str, PlanCluster],
    merged: dict[str, str],
    state: StateLike,
    problems: list[str],
) -> None:
    """Every sampled memory goes somewhere that exists, and every new cluster gets one."""
    live = state.locate_many(assign)
    for mid, ref in assign.items():
        if mid not in sampled:
            problems.append(f"unknown memory {mid} (not in the sample)")
        elif mid not in live:
            problems.append(f"memory {mid} is no longer in the store")
        if ref.startswith(NEW_PREFIX):
            if ref not in declared:
                problems.append(f"memory {mid} goes to {ref}, which has no name")
        elif ref not in state.clusters:
            problems.append(f"memory {mid} goes to unknown cluster {ref}")
        elif ref in merged:
            problems.append(f"memory {mid} goes to {ref}, which is merged away")
    for mid in sorted(sampled - set(assign)):
        problems.append(f"memory {mid} was dropped (not assigned)")
    used = set(assign.values())
    for ref, pc in declared.items():
        if ref.startswith(NEW_PREFIX) and ref not in used:
            problems.append(f"new cluster {pc.name!r} is empty")


def _check_names(
    declared: dict[str, PlanCluster],
    merged: dict[str, str],
    state: StateLike,
    problems: list[str],
) -> None:
    """Names distinct among the plan and against every hot cluster the plan leaves as is."""
    names: dict[str, str] = {}
    final_names = [(ref, pc.name) for ref, pc in declared.items()]
    final_names += [
        (cid, c.name)
        for cid, c in state.clusters.items()
        if cid not in declared and cid not in merged
    ]
    for ref, name in final_names:
        key = name.strip().casefold()
        if key in names and names[key] != ref:
            problems.append(f"duplicate cluster name {name!r}")
        names.setdefault(key, ref)


# -- applying ----------------------------------------------------------------------------


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
    target = run.declare(plan.clusters)
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

    def declare(self, clusters: list[PlanCluster]) -> dict[str, str]:
        """Create the new clusters and update the kept ones; ref -> cluster id."""
        state, now = self.state, self.now
        target: dict[str, str] = {}
        for pc in clusters:
            if pc.ref.startswith(NEW_PREFIX):
                cid = new_cluster_id()
                while cid in state.clusters or cid in state.archived:
                    cid = new_cluster_id()
                state.clusters[cid] = Cluster(
                    cid, pc.name, pc.description, list(pc.tags[:MAX_TAGS]), now, now
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
                victim = state.clusters.pop(src)
                self.mark_cluster(dest.id)
                if self.touch is not None:
                    self.touch.touch_cluster(src)
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
        for keep_id, drop_id in pairs:
            kw, dw = state.locate(keep_id), state.locate(drop_id)
            if kw is None or dw is None or kw[0] != "cluster" or dw[0] != "cluster":
                continue
            keep_c, drop_c = state.clusters[kw[1]], state.clusters[dw[1]]
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
                keep.id, keep.content, keep.created_at, {**keep.metadata, "merged": merged}
            )
            keep_c.memories[at] = keep
            self.mark_cluster(keep_c.id)
            self.mark_cluster(drop_c.id)
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


def check_invariants(
    before_ids: set[str],
    state: StateLike,
    dropped: Iterable[str] = (),
    renamed: Iterable[str] = (),
) -> list[str]:
    """Every memory exactly once (none lost, none duplicated, none appeared), no empty
    cluster, names distinct and within limits. `dropped` are ids a plan merged into a
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
    names: dict[str, str] = {}
    for area, table in (("clusters", state.clusters), ("archive", state.archived)):
        for cid, c in table.items():
            if c.id != cid:
                problems.append(f"cluster {cid} has id {c.id}")
            if not c.memories:
                problems.append(f"cluster {c.name!r} ({cid}) is empty")
            if not c.name.strip() or len(c.name) > NAME_MAX_CHARS:
                problems.append(f"cluster {cid} has an invalid name {c.name!r}")
            if area == "clusters":
                key = c.name.strip().casefold()
                if key in names:
                    problems.append(f"two clusters are named {c.name!r}")
                names[key] = cid
    for cid in renamed:
        rc = state.clusters.get(cid)
        if rc is not None and (p := name_problem(rc.name)):
            problems.append(p)
    return problems


# -- size policy -------------------------------------------------------------------------


NEAR_IDENTICAL = 0.9


def size_policy(
    state: StateLike,
    max_size: int,
    merge_similarity: float,
    min_size: int = 2,
) -> Plan | None:
    """A plan that keeps clusters a useful size: split those over `max_size` in two
    (lexical bisection), merge near-duplicate clusters (cosine of term counts at least
    `merge_similarity`, if the result fits), and fold near-identical memories (token Jaccard
    at least 0.9) into one, keeping the other's text as provenance. None: nothing to do."""
    plan = Plan()
    reasons: list[str] = []
    taken: set[str] = set()
    for c in state.clusters.values():
        _fold_near_identical(c, plan, reasons)
    _merge_near_duplicates(state, max_size, merge_similarity, plan, taken, reasons)
    _split_oversized(state, max_size, min_size, plan, taken, reasons)
    if plan.is_empty():
        return None
    plan.reason = "size policy: " + "; ".join(reasons)
    return plan


def _fold_near_identical(c: Cluster, plan: Plan, reasons: list[str]) -> None:
    """Near-identical memories inside one cluster: the shorter folds into the longer."""
    term_sets = [(m, terms(m.content)) for m in c.memories]
    gone: set[str] = set()
    for i, (ma, ta) in enumerate(term_sets):
        if ma.id in gone:
            continue
        for mb, tb in term_sets[i + 1 :]:
            if mb.id in gone or jaccard(ta, tb) < NEAR_IDENTICAL:
                continue
            keep, drop = (ma, mb) if len(ma.content) >= len(mb.content) else (mb, ma)
            if keep.id in gone:
                continue
            plan.dedupe.append((keep.id, drop.id))
            gone.add(drop.id)
    if gone:
        reasons.append(f"folded {len(gone)} near-identical memories in {c.name!r}")


def _merge_near_duplicates(
    state: StateLike,
    max_size: int,
    merge_similarity: float,
    plan: Plan,
    taken: set[str],
    reasons: list[str],
) -> None:
    hot = [c for c in state.clusters.values() if c.memories and not c.pinned]
    bags = {c.id: term_counts(m.content for m in c.memories) for c in hot}
    for i, a in enumerate(hot):
        if a.id in taken:
            continue
        for b in hot[i + 1 :]:
            if b.id in taken or len(a.memories) + len(b.memories) > max_size:
                continue
            if count_cosine(bags[a.id], bags[b.id]) >= merge_similarity:
                big, small = (a, b) if len(a.memories) >= len(b.memories) else (b, a)
                plan.clusters.append(
                    PlanCluster(big.id, big.name, big.description, list(big.tags), [small.id])
                )
                taken.update({a.id, b.id})
                reasons.append(f"merged near-duplicate {small.name!r} into {big.name!r}")
                break


def _split_oversized(
    state: StateLike,
    max_size: int,
    min_size: int,
    plan: Plan,
    taken: set[str],
    reasons: list[str],
) -> None:
    names = {c.name.casefold() for c in state.clusters.values()}
    gone_all = {d for _k, d in plan.dedupe}
    k = 0
    for c in state.clusters.values():
        live = [m for m in c.memories if m.id not in gone_all]
        if c.id in taken or c.pinned or len(live) <= max_size:
            continue
        part = _bisect(live, min_size)
        if part is None:
            continue
        k += 1
        ref = f"{NEW_PREFIX}split{k}"
        name = _split_name(part, c, names)
        names.add(name.casefold())
        plan.clusters.append(
            PlanCluster(
                ref,
                name,
                f"Split from {c.name}: {c.description}"[:DESCRIPTION_MAX_CHARS],
                list(c.tags),
            )
        )
        for m in part:
            plan.assign[m.id] = ref
        reasons.append(f"split {len(part)} of {len(live)} memories out of {c.name!r}")


def _bisect(mems: list[Memory], min_size: int) -> list[Memory] | None:
    """The memories nearer to a second seed (the one least like the first): the part to
    split off, or None when the halves would be too uneven to help."""
    term_sets = {m.id: terms(m.content) for m in mems}
    seed_a = mems[0]
    seed_b = min(mems[1:], key=lambda m: jaccard(term_sets[seed_a.id], term_sets[m.id]))
    part = [
        m
        for m in mems
        if m is seed_b
        or (
            m is not seed_a
            and jaccard(term_sets[m.id], term_sets[seed_b.id])
            > jaccard(term_sets[m.id], term_sets[seed_a.id])
        )
    ]
    if len(part) < max(min_size, 1) or len(mems) - len(part) < max(min_size, 1):
        # no lexical split: fall back to time (the newer half)
        ordered = sorted(mems, key=lambda m: m.created_at)
        part = ordered[len(ordered) // 2 :]
    return part or None


def _split_name(part: list[Memory], parent: Cluster, taken: set[str]) -> str:
    counts: dict[str, int] = {}
    for m in part:
        for w in set(tokenize(m.content, stem=False)):
            if len(w) > 2 and not w.isdigit():
                counts[w] = counts.get(w, 0) + 1
    top = [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:2]]
    base = " ".join(top) if len(top) == 2 else f"{parent.name.split()[0]} more"
    name = base
    n = 2
    while name.casefold() in taken or name_problem(name):
        name = " ".join(f"{base} part {n}".split()[-NAME_MAX_WORDS:])
        n += 1
    return name[:NAME_MAX_CHARS]
