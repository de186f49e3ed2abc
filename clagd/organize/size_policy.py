"""The size policy: a planner that needs no model and keeps clusters a useful size.

Run at the end of every session that had something to organize (`session._size_policy_op`),
whatever organized it: clusters over `max_cluster_size` are split by time and topic (the
lexical organizer's episodes and topic shifts), near-duplicate clusters merged,
near-identical memories folded into one. Like the lexical organizer (`lexical.py`) it reads
only words.

It is near-linear and works in bounded slices (issue 26), so no writer operation holds the
writer long whatever the store's size:

- a `SizeMemo` remembers each cluster it looked at by its fingerprint (name and member
  texts): a cluster unchanged since is not folded again and is compared only with changed
  ones, so a session looks again only at the clusters that changed since the last;
- near-identical memories inside a cluster are candidate pairs of a prefix filter (two term
  sets with a Jaccard of at least 0.9 share a term among the rarest few of each), not all
  pairs;
- a changed cluster is compared with at most `MERGE_CANDIDATES` clusters, those sharing the
  most of its distinctive terms (buckets of each cluster's top terms), not every cluster;
- one slice reads the words of at most `SLICE_MEMORIES` memories and splits at most
  `SPLIT_SLICE` memories out of an over-large cluster; what is left is the next slice's
  (`SizeSlice.more`), and writes run between slices.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from clagd.config import SessionConfig
from clagd.model import Cluster, Memory, parse_epoch
from clagd.organize.lexical import NewestTimes, segment
from clagd.organize.plan import (
    DESCRIPTION_MAX_CHARS,
    NAME_MAX_CHARS,
    NAME_MAX_WORDS,
    NEW_PREFIX,
    Plan,
    PlanCluster,
    StateLike,
)
from clagd.organize.plan_checks import name_problem
from clagd.organize.similarity import jaccard
from clagd.store.holds import pause, pausing
from clagd.text import tokenize

NEAR_IDENTICAL = 0.9
# memories whose words one slice reads at most (fold, signatures, merge candidates)
SLICE_MEMORIES = 1000
# memories one slice splits out of an over-large cluster at most
SPLIT_SLICE = 1200
# a changed cluster is compared with this many candidates at most, each sharing at least
# `MIN_SHARED` of its probe terms (near-duplicates share most of their frequent terms)
MERGE_CANDIDATES = 6
MIN_SHARED = 2
# terms of a cluster's signature (its most frequent), and how many of the rarest of them
# find candidates; a bucket is read up to this many clusters
TOP_TERMS = 8
PROBE_TERMS = 4
BUCKET_CAP = 200


def fingerprint(c: Cluster) -> int:
    """Changes whenever the cluster's name, pinning or members do: a memory is never
    changed in place (a change makes a new object), so the members' object ids tell (a
    few ms for 100k memories, where hashing their texts took ten times that)."""
    return hash((c.name, c.pinned, tuple(map(id, c.memories))))


@dataclass
class SizeMemo:
    """What the size policy saw of each cluster: its fingerprint then, and its signature
    (most frequent terms). Only ever a shortcut: a cluster whose fingerprint changed is
    looked at again."""

    seen: dict[str, tuple[int, tuple[str, ...]]] = field(default_factory=dict)


@dataclass
class SessionMemo:
    """What sessions remember of one store between them: the size policy's `SizeMemo` and
    each cluster's newest time (`lexical.NewestTimes`). Kept by the store's engine
    (`Engine.session_memo`) for its life and dropped with it, never shared with another
    store's; a fresh one costs time, never an answer."""

    size: SizeMemo = field(default_factory=SizeMemo)
    newest: NewestTimes = field(default_factory=NewestTimes)


@dataclass
class SizeSlice:
    """One slice's plan (None: nothing to change) and whether work is left for another."""

    plan: Plan | None
    more: bool


def size_policy(
    state: StateLike,
    max_size: int,
    merge_similarity: float,
    min_size: int = 2,
) -> Plan | None:
    """Everything the size policy would do to `state` now, with no memo (tests, tools):
    the first slice of a fresh memo, without a budget. None: nothing to do."""
    cfg = SessionConfig(
        max_cluster_size=max_size, merge_similarity=merge_similarity, min_cluster_size=min_size
    )
    return size_slice(state, cfg, SizeMemo(), budget=math.inf).plan


def size_slice(
    state: StateLike,
    cfg: SessionConfig,
    memo: SizeMemo,
    budget: float = SLICE_MEMORIES,
    scope: str | None = None,
) -> SizeSlice:
    """The next slice: a plan that splits an over-large cluster (part of one, if it is very
    large), merges near-duplicate clusters (cosine of term counts at least
    `merge_similarity`, if the result fits `max_cluster_size`) and folds near-identical
    memories (token Jaccard at least 0.9) into one, keeping the other's text as provenance,
    looking only at clusters changed since `memo` saw them, `budget` memories at most.
    `scope`: the clusters of that scope only (None: every cluster; none mixes scopes)."""
    run = _Run(state, cfg, memo, budget)
    if scope is not None:
        run.hot = [c for c in run.hot if c.scope == scope]
    run.split()  # first: an over-large cluster is the worst of these, and the costliest
    run.fold_and_sign()
    run.merge()
    plan = run.plan
    if plan.is_empty():
        return SizeSlice(None, run.more)
    plan.reason = "size policy: " + "; ".join(run.reasons)
    return SizeSlice(plan, run.more)


class _Run:
    """One slice in progress."""

    def __init__(self, state: StateLike, cfg: SessionConfig, memo: SizeMemo, budget: float):
        self.state, self.cfg, self.memo, self.budget = state, cfg, memo, budget
        self.plan = Plan()
        self.reasons: list[str] = []
        self.taken: set[str] = set()
        self.gone: set[str] = set()  # memories folded away by this plan
        self.more = False
        self.spent = 0
        self.hot = [c for c in state.clusters.values() if c.memories]
        # steps of work off the writer give way to writes (`store/holds.py`)
        self.fps = {c.id: fingerprint(c) for c in pausing(self.hot, 512)}
        self.bags: dict[str, tuple[Counter[str], float]] = {}  # term counts, their norm
        self.checked: list[Cluster] = []  # changed clusters read in this slice
        self.sigs: dict[str, tuple[str, ...]] = {}  # their signatures

    def clean(self, c: Cluster) -> bool:
        seen = self.memo.seen.get(c.id)
        return seen is not None and seen[0] == self.fps[c.id]

    def sig(self, cid: str) -> tuple[str, ...]:
        got = self.sigs.get(cid)
        return got if got is not None else self.memo.seen[cid][1]

    def over(self, more: int) -> bool:
        """Reading `more` memories would pass the budget (the first read always goes)."""
        return bool(self.spent) and self.spent + more > self.budget

    def fold_and_sign(self) -> None:
        """Fold near-identical memories of every changed cluster, and sign it, within the
        budget; over-large clusters are split first (their parts are folded later)."""
        for c in self.hot:
            if self.clean(c) or len(c.memories) > self.cfg.max_cluster_size:
                continue
            pause()
            # half the budget: the rest is for the merge candidates' words
            if self.spent and self.spent + len(c.memories) > self.budget / 2:
                self.more = True
                continue
            toks = [tokenize(m.content) for m in c.memories]
            self.spent += len(c.memories)
            bag: Counter[str] = Counter()
            for t in toks:
                bag.update(t)
            self.bags[c.id] = (bag, _norm(bag))
            self._fold(c, [set(t) for t in toks], bag)
            top = sorted(bag.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_TERMS]
            self.sigs[c.id] = tuple(t for t, _n in top)
            self.checked.append(c)

    def _fold(self, c: Cluster, sets: list[set[str]], bag: Counter[str]) -> None:
        """Near-identical memories inside one cluster: the shorter folds into the longer.
        Candidates share a term among the rarest `len - ceil(0.9 len) + 1` of each (the
        prefix filter: fewer shared, and the Jaccard cannot reach 0.9)."""
        mems = c.memories
        by_prefix: dict[str, list[int]] = {}
        prefixes: list[list[str]] = []
        for s in sets:
            order = sorted(s, key=lambda t: (bag[t], t))
            prefixes.append(order[: len(order) - math.ceil(NEAR_IDENTICAL * len(order)) + 1])
        for i, p in enumerate(prefixes):
            for t in p:
                by_prefix.setdefault(t, []).append(i)
        folded = 0
        for i, ma in enumerate(mems):
            if ma.id in self.gone:
                continue
            cands = sorted({j for t in prefixes[i] for j in by_prefix[t] if j > i})
            for j in cands:
                mb = mems[j]
                if mb.id in self.gone or jaccard(sets[i], sets[j]) < NEAR_IDENTICAL:
                    continue
                keep, drop = (ma, mb) if len(ma.content) >= len(mb.content) else (mb, ma)
                self.plan.dedupe.append((keep.id, drop.id))
                self.gone.add(drop.id)
                folded += 1
                if drop is ma:
                    break
        if folded:
            self.reasons.append(f"folded {folded} near-identical memories in {c.name!r}")

    def _bag(self, c: Cluster) -> tuple[Counter[str], float]:
        got = self.bags.get(c.id)
        if got is None:
            bag = Counter(t for m in c.memories for t in tokenize(m.content))
            self.spent += len(c.memories)
            got = self.bags[c.id] = (bag, _norm(bag))
        return got

    def _cosine(self, a: Cluster, b: Cluster) -> float:
        (ba, na), (bb, nb) = self._bag(a), self._bag(b)
        if not na or not nb:
            return 0.0
        if len(ba) > len(bb):
            ba, bb = bb, ba
        return sum(v * bb.get(k, 0) for k, v in ba.items()) / (na * nb)

    def merge(self) -> None:
        """Each changed cluster against the clusters that share the most of its rarest
        signature terms: merged into (or absorbing) the first near-duplicate that fits.
        A changed cluster is remembered as seen once it was compared (within the budget)."""
        max_size = self.cfg.max_cluster_size
        buckets: dict[str, list[str]] = {}
        by_id = {c.id: c for c in self.hot}
        signed = [c for c in self.hot if not c.pinned and (c.id in self.sigs or self.clean(c))]
        for c in pausing(signed, 512):
            for t in self.sig(c.id):
                bucket = buckets.setdefault(t, [])
                if len(bucket) < BUCKET_CAP:
                    bucket.append(c.id)
        for a in pausing(self.checked):
            if self.spent > self.budget:
                self.more = True  # not compared: not remembered, the next slice does it
                continue
            if a.id not in self.taken and not a.pinned:
                self._merge_one(a, buckets, by_id, max_size)
            self.memo.seen[a.id] = (self.fps[a.id], self.sigs[a.id])

    def _merge_one(
        self, a: Cluster, buckets: dict[str, list[str]], by_id: dict[str, Cluster], max_size: int
    ) -> None:
        probes = sorted(self.sig(a.id), key=lambda t: (len(buckets.get(t, ())), t))
        shared: Counter[str] = Counter()
        for t in probes[:PROBE_TERMS]:
            shared.update(x for x in buckets.get(t, ()) if x != a.id)
        least = min(MIN_SHARED, len(probes))
        cands = sorted((x for x in shared if shared[x] >= least), key=lambda x: (-shared[x], x))
        for bid in cands[:MERGE_CANDIDATES]:
            b = by_id[bid]
            if b.id in self.taken or len(a.memories) + len(b.memories) > max_size:
                continue
            if a.scope != b.scope:
                continue  # a cluster never mixes scopes
            if self._cosine(a, b) < self.cfg.merge_similarity:
                continue
            big, small = (a, b) if len(a.memories) >= len(b.memories) else (b, a)
            self.plan.clusters.append(
                PlanCluster(big.id, big.name, big.description, list(big.tags), [small.id])
            )
            self.taken.update({a.id, b.id})
            self.reasons.append(f"merged near-duplicate {small.name!r} into {big.name!r}")
            return

    def split(self) -> None:
        """Over-large clusters cut by time and topic into clusters of about
        `target_cluster_size`: the newest piece stays, the others are new; a cluster over
        `SPLIT_SLICE` gives its oldest `SPLIT_SLICE` memories this slice, the rest later."""
        cfg, max_size = self.cfg, self.cfg.max_cluster_size
        names = {c.name.casefold() for c in self.state.clusters.values()}
        k = 0
        for c in self.hot:
            live = [m for m in c.memories if m.id not in self.gone]
            if c.id in self.taken or c.pinned or len(live) <= max_size:
                continue
            if self.over(min(len(live), SPLIT_SLICE)):
                self.more = True
                continue
            ordered = sorted(live, key=_ts)
            last = len(ordered) <= SPLIT_SLICE
            part = ordered if last else ordered[:SPLIT_SLICE]
            self.spent += len(part)
            pieces = [p for p in segment(part, cfg) if p]
            if last:
                pieces = pieces[:-1]  # the newest piece stays in the cluster
            if not pieces:
                continue
            if not last:
                self.more = True
            moved = 0
            for piece in pieces:
                k += 1
                ref = f"{NEW_PREFIX}split{k}"
                name = _split_name(piece, c, names)
                names.add(name.casefold())
                self.plan.clusters.append(
                    PlanCluster(
                        ref,
                        name,
                        f"Split from {c.name}: {c.description}"[:DESCRIPTION_MAX_CHARS],
                        list(c.tags),
                    )
                )
                for m in piece:
                    self.plan.assign[m.id] = ref
                moved += len(piece)
            self.taken.add(c.id)
            self.reasons.append(
                f"split {moved} of {len(live)} memories out of {c.name!r} "
                f"into {len(pieces)} clusters"
            )


def _norm(bag: Counter[str]) -> float:
    return math.sqrt(sum(v * v for v in bag.values()))


def _ts(m: Memory) -> tuple[float, str]:
    return (parse_epoch(m.created_at) or 0.0, m.id)  # an unknown time counts as the oldest


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
