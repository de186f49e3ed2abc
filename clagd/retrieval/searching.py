"""Searching one snapshot: the two-level ranking, then the cut to the answer.

Retrieval is two-level, as in CLAG: clusters are scored by BM25 over their profile (name,
description, tags and the text of their members), the best `top_clusters` are chosen, and
memories are scored inside them (the unsorted area is always searched). Memory-level IDF comes
from the whole store, so a term that is common everywhere does not look rare inside one
small cluster. A memory's final score is its normalized BM25 score plus cluster evidence
(the normalized score of its cluster: cluster-based smoothing) plus, optionally, the evidence
of its temporal neighbours inside the cluster (a reply to a matching turn is often the answer).
The ranked hits are then cut (`cut`, the collector): deduplicated, to `max_memories`, the
token budget and the relevance cut-offs.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Collection, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import numpy as np

from clagd.protocol import Where, where_matches
from clagd.retrieval.postings import forward
from clagd.retrieval.results import (
    UNSORTED_NAME,
    Hit,
    Ranked,
    SearchResult,
    format_context,
    label_tokens,
)
from clagd.retrieval.scoping import Masks, masks
from clagd.retrieval.scoring import top
from clagd.text import estimate_tokens

if TYPE_CHECKING:
    from clagd.retrieval.snapshot import Index


def search(
    ix: Index,
    text: str,
    max_memories: int | None = None,
    token_budget: int | None = None,
    archive: Index | None = None,
    now: datetime | None = None,
    clusters: Sequence[str] | None = None,
    where: Where = (),
    scopes: Collection[str] | None = None,
    superseded: bool = False,
) -> SearchResult:
    """`Index.search` (see there)."""
    k = ix.cfg.max_memories if max_memories is None else max_memories
    budget = ix.cfg.token_budget if token_budget is None else token_budget
    if k <= 0:
        return SearchResult()
    cacheable = archive is None and now is None and not ix.cfg.use_freshness
    seen = frozenset(scopes) if scopes is not None else None
    only = tuple(clusters) if clusters is not None else None
    key = (text, k, budget, only, where, seen, superseded)
    if cacheable:
        hit = ix.results.get(key)
        if hit is not None:
            return hit
    q = ix.tokens(text)
    ts = now.timestamp() if now is not None else None
    limit = k if budget <= 0 and archive is None else k * 3 + 8
    rarity = ix.cfg.min_term_rarity > 0
    hits, chosen = rank(ix, q, limit, ts, clusters, rarity, where, seen, superseded)
    if archive is not None:
        a_hits, a_chosen = rank(
            archive,
            q,
            limit,
            ts,
            rarity=rarity,
            where=where,
            scopes=seen,
            superseded=superseded,
        )
        hits = sorted(hits + a_hits, key=lambda r: -r[0].score)
        chosen = sorted(chosen + a_chosen, key=lambda c: -c[2])
    out = cut(ix, hits, k, budget)
    context = format_context(out)
    res = SearchResult(out, chosen, context, estimate_tokens(context))
    if cacheable:
        ix.results.put(key, res)
    return res


def cut(ix: Index, hits: list[Ranked], k: int, budget: int) -> list[Hit]:
    """The ranked hits that make the answer: deduplicated, at most `k`, within the
    budget (`budget` <= 0: none), and past the relevance cut-offs (docs/retrieval.md,
    "Precision"): a hit scoring below `min_relative_score` x the best score ends the
    list; a hit that matches, by itself or through a time neighbour, no query term at
    least `min_term_rarity` x as rare (by IDF) as the rarest term the `k` best hits
    match themselves shares only generic words with the query and is skipped. The
    best hit is always kept."""
    cfg = ix.cfg
    floor = cfg.min_relative_score * hits[0][0].score if hits else 0.0
    rare = 0.0
    if cfg.min_term_rarity > 0:
        rare = cfg.min_term_rarity * max((r[2] for r in hits[:k]), default=0.0)
    out: list[Hit] = []
    seen: set[str] = set()
    used = 0
    for i, (h, cost, _, near) in enumerate(hits):
        if h.score < floor:
            break
        if h.memory.id in seen or (near < rare and i):
            continue
        if budget > 0 and used + cost > budget:
            continue
        seen.add(h.memory.id)
        used += cost
        out.append(h)
        if len(out) >= k:
            break
    return out


def cluster_candidates(
    ix: Index, text: str, n: int, scopes: Collection[str] | None = None
) -> list[tuple[str, str, float]]:
    """`Index.cluster_candidates` (see there)."""
    q = ix.term_ids(text)
    if not q or not ix.profiles.slot_of or n <= 0:
        return []
    c_scores = ix.cluster_bm25.scores(q)
    vis = masks(ix, scopes)
    if vis is not None:
        c_scores = np.where(vis[1], c_scores, np.float32(0.0))
    clusters = ix.profiles.clusters
    return [
        (clusters[i].id, clusters[i].name, float(c_scores[i]))
        for i in top(c_scores, n).tolist()
        if c_scores[i] > 0
    ]


def rank(
    ix: Index,
    words: list[str],
    limit: int,
    now: float | None,
    only: Sequence[str] | None = None,
    rarity: bool = False,
    where: Where = (),
    scopes: Collection[str] | None = None,
    superseded: bool = False,
) -> tuple[list[Ranked], list[tuple[str, str, float]]]:
    """The best `limit` memories for these query words (with the token cost of each and,
    with `rarity` (the rare-term cut is on), their query terms' weights) and the clusters
    chosen for them. `only`: the clusters the caller (SLM refinement) chose. `where`: only
    the memories this metadata filter lets through are candidates (`matching`), each
    eligible wherever it is filed.
    `scopes`: the scopes seen (None: all); every other slot scores nothing
    (`retrieval.scoping`).
    `superseded`: memories another supersedes (`clagd update`) are eligible too."""
    get = ix.vocab.get
    q = [i for i in map(get, words) if i is not None]
    if not q or ix.memories.n_alive == 0:
        return [], []
    n = len(ix.memories.alive)
    # BM25 of every slot, plus one zero at index n: a neighbour link of -1 reads it
    s = ix.memory_bm25.scores(q, pad=1)
    c_scores = ix.cluster_bm25.scores(q)
    vis = masks(ix, scopes)
    if vis is not None:
        s, c_scores, only = _hidden(ix, vis, s, c_scores, only)
    smax = float(s[:n].max()) if n else 0.0
    c_norm, selected, chosen = choose_clusters(ix, c_scores, only)
    if smax <= 0 and not chosen:
        return [], []
    cand = candidates(ix, s, selected)
    if where:
        # the filter stands in for the cluster choice: every memory it lets through
        # that has its own evidence is a candidate, and no other memory is
        own = np.flatnonzero(s > 0)
        cand = sorted_set(np.concatenate((cand, own)), len(s))
        cand = cand[matching(ix, where, cand)]
    if vis is not None:
        cand = cand[vis[0][cand]]
    score = final_scores(ix, cand, s, smax, c_norm, selected, now, bool(where))
    if ix.any_hidden:
        hid = ix.memories.hid[cand]
        if superseded:
            score[hid] *= ix.cfg.superseded_penalty
        else:
            score[hid] = 0.0
    if ix.cfg.recency_tie > 0:
        score = newer_first(ix, cand, score, s, limit)
    weight = ix.memory_bm25.weights(q) if rarity else None
    return top_hits(ix, cand, score, limit, weight), chosen


def newer_first(
    ix: Index, cand: np.ndarray, score: np.ndarray, s: np.ndarray, limit: int
) -> np.ndarray:
    """Among hits of near-equal relevance, the newer first (`retrieval.recency_tie`): an
    eligible memory whose own BM25 is within `recency_tie` (relative) of one of the
    `limit` best hits' and whose `created_at` is later ranks just above that hit
    (cluster and neighbour evidence do not decide between two statements of one fact).
    Only memories the search found are moved; one of unknown time never is. Returns the
    new scores (docs/retrieval.md, "Newer first")."""
    nz = np.flatnonzero(score)
    if len(nz) < 2:
        return score
    best = nz[np.argsort(-score[nz], kind="stable")[:limit]]
    slots, b_slots = cand[nz], cand[best]
    # (best hit, found memory) pairs, as indices into `best` and `nz`: near, then the same
    # statement; each found memory rises just above the best hit it restates
    b, c = _near(ix, b_slots, slots, s)
    lift = score[best].astype(np.float32) * np.float32(1.0001)
    # a pair that would not raise the found memory's score decides nothing
    up = lift[b] > score[nz][c]
    b, c = b[up], c[up]
    same = _same_statement(ix, b_slots, b, slots[c])
    b, c = b[same], c[same]
    if not len(b):
        return score
    lifted = np.zeros(len(nz), dtype=np.float32)
    np.maximum.at(lifted, c, lift[b])
    out = score.copy()
    out[nz] = np.maximum(out[nz], lifted)
    return out


# cells of one block of `_near`'s (best hit x found memory) test
NEAR_CELLS = 1 << 18


def _near(
    ix: Index, best: np.ndarray, found: np.ndarray, s: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The (best hit, found memory) pairs, as indices into `best` and `found` (slots),
    where the found memory is newer and its own BM25 is within `recency_tie` of the best
    hit's: all best hits at once, in blocks of at most `NEAR_CELLS` cells."""
    delta, ts = ix.cfg.recency_tie, ix.memories.ts
    t, own = ts[found], s[found]
    tb, sb = ts[best][:, None], s[best][:, None]
    step = max(1, NEAR_CELLS // max(len(found), 1))
    parts = []
    for i in range(0, max(len(best), 1), step):
        a, o = tb[i : i + step], sb[i : i + step]
        near = (t > a) & (np.abs(own - o) <= delta * np.maximum(own, o))
        b, c = np.nonzero(near)
        parts.append((b + i, c))
    if len(parts) == 1:
        return parts[0]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


# two memories are statements of one thing when they share this fraction of the shorter
# one's distinct terms (docs/retrieval.md, "Newer first")
SAME_STATEMENT = 0.6
# cells of the largest (best hit x term id) table `_shared` makes; past it, a binary search
# (measured: for ~3,600 probes the table costs 17 us at 57k cells, 46 us at 2.3M, where the
# search costs ~50 us whatever the size)
TABLE_CELLS = 1 << 21


def _same_statement(ix: Index, best: np.ndarray, b: np.ndarray, found: np.ndarray) -> np.ndarray:
    """Whether the memories in slots `best[b[k]]` and `found[k]` are statements of one
    thing (bool per pair): they share at least `SAME_STATEMENT` of the shorter one's
    distinct terms, read from the forward postings (each term of a memory once; a slot
    outside every segment has none)."""
    n, m = len(found), len(best)
    if not n:
        return np.zeros(0, dtype=bool)
    pos, tid, _ = forward(ix.memories.segs, np.concatenate((best, found)))
    mine = pos < m
    pf = pos[~mine] - m
    shared = _shared(pos[mine], tid[mine], b[pf], tid[~mine], m)
    both = np.bincount(pf[shared], minlength=n)
    terms = np.bincount(pos, minlength=m + n)
    return both >= SAME_STATEMENT * np.minimum(terms[:m][b], terms[m:])


def _shared(
    hit: np.ndarray, term: np.ndarray, p_hit: np.ndarray, p_term: np.ndarray, m: int
) -> np.ndarray:
    """Whether each probe (`p_hit`: a best hit of `m`, `p_term`: a term id) is one of the
    (best hit, term) pairs `hit`, `term`: by a table of (best hit, term id) when it is
    small, else by a binary search in their sorted keys."""
    width = int(max(term.max(initial=-1), p_term.max(initial=-1))) + 1
    if m * width <= TABLE_CELLS:
        table = np.zeros((m, width), dtype=bool)
        table[hit, term] = True
        return table[p_hit, p_term]
    keys = np.sort(hit * width + term)
    probe = p_hit * width + p_term
    at = np.minimum(np.searchsorted(keys, probe), max(len(keys) - 1, 0))
    return keys[at] == probe if len(keys) else np.zeros(len(probe), dtype=bool)


def _hidden(
    ix: Index,
    vis: Masks,
    s: np.ndarray,
    c_scores: np.ndarray,
    only: Sequence[str] | None,
) -> tuple[np.ndarray, np.ndarray, Sequence[str] | None]:
    """The scores with every slot of another scope at zero, and `only` without the
    clusters of another scope (they are never chosen, so none of their members is a
    candidate)."""
    mvis, cvis = vis
    s = np.where(mvis, s, np.float32(0.0))
    c_scores = np.where(cvis, c_scores, np.float32(0.0))
    if only is not None:
        slot_of = ix.profiles.slot_of
        only = [c for c in only if c in slot_of and cvis[slot_of[c]]]
    return s, c_scores, only


def choose_clusters(
    ix: Index, c_scores: np.ndarray, only: Sequence[str] | None
) -> tuple[np.ndarray, np.ndarray, list[tuple[str, str, float]]]:
    """(normalized cluster score, chosen?) per cluster slot, each with a last entry for
    unsorted (-1), and the chosen clusters: the `top_clusters` best with a positive
    score, or the ones `only` names."""
    c_norm = np.zeros(len(c_scores) + 1, dtype=np.float32)
    selected = np.zeros(len(c_scores) + 1, dtype=bool)
    order = np.zeros(0, dtype=np.int64)
    slot_of = ix.profiles.slot_of
    if only is not None:
        picked = [slot_of[c] for c in dict.fromkeys(only) if c in slot_of]
        order = np.asarray(picked, dtype=np.int64)
        if len(order):
            cmax = float(c_scores[order].max())
            if cmax > 0:
                c_norm[:-1] = np.maximum(c_scores / cmax, 0.0)
    elif len(c_scores) and ix.cfg.top_clusters > 0:
        order = top(c_scores, ix.cfg.top_clusters)
        order = order[c_scores[order] > 0]
        if len(order):
            c_norm[:-1] = c_scores / float(c_scores[order[0]])
    selected[order] = True
    clusters = ix.profiles.clusters
    chosen = [(clusters[i].id, clusters[i].name, float(c_scores[i])) for i in order.tolist()]
    return c_norm, selected, chosen


def candidates(ix: Index, s: np.ndarray, selected: np.ndarray) -> np.ndarray:
    """The slots worth scoring, sorted: the members of the chosen clusters, the unsorted
    memories with their own evidence, both ends of every supersedes link (the
    successor's score bounds its predecessor's) and, with time neighbours, the time
    neighbours of every one of those with its own evidence. Every other memory is not
    eligible, so the dense form over all slots gives the same result, element for
    element."""
    parts: list[np.ndarray] = [ix.uslots[s[ix.uslots] > 0]]
    members = ix.profiles.members
    parts.extend(members[i] for i in np.flatnonzero(selected[:-1]).tolist())
    if len(ix.sup_old):
        parts.extend((ix.sup_old, ix.sup_new))
    cand = sorted_set(np.concatenate(parts), len(s))
    if ix.cfg.neighbors != "time" or not ix.cfg.neighbor_weight:
        return cand
    group = ix.memories.group
    found = cand[(s[cand] > 0) & (ix.unsorted[cand] | selected[group[cand]])]
    time = ix.memories.time
    near = np.concatenate((time.prev[found], time.next[found]))
    return sorted_set(np.concatenate((cand, near[near >= 0])), len(s))


def links(ix: Index) -> tuple[np.ndarray, np.ndarray]:
    """(previous, next) neighbour of every slot, -1 = none: in time (`neighbors: time`)
    or inside the cluster (`cluster`)."""
    m = ix.memories
    if ix.cfg.neighbors == "time":
        return m.time.prev, m.time.next
    return m.prev, m.nxt


def final_scores(
    ix: Index,
    cand: np.ndarray,
    s: np.ndarray,
    smax: float,
    c_norm: np.ndarray,
    selected: np.ndarray,
    now: float | None,
    filtered: bool = False,
) -> np.ndarray:
    """Final scores of the candidates (0: not eligible): normalized BM25, plus cluster
    and neighbour evidence, times quality, superseded memories below their successors.
    `filtered`: the candidates are what a metadata filter let through, each at home
    wherever it is filed."""
    cfg, m = ix.cfg, ix.memories
    group = m.group[cand]
    sc = s[cand]
    score = sc / smax if smax > 0 else sc  # a new array either way
    if cfg.cluster_weight:
        score += cfg.cluster_weight * c_norm[group]
    # eligible: own lexical evidence, or a matching neighbour, inside a chosen cluster
    # (own evidence in the unsorted area); with time neighbours also the neighbour of
    # such a memory with its own evidence, wherever it is filed
    home = ix.unsorted[cand] | selected[group]
    if filtered:
        home = np.ones(len(cand), dtype=bool)
    eligible = (sc > 0) & home
    if cfg.neighbor_weight:
        prev, nxt = links(ix)
        lp, lx = prev[cand], nxt[cand]
        sp, sx = s[lp], s[lx]  # a link of -1 reads the zero at the end of `s`
        if smax > 0:
            sp, sx = sp / smax, sx / smax
        nb = np.maximum(sp, sx)
        score += cfg.neighbor_weight * nb
        eligible |= (nb > 0) & selected[group]
        if cfg.neighbors == "time":
            eligible |= _found(ix, lp, lx, s, selected)
            if cfg.second_neighbor_weight:
                score += cfg.second_neighbor_weight * _second(ix, lp, lx, s, smax)
    if m.n_alive != len(m.alive):
        eligible &= m.alive[cand]
    if cfg.use_freshness:
        score = score * quality(ix, now, cand)
    if len(ix.sup_old):
        old = np.searchsorted(cand, ix.sup_old)
        succ = np.searchsorted(cand, ix.sup_new)
        score[old] *= cfg.superseded_penalty
        # a superseded memory ranks below its successor
        score[old] = np.minimum(score[old], score[succ] * np.float32(0.999))
    return np.where(eligible & (score > 0), score, 0.0)


def _second(ix: Index, lp: np.ndarray, lx: np.ndarray, s: np.ndarray, smax: float) -> np.ndarray:
    """The better normalized BM25 of the memories two steps away in time, given the
    previous (`lp`) and next (`lx`) time neighbours (-1: none): a question and its
    answer are often a turn apart, with a short remark between them."""
    time = ix.memories.time
    pp = np.where(lp >= 0, time.prev[np.maximum(lp, 0)], -1)
    xx = np.where(lx >= 0, time.next[np.maximum(lx, 0)], -1)
    s2 = np.maximum(s[pp], s[xx])
    return s2 / smax if smax > 0 else s2


def _found(
    ix: Index, lp: np.ndarray, lx: np.ndarray, s: np.ndarray, selected: np.ndarray
) -> np.ndarray:
    """Whether the previous (`lp`) or the next (`lx`) neighbour (-1: none) of each slot
    has its own evidence inside a chosen cluster or the unsorted area. A link of -1
    reads the zero at the end of `s` (and the last slot's area, which that zero
    masks)."""
    both = np.concatenate((lp, lx))
    found = s[both] > 0
    found &= ix.unsorted[both] | selected[ix.memories.group[both]]
    n = len(lp)
    return found[:n] | found[n:]


def quality(ix: Index, now: float | None, slots: np.ndarray) -> np.ndarray:
    """Confidence (metadata importance) and freshness of these slots, as a multiplier
    around 1."""
    cfg, m = ix.cfg, ix.memories
    now = datetime.now(timezone.utc).timestamp() if now is None else now
    age_days = np.maximum(0.0, (now - m.ts[slots]) / 86400.0)
    fresh = np.where(
        np.isnan(age_days), 0.5, 0.5 ** (age_days / max(cfg.freshness_half_life_days, 1e-9))
    )
    mult = 1.0 + cfg.confidence_weight * (m.imp[slots] - 0.5) + cfg.freshness_weight * (fresh - 0.5)
    return np.maximum(mult, 0.0).astype(np.float32)


def top_hits(
    ix: Index,
    cand: np.ndarray,
    score: np.ndarray,
    limit: int,
    weight: dict[int, float] | None = None,
) -> list[Ranked]:
    """The `limit` best candidates as hits, each with its token cost in a context and,
    given the query terms' `weight`, its rarity (`_rarity`)."""
    nz = np.flatnonzero(score)
    if len(nz) > limit:  # the top `limit` and everything tied with the last of them
        kth = np.partition(score[nz], len(nz) - limit)[len(nz) - limit]
        nz = nz[score[nz] >= kth]
    # ties broken by memory id, not by slot: the same store gives the same order
    # however its snapshot was built
    m = ix.memories
    mems = m.mems
    ranked = zip(cand[nz].tolist(), score[nz].tolist())
    best = sorted(ranked, key=lambda p: (-p[1], mems[p[0]].id))[:limit]
    slots = [slot for slot, _ in best]
    groups = m.group[slots].tolist()
    toks = m.tok[slots].tolist()
    clusters = ix.profiles.clusters
    hits = []
    for (slot, value), g, tok in zip(best, groups, toks):
        c = clusters[g] if g >= 0 else None
        name = (c.name or c.id) if c else UNSORTED_NAME
        hit = Hit(mems[slot], c.id if c else None, name, value)
        # conservative: the estimate of a joined context never exceeds the sum of these
        cost = tok + label_tokens(name) + 1
        if weight is None:
            hits.append((hit, cost, 0.0, 0.0))
        else:
            hits.append((hit, cost, *_rarity(ix, slot, weight)))
    return hits


def _rarity(ix: Index, slot: int, weight: dict[int, float]) -> tuple[float, float]:
    """The highest weight among the query terms this memory has, and among those it or
    one of its neighbours (the ones that lift its score: `links`) has."""
    starts = [seg.start for seg in ix.memories.segs]
    prev, nxt = links(ix)
    own = _rarest(ix, slot, weight, starts)
    near = max(own, _rarest(ix, int(prev[slot]), weight, starts))
    return own, max(near, _rarest(ix, int(nxt[slot]), weight, starts))


def _rarest(ix: Index, slot: int, weight: dict[int, float], starts: list[int]) -> float:
    """The highest weight among the query terms this memory has (0 for none, or for the
    slot -1 of a missing neighbour), read from the forward postings of the segment that
    holds the slot (`starts`: the segments' first slots)."""
    if slot < 0 or not weight:
        return 0.0
    segs = ix.memories.segs
    i = bisect_right(starts, slot) - 1
    if i < 0 or slot >= segs[i].stop:
        return 0.0
    seg = segs[i]
    j = slot - seg.start
    terms = seg.ftid[int(seg.fptr[j]) : int(seg.fptr[j + 1])].tolist()
    return max((weight.get(t, 0.0) for t in terms), default=0.0)


MAX_FILTERS = 64  # filters remembered per snapshot
# queries of one filter on one snapshot before its mask is made (measured on 50k memories,
# a loaded machine: ~3-13 ms a query testing its own slots, ~70 ms for the mask once)
MASK_AFTER = 8


def matching(ix: Index, where: Where, slots: np.ndarray) -> np.ndarray:
    """Which of `slots` a metadata filter lets through (bool per slot): from the
    snapshot's mask when it has one, else from the memories themselves. A query's slots
    are a few thousand at most, so testing them costs less than the mask of a whole store
    (a pass over every memory, on every new snapshot: after each commit); the mask is made
    once the filter was asked `MASK_AFTER` times of this snapshot, when the slots are a
    large part of the store, or when `list` asks for it."""
    mask = ix.filters.get(where)
    if mask is None:
        uses = ix.filter_uses[where] = ix.filter_uses.get(where, 0) + 1
        if uses >= MASK_AFTER or len(slots) * 8 > len(ix.memories.alive):
            mask = where_mask(ix, where)
    if mask is not None:
        return mask[slots]
    mems = ix.memories.mems
    found = (where_matches(mems[i].metadata, where) for i in slots.tolist())
    return np.fromiter(found, dtype=bool, count=len(slots))


def where_mask(ix: Index, where: Where) -> np.ndarray:
    """Which slots a metadata filter lets through: a bool per slot, live ones only, plus
    a False at the end (the padded score array's index -1). One pass over the snapshot's
    memories per filter, remembered by the snapshot (it never changes)."""
    mask = ix.filters.get(where)
    if mask is not None:
        return mask
    m = ix.memories
    n = len(m.alive)
    mask = np.zeros(n + 1, dtype=bool)
    mems = m.mems
    for slot in np.flatnonzero(m.alive).tolist():
        if where_matches(mems[slot].metadata, where):
            mask[slot] = True
    if len(ix.filters) >= MAX_FILTERS:
        ix.filters.clear()
        ix.filter_uses.clear()
    ix.filters[where] = mask
    return mask


def sorted_set(slots: np.ndarray, n: int) -> np.ndarray:
    """The distinct slots, sorted (int64), as `np.unique` gives them: by a mark over all `n`
    slots when there are many (linear, no sort: a burst leaves thousands of unsorted
    memories with their own evidence), by sorting when there are few (one sort and a mask:
    `np.unique` costs ~30 us more for a few hundred slots)."""
    if len(slots) * 16 < n:
        out = slots.astype(np.int64)  # a copy, sorted in place
        out.sort()
        if len(out) < 2:
            return out
        keep = np.empty(len(out), dtype=bool)
        keep[0] = True
        np.not_equal(out[1:], out[:-1], out=keep[1:])
        return out[keep]
    mark = np.zeros(n, dtype=bool)
    mark[slots] = True
    return np.flatnonzero(mark).astype(np.int64)
