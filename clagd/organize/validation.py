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
  each new or renamed cluster's name must find their cluster (among the top clusters a query
  searches) about as often as before the change.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from clagd.config import SessionConfig
from clagd.model import Cluster, Memory
from clagd.organize.examples import Examples, copied
from clagd.organize.plan import NEW_PREFIX, Plan
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


def _doc(c: Cluster) -> list[str]:
    return tokenize(" ".join([c.name, c.description, *c.tags, *(m.content for m in c.memories)]))


@dataclass
class _Ranker:
    """Cluster-level ranking as a query sees it: terms weighted by IDF over clusters."""

    ids: list[str]
    docs: list[Counter[str]]
    idf: dict[str, float]

    @classmethod
    def of(cls, clusters: Mapping[str, Cluster]) -> _Ranker:
        ids = sorted(clusters)
        docs = [Counter(_doc(clusters[c])) for c in ids]
        df: Counter[str] = Counter(t for d in docs for t in d)
        n = len(docs)
        idf = {t: math.log(1 + (n - k + 0.5) / (k + 0.5)) for t, k in df.items()}
        return cls(ids, docs, idf)

    def rank(self, query: list[str], cid: str) -> int | None:
        """1-based rank of cluster `cid` for `query` (None: not among the matching ones)."""
        if cid not in self.ids:
            return None
        q = set(query)
        scores = {
            c: sum(self.idf[t] * (1 + math.log(d[t])) for t in q if t in d)
            for c, d in zip(self.ids, self.docs)
        }
        mine = scores[cid]
        if mine <= 0:
            return None
        return 1 + sum(1 for c, s in scores.items() if s > mine)


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
) -> tuple[float, float, list[str]]:
    """(share found before, share found after, notes). A moved memory's pseudo-query (its
    rarest terms) counts as found before when it was unsorted (the unsorted area is always
    searched) or its old cluster ranked within `top`; after, when its new cluster does. The
    profile query of each new or changed cluster (the rarest terms its members share) must
    find that cluster within `top` after the change."""
    df: Counter[str] = Counter()
    n = 0
    for c in after.values():
        for m in c.memories:
            df.update(set(tokenize(m.content)))
            n += 1
    common = max(2, n // 2)
    rb, ra = _Ranker.of(before), _Ranker.of(after)
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
        old = home_before.get(mid)
        r_old = rb.rank(q, old) if old else 1
        was.append(r_old is not None and r_old <= top)
        r_new = ra.rank(q, home_after.get(mid, ""))
        now.append(r_new is not None and r_new <= top)
        if not now[-1]:
            notes.append(f"{' '.join(q)!r} does not find the cluster of {mid}")
    for cid in touched:
        cl = after.get(cid)
        if cl is None or not cl.memories:
            continue
        # the profile's pseudo-query: the rarest terms several of its members share (or
        # the rarest of its one member): what a query about this cluster would contain
        counts: Counter[str] = Counter(t for m in cl.memories for t in set(tokenize(m.content)))
        counts = Counter({t: k for t, k in counts.items() if df.get(t, 0) <= common})
        shared = [t for t, k in counts.items() if k >= 2] or list(counts)
        q = sorted(shared, key=lambda t: (df.get(t, 0), t))[:QUERY_TERMS]
        if not q:
            continue
        r = ra.rank(q, cid)
        now.append(r is not None and r <= top)
        if not now[-1]:
            notes.append(f"profile query {' '.join(q)!r} does not find {cl.name!r}")
    return _found(was), _found(now), notes


def retrievability_problem(before: float, after: float, notes: list[str]) -> str | None:
    if after + RETRIEVABILITY_TOLERANCE >= before:
        return None
    shown = "; ".join(notes[:2])
    return (
        f"retrievability fell from {before:.0%} to {after:.0%} of pseudo-queries "
        f"finding their cluster ({shown})"
    )
