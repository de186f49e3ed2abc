"""The size policy: a planner that needs no model and keeps clusters a useful size.

Run at the end of every session that had something to organize (`session._size_policy_op`),
whatever organized it: clusters over `max_cluster_size` are split in two, near-duplicate
clusters merged, near-identical memories folded into one. Like the lexical organizer (`lexical.py`) it reads only words.
"""

from __future__ import annotations

from clagd.model import Cluster, Memory
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
from clagd.organize.similarity import count_cosine, jaccard, term_counts, terms
from clagd.text import tokenize

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
            if a.scope != b.scope:
                continue  # a cluster never mixes scopes
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
