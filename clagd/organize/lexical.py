"""The lexical organizer: clustering without a model (the `none` backend and the fallback).

An agent's memories arrive as episodes: bursts of related memories close in time (a
conversation, a task), separated by longer pauses. The organizer therefore clusters in two
steps. First time: sorted by created_at, a gap longer than `episode_gap_minutes` starts a new
episode. Then topic: an episode longer than `target_cluster_size` is split recursively where
lexical cohesion between the memories before and after a point is lowest (TextTiling, Hearst
1997). Episodes that continue an existing cluster (close in time, similar in words) join it;
clusters larger than `max_cluster_size` are split; near-duplicate clusters (TF-IDF cosine of
at least `merge_similarity`) are merged. Names are the cluster's most distinctive words.

Retrieval profits from this shape: a query that matches one memory of an episode lifts the
cluster, and with it the turns around the match that answer it in other words.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone

from clagd.config import SessionConfig
from clagd.model import Cluster, Memory, new_cluster_id, now_iso, parse_epoch, parse_time
from clagd.organize.plan import Plan, PlanCluster
from clagd.organize.similarity import TfIdf, unit_cosine
from clagd.store.holds import pausing
from clagd.text import tokenize

_WINDOW = 4  # memories on each side when measuring cohesion across a possible boundary
_JOIN_SIMILARITY = 0.15  # an episode joins the cluster it continues only if this similar
_NAME_WORDS = 3
# words too common in conversation to name anything (stems, as the tokenizer gives them)
_GENERIC = frozenset(
    tokenize(
        """first next last really currently tomorrow today yesterday tonight wait thanks thank
        great good nice cool awesome amazing wow sure yes okay ok hey hi hello lot lots thing
        things stuff something anything everything time times day days week weeks month
        months year years always never ever still even much many way ways kind sort feel
        feeling glad happy sound sounds look looks know think got get getting make made
        going go went come came see seen saw said say tell told want wanted like love
        definitely totally absolutely probably maybe actually pretty super well back new
        old big little long keep kept take took mean means fun"""
    )
)


def _ts(m: Memory) -> float:
    return parse_epoch(m.created_at) or 0.0  # an unknown time counts as the oldest


def _episodes(mems: list[Memory], gap_seconds: float) -> list[list[Memory]]:
    out: list[list[Memory]] = []
    last = None
    for m in mems:
        t = _ts(m)
        if last is None or t - last > gap_seconds:
            out.append([])
        out[-1].append(m)
        last = t
    return out


def _split(seq: list[Memory], target: int, min_size: int, corpus: TfIdf) -> list[list[Memory]]:
    """Split at the lowest lexical cohesion until every piece is at most `target` long."""
    if len(seq) <= target:
        return [seq]
    lo, hi = min_size, len(seq) - min_size
    if lo > hi:
        lo = hi = len(seq) // 2
    best, best_i = math.inf, len(seq) // 2
    mid = len(seq) / 2
    for i in range(lo, hi + 1):
        left = corpus.vec(m.id for m in seq[max(0, i - _WINDOW) : i])
        right = corpus.vec(m.id for m in seq[i : i + _WINDOW])
        # prefer balanced splits slightly when cohesion ties
        c = unit_cosine(left, right) + 0.01 * abs(i - mid) / len(seq)
        if c < best:
            best, best_i = c, i
    return _split(seq[:best_i], target, min_size, corpus) + _split(
        seq[best_i:], target, min_size, corpus
    )


def _segment(mems: list[Memory], cfg: SessionConfig, corpus: TfIdf) -> list[list[Memory]]:
    target = max(1, min(cfg.target_cluster_size, cfg.max_cluster_size))
    min_size = max(cfg.min_cluster_size, target // 3, 1)
    pieces: list[list[Memory]] = []
    for ep in _episodes(mems, cfg.episode_gap_minutes * 60.0):
        pieces.extend(_split(ep, target, min_size, corpus))
    return pieces


# clusters a session's loose memories may continue, at most (the nearest in time); with
# the clusters of the sampled memories, what a lexical plan reads (issue 26)
NEIGHBOURS = 40


class NewestTimes:
    """Each cluster's newest member time, kept while its member list is the same (by size
    and first and last member objects: a memory is never changed in place). One per store,
    kept by its engine (`size_policy.SessionMemo`), never shared with another store's; a
    fresh one costs the times again, never an answer."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[tuple[int, int, int], float]] = {}

    def of(self, c: Cluster) -> float:
        key = (len(c.memories), id(c.memories[0]), id(c.memories[-1]))
        got = self._seen.get(c.id)
        if got is not None and got[0] == key:
            return got[1]
        ts = max(_ts(m) for m in c.memories)
        self._seen[c.id] = (key, ts)
        return ts


def neighbourhood(
    memories: list[Memory], home: Mapping[str, str], clusters: Mapping[str, Cluster],
    cfg: SessionConfig, newest: NewestTimes | None = None,
) -> list[Cluster]:  # fmt: skip
    """The clusters a plan for the sampled `memories` reads: those holding a sampled
    memory (`home`: memory id -> cluster id) and the `NEIGHBOURS` whose newest memory is
    nearest before the loose memories' times (within the episode gap: the only ones an
    episode may continue). Not every cluster: a session at 100k memories would otherwise
    read all of them, on the writer. A store with few clusters gives all. `newest`: the
    store's (None: a fresh one)."""
    if len(clusters) <= NEIGHBOURS:
        return list(clusters.values())
    own = {cid for mid, cid in home.items() if cid in clusters}
    loose = [_ts(m) for m in memories if m.id not in home]
    near: list[tuple[float, str]] = []
    if loose:
        if newest is None:
            newest = NewestTimes()
        lo, hi = min(loose) - cfg.episode_gap_minutes * 60.0, max(loose)
        for cid, c in pausing(clusters.items(), 256):
            if cid in own or not c.memories:
                continue
            t = newest.of(c)
            if lo <= t <= hi:
                near.append((hi - t, cid))
    picked = own | {cid for _d, cid in sorted(near)[:NEIGHBOURS]}
    return [c for cid, c in clusters.items() if cid in picked]


def segment(mems: list[Memory], cfg: SessionConfig) -> list[list[Memory]]:
    """`mems` (in time order) cut as a session cuts unsorted memories: episodes by time,
    then topic shifts, into pieces of at most `target_cluster_size` (the size policy's
    split of an over-large cluster)."""
    return _segment(mems, cfg, TfIdf(mems))


class _Group:
    """A cluster being planned: an existing cluster (ref = its id) or a new one."""

    def __init__(self, ref: str, existing: Cluster | None = None) -> None:
        self.ref = ref
        self.existing = existing
        self.members: list[Memory] = list(existing.memories) if existing else []
        self.merge_from: list[str] = []

    @property
    def last_ts(self) -> float:
        return max((_ts(m) for m in self.members), default=-math.inf)


class _Grouping:
    """The clusters being planned, and where each memory is in them."""

    def __init__(self, clusters: list[Cluster], first_new: int = 0) -> None:
        self.home: dict[str, str] = {m.id: c.id for c in clusters for m in c.memories}
        self.groups: dict[str, _Group] = {c.id: _Group(c.id, c) for c in clusters}
        self.new_count = 0
        self.first_new = first_new  # new refs of this grouping start after it

    def new_group(self) -> _Group:
        self.new_count += 1
        g = _Group(f"new:{self.first_new + self.new_count}")
        self.groups[g.ref] = g
        return g

    def move(self, m: Memory, dst: _Group) -> None:
        groups, src = self.groups, self.home.get(m.id)
        if src is not None and src in groups and src != dst.ref:
            groups[src].members = [x for x in groups[src].members if x.id != m.id]
        self.home[m.id] = dst.ref
        if all(x.id != m.id for x in dst.members):
            dst.members.append(m)


def _provisional(
    memories: list[Memory], clusters: list[Cluster], home: dict[str, str], gap: float
) -> set[str]:
    """Sampled members of clusters that ingest routing put there, to be organized again
    with the unsorted memories of their episode.

    Routing files each new memory by topic alone into an older cluster: an episode that
    arrives in one batch ends up scattered (its routed turns in old clusters from other
    days, the rest unsorted), its replies lose their time neighbours, and the next session,
    which only segments unsorted memories, never puts it back together. A routed run is
    recognisable without any label: a later run of a cluster's members, separated from the
    rest of the cluster by more than the episode gap. Such a run, when every member of it is
    in the sample and it shares an episode with unsorted sampled memories, goes back to the
    loose pool; a run without unsorted company stays where routing put it.
    """
    sampled = {m.id for m in memories}
    # only clusters with a sampled member can hold a wholly sampled run (a large store has
    # thousands of clusters and a sample of 100)
    touched = {home[mid] for mid in sampled if mid in home}
    runs: set[str] = set()
    for c in clusters:
        if c.id not in touched:
            continue
        ms = sorted(c.memories, key=lambda m: (_ts(m), m.id))
        for run in _episodes(ms, gap)[1:]:
            if all(m.id in sampled for m in run):
                runs.update(m.id for m in run)
    if not runs:
        return set()
    pool = sorted(
        (m for m in memories if m.id in runs or m.id not in home), key=lambda m: (_ts(m), m.id)
    )
    out: set[str] = set()
    for ep in _episodes(pool, gap):
        if any(m.id not in home for m in ep):
            out.update(m.id for m in ep if m.id in runs)
    return out


def organize(
    memories: list[Memory],
    clusters: list[Cluster],
    cfg: SessionConfig | None = None,
    now: str | None = None,
    other_names: Iterable[str] = (),
) -> Plan:
    """A plan for the sampled `memories` (unsorted ones and members of `clusters`). Each
    scope (`clagd.scopes`) is organized on its own, with its own word statistics: no
    cluster of the plan mixes scopes, and one user's words never name another's cluster.
    `other_names`: names of clusters it is not given, which a new name must not take."""
    cfg = cfg or SessionConfig()
    now = now or now_iso()
    taken = {n.lower() for n in other_names}  # new names are added as they are given
    scopes = sorted({m.scope for m in memories} | {c.scope for c in clusters})
    if len(scopes) <= 1:
        return _organize_scope(memories, clusters, cfg, 0, taken)
    plans: list[Plan] = []
    first = 0
    for scope in scopes:
        mine = [m for m in memories if m.scope == scope]
        if not mine:
            continue
        theirs = [c for c in clusters if c.scope == scope]
        plans.append(_organize_scope(mine, theirs, cfg, first, taken))
        first += sum(pc.ref.startswith("new:") for pc in plans[-1].clusters)
    return Plan(
        clusters=[pc for p in plans for pc in p.clusters],
        assign={mid: ref for p in plans for mid, ref in p.assign.items()},
        conflicts=[],
        reason="; ".join(p.reason for p in plans) + f" (in {len(plans)} scopes)",
    )


def _organize_scope(
    memories: list[Memory],
    clusters: list[Cluster],
    cfg: SessionConfig,
    first_new: int,
    taken: set[str],
) -> Plan:
    """`organize` of memories and clusters of one scope; new refs after `first_new`, new
    names not in `taken` (lower case; it gets them)."""
    sampled = {m.id: m for m in memories}
    corpus = TfIdf([*memories, *(m for c in clusters for m in c.memories)])
    grouping = _Grouping(clusters, first_new)
    # 0. routed runs rejoin the unsorted memories of their episode (docs/retrieval.md)
    for mid in _provisional(memories, clusters, grouping.home, cfg.episode_gap_minutes * 60.0):
        g = grouping.groups[grouping.home.pop(mid)]
        g.members = [x for x in g.members if x.id != mid]
    # 1. unsorted memories -> episodes -> continue an existing cluster, or a new one
    _place_loose(memories, grouping, corpus, cfg)
    # 2. split clusters over the size limit (only sampled members can move)
    _split_large(grouping, sampled, corpus, cfg)
    # 3. merge near-duplicates
    _merge(grouping, corpus, cfg)
    # 4. names, descriptions, tags; the plan
    plan_clusters = _plan_clusters(grouping, sampled, corpus, taken)
    refs = {pc.ref for pc in plan_clusters}
    home = grouping.home
    # group by group, members in order, so applying the plan appends them in arrival order
    assign = {
        m.id: g.ref
        for g in grouping.groups.values()
        if g.ref in refs
        for m in g.members
        if m.id in sampled and home.get(m.id) == g.ref
    }
    # a sampled memory of an untouched cluster cannot exist (sampled => touched)
    reason = (
        f"lexical organizer: {len(sampled)} memories into {len(plan_clusters)} clusters "
        f"({grouping.new_count} new) by time episodes and topic shifts"
    )
    return Plan(clusters=plan_clusters, assign=assign, conflicts=[], reason=reason)


def _place_loose(
    memories: list[Memory], grouping: _Grouping, corpus: TfIdf, cfg: SessionConfig
) -> None:
    """Unsorted memories, cut into episodes; an episode continues the cluster it follows
    closely in time and words, or starts a new one."""
    # a stable sort on time alone: memories with the same created_at (a batch add) keep the
    # order they arrived in, never an order by content hash
    loose = sorted((m for m in memories if m.id not in grouping.home), key=_ts)
    gap = cfg.episode_gap_minutes * 60.0
    # steps of work off the writer give way to writes (`store/holds.py`)
    for piece in pausing(_segment(loose, cfg, corpus)):
        target = None
        first = _ts(piece[0])
        pv = corpus.vec(m.id for m in piece)
        best = _JOIN_SIMILARITY
        for g in grouping.groups.values():
            if not g.members or len(g.members) + len(piece) > cfg.target_cluster_size:
                continue
            if 0 <= first - g.last_ts <= gap:
                sim = unit_cosine(pv, corpus.vec(m.id for m in g.members))
                if sim >= best:
                    best, target = sim, g
        dst = target or grouping.new_group()
        for m in piece:
            grouping.move(m, dst)


def _split_large(
    grouping: _Grouping, sampled: dict[str, Memory], corpus: TfIdf, cfg: SessionConfig
) -> None:
    for g in list(grouping.groups.values()):
        if len(g.members) <= cfg.max_cluster_size:
            continue
        movable = sorted((m for m in g.members if m.id in sampled), key=_ts)
        pieces = _split(movable, cfg.target_cluster_size, cfg.min_cluster_size, corpus)
        for piece in pieces[1:]:
            if len(g.members) <= cfg.max_cluster_size:
                break
            dst = grouping.new_group()
            for m in piece:
                grouping.move(m, dst)


def _plan_clusters(
    grouping: _Grouping, sampled: dict[str, Memory], corpus: TfIdf, taken: set[str]
) -> list[PlanCluster]:
    """The clusters the plan touches, each with a name, description and tags: an existing
    cluster keeps its own (missing ones are filled in), a new one gets distinct ones (from
    each other and from `taken`, lower case)."""
    plan_clusters: list[PlanCluster] = []
    live = [g for g in grouping.groups.values() if g.members or g.merge_from]
    for g in live:
        if g.existing is not None and g.existing.name:
            taken.add(g.existing.name.lower())
    for g in pausing(live):
        touched = g.existing is None or any(m.id in sampled for m in g.members) or g.merge_from
        if not touched:
            continue
        if g.existing is not None and g.existing.name:
            name, desc, tags = g.existing.name, g.existing.description, list(g.existing.tags)
            if not desc or not tags:
                _, d2, t2 = _describe(g.members, corpus, taken)
                desc, tags = desc or d2, tags or t2
        else:
            name, desc, tags = _describe(g.members, corpus, taken)
            taken.add(name.lower())
        plan_clusters.append(PlanCluster(g.ref, name, desc, tags, list(g.merge_from)))
    return plan_clusters


def _merge(grouping: _Grouping, corpus: TfIdf, cfg: SessionConfig) -> None:
    """Merge clusters whose TF-IDF profiles are near-duplicates, within the size limit."""
    groups = grouping.groups
    gone: set[str] = set()
    for sim, a, b in _similar_pairs(groups, corpus):
        if sim < cfg.merge_similarity:
            break
        if a in gone or b in gone:
            continue
        ga, gb = groups[a], groups[b]
        if len(ga.members) + len(gb.members) > cfg.max_cluster_size:
            continue
        # keep an existing cluster as the survivor when there is one
        if ga.existing is None and gb.existing is not None:
            ga, gb = gb, ga
        if gb.existing is not None:
            ga.members.extend(x for x in gb.members if x not in ga.members)
            ga.merge_from.append(gb.ref)
            ga.merge_from.extend(gb.merge_from)
            gb.members = []
        else:
            for m in list(gb.members):
                grouping.move(m, ga)
        gone.add(gb.ref)


def _similar_pairs(groups: dict[str, _Group], corpus: TfIdf) -> list[tuple[float, str, str]]:
    """(cosine, ref, ref) of the candidate pairs of non-empty groups, most similar first.
    Candidates share one of their top terms (avoids comparing every pair)."""
    live = [g for g in groups.values() if g.members]
    vecs = {g.ref: corpus.vec(m.id for m in g.members) for g in pausing(live)}
    buckets: dict[str, list[str]] = {}
    for ref, v in vecs.items():
        for t in sorted(v, key=lambda t: -v[t])[:5]:
            buckets.setdefault(t, []).append(ref)
    pairs: set[tuple[str, str]] = set()
    for refs in buckets.values():
        for i, a in enumerate(refs[:50]):
            for b in refs[i + 1 : 50]:
                pairs.add((a, b) if a < b else (b, a))
    return sorted(
        ((unit_cosine(vecs[a], vecs[b]), a, b) for a, b in pairs), key=lambda x: (-x[0], x[1], x[2])
    )


def describe_groups(
    groups: list[tuple[str, list[Memory]]], taken: set[str]
) -> dict[str, tuple[str, str, list[str]]]:
    """ref -> the lexical profile (name, description, tags) of each group, as a session
    names the clusters it makes: words distinctive among these memories, names distinct
    from `taken` (casefolded; the names given are added to it) and from each other."""
    corpus = TfIdf(m for _ref, members in groups for m in members)
    out: dict[str, tuple[str, str, list[str]]] = {}
    for ref, members in groups:
        out[ref] = _describe(members, corpus, taken)
        taken.add(out[ref][0].casefold())
    return out


def _describe(members: list[Memory], corpus: TfIdf, taken: set[str]) -> tuple[str, str, list[str]]:
    """Name (2-5 distinctive words, distinct from `taken`), one-sentence description, tags."""
    picked = _name_words(members, corpus)
    name = _distinct_name(picked, taken)
    tags = picked[:5]
    when = _date_label(members)
    about = ", ".join(picked[:3])
    desc = f"{len(members)} memories about {about}" + (f", {when}." if when else ".")
    return name, desc, tags


def _name_words(members: list[Memory], corpus: TfIdf) -> list[str]:
    """The members' most distinctive words, as written (at least two, with fillers)."""
    cover: Counter[str] = Counter()
    for m in members:
        cover.update(corpus.tf.get(m.id, {}).keys())
    # distinctive: in many of the members, rare in the store; numbers make poor names
    shared = len(members) > 2
    ranked = sorted(
        (t for t in cover if not t.isdigit() and len(t) > 2 and t not in _GENERIC),
        # words several members share make better names than one rare word
        key=lambda t: (
            -(cover[t] >= 2 if shared else 1),
            -cover[t] * corpus.idf.get(t, 1.0) ** 2,
            t,
        ),
    )
    contents = [m.content for m in members]
    surface = [corpus.surface_word(t, contents) for t in ranked[:8]]
    picked = [w for w in dict.fromkeys(surface) if w]
    for filler in ("misc", "notes"):
        if len(picked) < 2 and filler not in picked:
            picked.append(filler)
    return picked


def _distinct_name(picked: list[str], taken: set[str]) -> str:
    """The first of 3, 4, 5 words, then pairs, not in `taken`; else numbered."""
    options = [picked[:n] for n in (_NAME_WORDS, 4, 5) if len(picked) >= n]
    options += [[picked[0], w] for w in picked[1:]] + [picked[:2]]
    name = ""
    for ws in options:
        cand = " ".join(w.capitalize() for w in ws)
        if cand.lower() not in taken:
            name = cand
            break
    k = 2
    while not name or name.lower() in taken:
        name = " ".join(w.capitalize() for w in picked[:3]) + f" {k}"
        k += 1
    return name


def _date_label(members: list[Memory]) -> str:
    times = sorted(_ts(m) for m in members if parse_time(m.created_at))
    if not times:
        return ""

    def fmt(t: float) -> str:
        return datetime.fromtimestamp(t, timezone.utc).strftime("%d %b %Y").lstrip("0")

    a, b = fmt(times[0]), fmt(times[-1])
    return a if a == b else f"{a} to {b}"


def organize_all(
    memories: list[Memory], cfg: SessionConfig | None = None, now: str | None = None
) -> list[Cluster]:
    """A full clustering pass over a whole store of unsorted memories (for eval and tools)."""
    cfg = cfg or SessionConfig()
    now = now or now_iso()
    plan = organize(memories, [], cfg, now)
    by_id = {m.id: m for m in memories}
    out: list[Cluster] = []
    for pc in plan.clusters:
        mems = sorted(
            (by_id[mid] for mid, ref in plan.assign.items() if ref == pc.ref),
            key=_ts,
        )
        if mems:
            out.append(
                Cluster(new_cluster_id(), pc.name, pc.description, list(pc.tags), now, now, mems)
            )
    return out
