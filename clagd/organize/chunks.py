"""A model sees a sample in chunks that fit its context window; `make_chunks` cuts them and
`combine` joins the chunks' plans into one."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from clagd.model import Cluster, Memory
from clagd.organize.plan import NEW_PREFIX, Plan, PlanCluster
from clagd.organize.prompts import organize_messages
from clagd.organize.sample import Snapshot
from clagd.organize.similarity import cluster_terms, terms
from clagd.scopes import DEFAULT_SCOPE
from clagd.text import estimate_tokens

MAX_CANDIDATE_CLUSTERS = 8
MAX_NEW_PER_CHUNK = 6


@dataclass
class Chunk:
    """Memories of one scope and the clusters of that scope the model may put them in."""

    memories: list[Memory]
    clusters: list[Cluster]
    scope: str = DEFAULT_SCOPE

    @property
    def max_new(self) -> int:
        return max_new_clusters(len(self.memories))


def max_new_clusters(n_memories: int) -> int:
    """New clusters a call may create: about one per two memories, at most 6."""
    return min(MAX_NEW_PER_CHUNK, max(1, math.ceil(n_memories / 2)))


def _candidates(mems: list[Memory], snap: Snapshot, limit: int, scope: str) -> list[Cluster]:
    """The clusters a chunk's memories live in, then the lexically closest others: all of
    the chunk's scope (a model never sees, so never names, another scope's cluster)."""
    own = []
    for m in mems:
        cid = snap.home.get(m.id)
        if cid and cid in snap.clusters and snap.clusters[cid] not in own:
            own.append(snap.clusters[cid])
    words: set[str] = set()
    for m in mems:
        words |= terms(m.content)
    others = [c for c in snap.clusters.values() if c not in own and c.scope == scope]
    others.sort(key=lambda c: (-len(words & cluster_terms(c)), -len(c.memories), c.id))
    return own + others[: max(0, limit - len(own))]


def _output_reserve(n_mems: int, max_new: int) -> int:
    return 40 + 10 * n_mems + 60 * max_new


Counter = Callable[[list[dict[str, str]]], int]


def _estimate(msgs: list[dict[str, str]]) -> int:
    return sum(estimate_tokens(m["content"]) for m in msgs)


def _tokens_needed(
    template: str, part: list[Memory], clusters: list[Cluster], count: Counter | None = None
) -> int:
    """Prompt plus answer of one call: the prompt counted by the backend (`count`, the
    model's own tokenizer or an estimate calibrated on the server's counts) when it can; the
    word estimate alone undercounts real prompts by about a quarter."""
    max_new = max_new_clusters(len(part))
    msgs = organize_messages(template, part, clusters, max_new)
    return (count or _estimate)(msgs) + _output_reserve(len(part), max_new)


def _by_area(snap: Snapshot) -> list[Memory]:
    """The sample ordered by its closest existing cluster (a cheap lexical pass)."""
    mems = list(snap.sample)
    order = {cid: i for i, cid in enumerate(sorted(snap.clusters))}
    profile = {cid: cluster_terms(c) for cid, c in snap.clusters.items()}

    def area(m: Memory) -> tuple[int, str]:
        cid = snap.home.get(m.id)
        if cid is None:
            w = terms(m.content)
            cid = max(profile, key=lambda k: (len(w & profile[k]), k))
        return (order.get(cid, -1), m.created_at)

    mems.sort(key=area)
    return mems


def make_chunks(
    snap: Snapshot,
    template: str,
    chunk_size: int,
    context_tokens: int,
    coarse: bool,
    count: Counter | None = None,
) -> list[Chunk]:
    """Split the sample so that every call (prompt + answer) fits the context window.

    Coarse to fine: on a large store the sample is first ordered by its closest existing
    cluster, so each chunk covers one broad area and the SLM refines clusters inside it.
    A chunk holds memories of one scope (`clagd.scopes`).
    """
    mems = _by_area(snap) if coarse and snap.clusters else list(snap.sample)
    out: list[Chunk] = []
    size = max(1, chunk_size)
    pending: list[list[Memory]] = []
    for scope in dict.fromkeys(m.scope for m in mems):
        mine = [m for m in mems if m.scope == scope]
        pending.extend(mine[i : i + size] for i in range(0, len(mine), size))
    while pending:
        part = pending.pop(0)
        clusters = _candidates(part, snap, MAX_CANDIDATE_CLUSTERS, part[0].scope)
        need = _tokens_needed(template, part, clusters, count)
        if need > context_tokens and len(part) > 1:
            half = len(part) // 2
            pending[:0] = [part[:half], part[half:]]
            continue
        while need > context_tokens and len(clusters) > 1:
            clusters = clusters[:-1]
            need = _tokens_needed(template, part, clusters, count)
        out.append(Chunk(part, clusters, part[0].scope))
    return out


def combine(plans: list[Plan], scopes: list[str] | None = None) -> Plan:
    """One plan from the chunks' plans. New clusters are renumbered per chunk, and new
    clusters with the same name (case-insensitive) in different chunks of one scope
    (`scopes`: each chunk's; None: all the default) become one."""
    out = Plan()
    by_ref: dict[str, PlanCluster] = {}
    new_by_name: dict[tuple[str, str], tuple[int, str]] = {}  # name -> (chunk, ref)
    merged: set[str] = set()
    reasons = []
    for i, p in enumerate(plans, 1):
        remap: dict[str, str] = {}
        scope = scopes[i - 1] if scopes is not None else DEFAULT_SCOPE
        for pc in p.clusters:
            if pc.ref.startswith(NEW_PREFIX):
                key = (scope, pc.name.casefold())
                if key in new_by_name and new_by_name[key][0] != i:
                    remap[pc.ref] = new_by_name[key][1]
                    continue
                ref = f"{NEW_PREFIX}{i}-{pc.ref[len(NEW_PREFIX) :]}"
                remap[pc.ref] = ref
                new_by_name.setdefault(key, (i, ref))
                pc = PlanCluster(ref, pc.name, pc.description, pc.tags, pc.merge_from)
            elif pc.ref in by_ref:
                continue  # an existing cluster renamed in two chunks: the first one wins
            srcs = [s for s in pc.merge_from if s not in merged and s != pc.ref]
            merged.update(srcs)
            pc = PlanCluster(pc.ref, pc.name, pc.description, pc.tags, srcs)
            by_ref[pc.ref] = pc
            out.clusters.append(pc)
        for mid, ref in p.assign.items():
            out.assign[mid] = remap.get(ref, ref)
        out.conflicts.extend(p.conflicts)
        if p.reason:
            reasons.append(p.reason)
    out.reason = " ".join(reasons)[:600]
    return out
