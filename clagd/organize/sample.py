"""What a session looks at: the sample (copied on the writer, so the model is asked without
holding it) and, after a plan is applied, the assignments it checks."""

from __future__ import annotations

import copy
import heapq
import random
from collections.abc import Mapping
from dataclasses import dataclass

from clagd.model import Cluster, Memory
from clagd.organize.prompts import clip
from clagd.organize.similarity import ClusterScores, label_terms, terms
from clagd.store.files import StoreState
from clagd.store.holds import pausing

MAX_CHECKS = 20
MIN_CHECKS = 3


@dataclass
class Snapshot:
    sample: list[Memory]
    home: dict[str, str | None]  # sampled memory id -> its cluster id (None: unsorted)
    clusters: dict[str, Cluster]  # copies of every hot cluster
    total: int

    @property
    def sampled(self) -> list[str]:
        return [m.id for m in self.sample]


def choose_sample(
    state: StoreState, size: int, access: Mapping[str, int] | None = None
) -> list[tuple[Memory, str | None]]:
    """Unsorted memories first (oldest first), then the most recently added clustered ones
    and the most accessed, interleaved, up to `size`."""
    picked: dict[str, tuple[Memory, str | None]] = {}
    for mems in state.unsorted.values():
        for m in sorted(mems, key=lambda m: m.created_at):
            if len(picked) < size:
                picked.setdefault(m.id, (m, None))
    clustered: list[tuple[Memory, str | None]] = [
        (m, cid) for cid, c in state.clusters.items() for m in c.memories
    ]
    # the first `size` of each order are all it can take (heapq: not a sort of the store;
    # nlargest is stable, as the sorts it stands for)
    recent = heapq.nlargest(size, clustered, key=lambda p: p[0].created_at)
    counts = access or {}
    hot = heapq.nlargest(size, clustered, key=lambda p: counts.get(p[0].id, 0)) if access else []
    for i in range(max(len(recent), len(hot))):
        for seq in (recent, hot):
            if len(picked) >= size:
                break
            if i < len(seq):
                picked.setdefault(seq[i][0].id, seq[i])
    return list(picked.values())


def of_scope(state: StoreState, scope: str | None) -> StoreState:
    """`state`'s hot clusters and unsorted memories of `scope` only (None: all of it): what
    a session of one scope (`recluster --scope`) samples and plans its size policy on."""
    if scope is None:
        return state
    clusters = {cid: c for cid, c in state.clusters.items() if c.scope == scope}
    loose = {key: [m for m in mems if m.scope == scope] for key, mems in state.unsorted.items()}
    return StoreState(clusters, {}, {key: mems for key, mems in loose.items() if mems})


def take_snapshot(
    state: StoreState, size: int, access: Mapping[str, int] | None, scope: str | None = None
) -> Snapshot:
    """Copies of the sample and of every hot cluster (of `scope` only, when given: `of_scope`).
    A cluster's copy is shallow, with its own member list: a memory is never changed in place
    (a change makes a new object), and a deep copy of 100k memories held the writer for
    seconds."""
    state = of_scope(state, scope)
    sample = choose_sample(state, size, access)
    total = sum(len(c.memories) for c in state.clusters.values()) + sum(
        len(v) for v in state.unsorted.values()
    )
    return Snapshot(
        sample=[copy.deepcopy(m) for m, _ in sample],
        home={m.id: cid for m, cid in sample},
        # steps of work off the writer give way to writes (`store/holds.py`)
        clusters={cid: _copy_cluster(c) for cid, c in pausing(state.clusters.items(), 512)},
        total=total,
    )


def _copy_cluster(c: Cluster) -> Cluster:
    out = copy.copy(c)
    out.memories = list(c.memories)
    out.tags = list(c.tags)
    out.supersedes = dict(c.supersedes)
    return out


@dataclass
class Check:
    mid: str
    content: str
    cid: str
    cluster: str  # name: description
    examples: list[str]
    lexical_ok: bool


def lexical_ok(state: StoreState, mid: str, cid: str, scored: ClusterScores) -> bool:
    """An assignment is lexically incoherent only when the memory shares no term with its
    cluster (its label and its other members: without it the cluster scores 0 for it) while
    the index's BM25 (`scored`: the hot clusters after the change) scores another cluster
    of its scope above 0 for it, so a query with its words would find that one first. Nothing else: SLM
    plans group by use, not words. (The router's `route_min_score` is an absolute BM25
    score for a whole store; over a session's few clusters IDF is small and it is never
    reached, so the ranking decides.)"""
    m = state.memory(mid)
    own = state.clusters.get(cid)
    if m is None or own is None:
        return False
    words = terms(m.content)
    if not words:
        return True
    mine = label_terms(own)
    for x in own.memories:
        if x.id != mid:
            mine |= terms(x.content)
    if words & mine:
        return True
    others = scored.scores(m.content, own.scope)  # a query of its scope sees no other's
    best_other = max((s for k, s in others.items() if k != cid), default=0.0)
    return best_other <= 0.0


def pick_checks(
    state: StoreState,
    assign: dict[str, str],
    fraction: float,
    rng: random.Random,
    scored: ClusterScores | None = None,
) -> list[Check]:
    """A random `fraction` of the applied assignments (at least `MIN_CHECKS`: 10% of a
    12-memory plan is one check, which a copying model passed; at most `MAX_CHECKS`).
    `scored`: the hot clusters as they are now (`ClusterScores(state.clusters)`)."""
    items = sorted(assign.items())
    if not items or fraction <= 0:
        return []
    n = min(len(items), MAX_CHECKS, max(MIN_CHECKS, round(fraction * len(items))))
    scored = scored or ClusterScores(state.clusters)
    out = []
    for mid, cid in rng.sample(items, n):
        c = state.clusters.get(cid)
        m = state.memory(mid)
        if c is None or m is None:
            continue
        others = [clip(x.content, 100) for x in c.memories if x.id != mid][:2]
        out.append(
            Check(
                mid,
                clip(m.content, 160),
                cid,
                f"{c.name}: {clip(c.description, 120)}",
                others,
                lexical_ok(state, mid, cid, scored),
            )
        )
    return out
