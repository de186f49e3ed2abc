"""Validation that catches a model's junk whatever the competence gate said, label-free.

Run on every model plan before it is applied (`plan_junk`), and after it is applied, before
the session keeps it (`retrievability`, `incoherent`):

- copies of the prompt's few-shot examples (names, descriptions, the reason, the whole
  assignment), see `examples.py`;
- looping text (a description or reason that repeats itself until cut off);
- one cluster for everything: the whole sample in one cluster where the lexical organizer
  sees several topics;
- a NEW for everything: most memories alone in a new cluster of their own (new clusters
  the model never names are refused by `validate_plan`; scattered pairs of unrelated
  memories by the checks below);
- the cheap lexical coherence check on every assignment (a memory sharing no term with its
  cluster but at least two with another one);
- retrievability: pseudo-queries built from each moved memory's distinctive terms and from
  each new or changed cluster's shared terms must find their cluster (ranked by the index's
  own cluster-level BM25, `similarity.ClusterScores`) about as often as before the change.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from clagd.config import SessionConfig
from clagd.model import Cluster, Memory
from clagd.organize.examples import Examples, copied
from clagd.organize.plan import NEW_PREFIX, Plan
from clagd.organize.similarity import ClusterScores, surface_query
from clagd.text import tokenize

LOOP_MIN_TOKENS = 12
LOOP_MAX_UNIQUE = 0.45  # a text of 12+ words with fewer distinct words than this is a loop
ALL_IN_ONE_MIN = 6
RETRIEVABILITY_TOLERANCE = 0.15
QUERY_TERMS = 3


def looping(text: str) -> bool:
    """A text that repeats itself ("she's a little baby, she's a little baby, ...")."""
    ws = text.casefold().split()
    if len(ws) < LOOP_MIN_TOKENS:
        return False
    if len(set(ws)) / len(ws) < LOOP_MAX_UNIQUE:
        return True
    grams = Counter(zip(ws, ws[1:], ws[2:]))
    return bool(grams) and grams.most_common(1)[0][1] >= 3


def plan_junk(
    data: Mapping[str, Any] | None,
    plan: Plan,
    examples: Examples,
    sample: list[Memory],
    lexical_groups: int,
    cfg: SessionConfig,
) -> list[str]:
    """Why a model's plan is junk ([] = not junk). `data` is the answer as the model wrote
    it (aliases); `lexical_groups` is how many groups the lexical organizer makes of the same
    sample."""
    problems = copied(data, examples) if data is not None else []
    texts = [(f"name of {pc.name!r}", pc.name) for pc in plan.clusters]
    texts += [(f"description of {pc.name!r}", pc.description) for pc in plan.clusters]
    texts.append(("reason", plan.reason))
    problems += [f"the {what} loops: {text[:60]!r}" for what, text in texts if looping(text)]
    sizes = Counter(plan.assign.values())
    n = len(plan.assign)
    if n >= ALL_IN_ONE_MIN and len(sizes) == 1 and lexical_groups >= 2:
        problems.append(
            f"all {n} memories in one cluster, where the lexical organizer sees "
            f"{lexical_groups} topics"
        )
    alone = sum(1 for ref, k in sizes.items() if ref.startswith(NEW_PREFIX) and k == 1)
    if n >= 4 and cfg.min_cluster_size >= 2 and alone > n / 2:
        problems.append(f"{alone} of {n} memories each alone in a new cluster")
    return problems


# -- retrievability ----------------------------------------------------------------------


def distinctive(m: Memory, df: Mapping[str, int], common: int, k: int = QUERY_TERMS) -> list[str]:
    """The memory's `k` rarest terms that other memories share too: what a query about its
    topic would contain. A term no other memory has finds the memory wherever it is filed,
    and a term in more than `common` memories ("user") finds everything: neither says
    anything about the grouping. [] when the memory has no such term (it is not asked)."""
    terms = [t for t in set(tokenize(m.content)) if 2 <= df.get(t, 0) <= common]
    return sorted(terms, key=lambda t: (df.get(t, 0), t))[:k]


def _found(rate: list[bool]) -> float:
    return sum(rate) / len(rate) if rate else 1.0


def retrievability(
    before: Mapping[str, Cluster],
    after: Mapping[str, Cluster],
    moved: Iterable[str],
    home_before: Mapping[str, str | None],
    home_after: Mapping[str, str],
    touched: Iterable[str],
    top: int,
    scored_after: ClusterScores | None = None,
) -> tuple[float, float, list[str]]:
    """(share found before, share found after, notes). A moved memory's pseudo-query (its
    rarest terms) counts as found before when it was unsorted (the unsorted area is always
    searched) or its old cluster ranked within `top`; after, when its new cluster does. The
    profile query of each new or changed cluster (the rarest terms its members share) must
    find that cluster within `top` after the change. `scored_after`: `after` already
    scored (`ClusterScores(after)`), when the caller has it."""
    df: Counter[str] = Counter()
    n = 0
    for c in after.values():
        for m in c.memories:
            df.update(set(tokenize(m.content)))
            n += 1
    common = max(2, n // 2)
    rb, ra = ClusterScores(before), scored_after or ClusterScores(after)
    was: list[bool] = []
    now: list[bool] = []
    notes: list[str] = []
    by_id = {m.id: m for c in after.values() for m in c.memories}
    for mid in moved:
        mem = by_id.get(mid)
        if mem is None:
            continue
        q = distinctive(mem, df, common)
        if not q:
            continue
        text = surface_query(q, mem.content)
        old = home_before.get(mid)
        r_old = rb.rank(text, old) if old else 1
        was.append(r_old is not None and r_old <= top)
        r_new = ra.rank(text, home_after.get(mid, ""))
        now.append(r_new is not None and r_new <= top)
        if not now[-1]:
            notes.append(f"{' '.join(q)!r} does not find the cluster of {mid}")
    for cid in touched:
        cl = after.get(cid)
        q = _profile_query(cl, df, common) if cl is not None else []
        if cl is None or not q:
            continue
        r = ra.rank(surface_query(q, " ".join(m.content for m in cl.memories)), cid)
        now.append(r is not None and r <= top)
        if not now[-1]:
            notes.append(f"profile query {' '.join(q)!r} does not find {cl.name!r}")
    return _found(was), _found(now), notes


def _profile_query(cl: Cluster, df: Mapping[str, int], common: int) -> list[str]:
    """A cluster's pseudo-query: the rarest terms several of its members share (or the
    rarest of its one member): what a query about this cluster would contain."""
    counts: Counter[str] = Counter(t for m in cl.memories for t in set(tokenize(m.content)))
    counts = Counter({t: k for t, k in counts.items() if df.get(t, 0) <= common})
    shared = [t for t, k in counts.items() if k >= 2] or list(counts)
    return sorted(shared, key=lambda t: (df.get(t, 0), t))[:QUERY_TERMS]


def retrievability_problem(before: float, after: float, notes: list[str]) -> str | None:
    if after + RETRIEVABILITY_TOLERANCE >= before:
        return None
    shown = "; ".join(notes[:2])
    return (
        f"retrievability fell from {before:.0%} to {after:.0%} of pseudo-queries "
        f"finding their cluster ({shown})"
    )
