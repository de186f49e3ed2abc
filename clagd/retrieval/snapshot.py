"""The immutable index snapshot that queries read: `Index`.

A snapshot is built only by its own constructors: `Index(cfg, ingest)` (empty) or
`Index.for_config`, `Index.build` (a whole store at once), `Index(..., memories, profiles)`
from prepared parts (`retrieval.bulk`, the start-up loader's path), and `apply` (the
incremental change, `retrieval.writing`), which returns a new snapshot sharing every
unchanged array with the old one. When dead slots outnumber live ones the snapshot is
compacted (rebuilt from its postings, without re-tokenizing). What a snapshot stores is its
settings, its vocabulary and its two levels' parts (`postings.MemorySlots`,
`postings.ClusterSlots`); everything else is derived from them in `__init__`, which is also
what unpickling calls. Share a snapshot freely between threads.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

import numpy as np

from clagd.change import IndexChange
from clagd.config import Config, IngestConfig, RetrievalConfig
from clagd.model import Cluster, Memory
from clagd.protocol import Where
from clagd.retrieval import listing, routing, searching
from clagd.retrieval.postings import ClusterSlots, MemorySlots, forward
from clagd.retrieval.results import Hit, ResultCache, SearchResult
from clagd.retrieval.scoping import carry_held
from clagd.retrieval.scoring import BM25
from clagd.retrieval.writing import (
    DEAD_CLUSTERS_MIN,
    LooseTids,
    TermsOf,
    clusters_compacted,
    written,
)
from clagd.text import tokenize


class Index:
    """One immutable snapshot of the store for retrieval (see the module docstring). Its
    attributes are read by the other retrieval modules and written by none."""

    FORMAT = 6  # of the pickled form (the engine's warm start)

    def __init__(
        self,
        cfg: RetrievalConfig | None = None,
        ingest: IngestConfig | None = None,
        vocab: dict[str, int] | None = None,
        memories: MemorySlots | None = None,
        profiles: ClusterSlots | None = None,
        route_key: object | None = None,
        loose_tids: LooseTids | None = None,
        sup_cslots: list[int] | None = None,
    ) -> None:
        """An empty snapshot, or one of these parts (`vocab` must number every term their
        postings use). `sup_cslots`: the live cluster slots whose cluster has supersedes
        links, in `profiles.slot_of` order (None: found by looking at every cluster)."""
        self.cfg: RetrievalConfig = cfg or RetrievalConfig()
        self.ingest: IngestConfig = ingest or IngestConfig()
        # term -> id; append-only and shared by every snapshot of one lineage (an old
        # snapshot ignores ids beyond its segments)
        self.vocab: dict[str, int] = {} if vocab is None else vocab
        gap = self.cfg.neighbor_gap_minutes * 60.0
        self.memories = MemorySlots.empty(gap) if memories is None else memories
        self.profiles = ClusterSlots.empty() if profiles is None else profiles
        # stays the same object from one snapshot to the next while no cluster changes
        # (only unsorted memories came or went): `route_many` then gives the same
        # answers, so answers computed on an older snapshot with this key still hold
        self.route_key = object() if route_key is None else route_key
        # the term ids (text order) of the unsorted memories the change that made this
        # snapshot added: `route_many` on them (the route pass) does not tokenize again
        self.loose_tids: LooseTids = loose_tids or {}
        m, c = self.memories, self.profiles
        # derived
        self.unsorted = m.group < 0
        self.uslots = np.flatnonzero(self.unsorted & m.alive).astype(np.int64)
        # the live clusters with supersedes links (a change carries them over: looking at
        # every cluster on every snapshot cost ~3.5 ms at 11k clusters)
        self.sup_cslots = _with_supersedes(c) if sup_cslots is None else sup_cslots
        # superseded memory slot -> successor slot (both alive)
        self.sup_old, self.sup_new = _supersedes(m, c, self.sup_cslots)
        # some memory is superseded (`clagd update`): queries leave those out unless asked
        self.any_hidden = bool(m.hid.any())
        self.memory_bm25 = BM25(m.segs, m.alive, m.length, m.n_alive, m.total_len, self.cfg)
        self.cluster_bm25 = BM25(c.segs, c.alive, c.length, len(c.slot_of), c.total_len, self.cfg)
        self.results = ResultCache()
        # metadata filter -> which slots it lets through (`searching.where_mask`)
        self.filters: dict[Where, np.ndarray] = {}
        self.filter_uses: dict[Where, int] = {}  # queries per filter before its mask
        # scope masks made on first use (`retrieval.scoping`): key -> what it made
        self.scope_cache: dict[object, object] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {
            "format": self.FORMAT,
            "cfg": self.cfg,
            "ingest": self.ingest,
            "vocab": self.vocab,
            "memories": self.memories,
            "profiles": self.profiles,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        if state.get("format") != self.FORMAT:
            raise ValueError("index snapshot of an older format")
        Index.__init__(
            self,
            state["cfg"],
            state["ingest"],
            state["vocab"],
            state["memories"],
            state["profiles"],
        )

    # ----------------------------------------------------------------- building
    @classmethod
    def for_config(cls, config: Config) -> Index:
        """An empty index with the store's `retrieval` and `ingest` settings."""
        return cls(config.retrieval, config.ingest)

    @classmethod
    def build(
        cls,
        clusters: Mapping[str, Cluster] | Iterable[Cluster],
        unsorted: Iterable[Memory],
        cfg: RetrievalConfig | None = None,
        ingest: IngestConfig | None = None,
    ) -> Index:
        """A snapshot of these clusters and unsorted memories."""
        values = clusters.values() if isinstance(clusters, Mapping) else clusters
        return cls(cfg, ingest)._apply(values, (), unsorted, ())

    def apply(self, change: IndexChange, routes: bool = False) -> Index:
        """The snapshot `change` makes of this one; the work is proportional to what
        changed. A `build` change makes a fresh snapshot (same settings) of its clusters
        and unsorted memories. (A whole store loaded at start-up is built at once instead:
        `retrieval.bulk`.)

        `routes` (default False): keep the term ids of the added unsorted memories, so
        that `route_many` on them (the writer's route pass) does not tokenize them again.
        Only the writer's own snapshot routes, so only it passes True; a copy that only
        answers queries (a query process) keeps the default."""
        if change.build:
            fresh = Index(self.cfg, self.ingest)
            return fresh._apply(change.upsert_clusters, (), change.add_unsorted, (), routes=routes)
        return self._apply(
            change.upsert_clusters,
            change.remove_clusters,
            change.add_unsorted,
            change.remove_unsorted,
            routes=routes,
        )

    def _apply(
        self,
        upsert_clusters: Iterable[Cluster],
        remove_clusters: Iterable[str],
        add_unsorted: Iterable[Memory],
        remove_unsorted: Iterable[str],
        terms_of: TermsOf | None = None,
        routes: bool = False,
    ) -> Index:
        """`terms_of` gives a memory's term ids and their counts (None: each id counts once)
        instead of tokenizing its text."""
        upsert: dict[str, Cluster] = {c.id: c for c in upsert_clusters}
        removed = [cid for cid in remove_clusters if cid not in upsert]
        add_u = list(add_unsorted)
        rm_u = list(remove_unsorted)
        if not (upsert or removed or add_u or rm_u):
            return self
        memories, profiles, loose = written(
            self, list(upsert.values()), removed, add_u, rm_u, terms_of, routes
        )
        key = object() if upsert or removed else self.route_key
        sup = self.sup_cslots
        if upsert or removed:
            alive, new_at = profiles.alive, len(self.profiles.clusters)
            sup = [cs for cs in sup if alive[cs]]
            sup += [cs for cs in range(new_at, len(alive)) if profiles.clusters[cs].supersedes]
        if len(memories.mems) - memories.n_alive > max(1024, memories.n_alive):
            new = Index(self.cfg, self.ingest, self.vocab, memories, profiles, key, loose, sup)
            new = new._compacted()
        else:
            if len(profiles.alive) - len(profiles.slot_of) > max(
                DEAD_CLUSTERS_MIN, len(profiles.slot_of)
            ):
                profiles, memories, remap = clusters_compacted(profiles, memories, len(self.vocab))
                sup = [int(remap[cs]) for cs in sup]
            new = Index(self.cfg, self.ingest, self.vocab, memories, profiles, key, loose, sup)
        carry_held(self, new, upsert.values(), removed, add_u, rm_u)
        return new

    def _compacted(self) -> Index:
        """A rebuild from the live memories, reusing their postings (no re-tokenizing)."""
        m = self.memories
        live = sorted(slot for _, slot in m.slot_of.items())
        pos, tid, tf = forward(m.segs, np.asarray(live, dtype=np.int32))
        order = np.argsort(pos, kind="stable")
        pos, tid, tf = pos[order], tid[order], tf[order]
        bounds = np.searchsorted(pos, np.arange(len(live) + 1))
        terms = {
            m.mems[s].id: (tid[bounds[i] : bounds[i + 1]], tf[bounds[i] : bounds[i + 1]])
            for i, s in enumerate(live)
        }
        c = self.profiles
        clusters = [c.clusters[cslot] for cslot in c.slot_of.values()]
        unsorted = [m.mems[s] for s in live if m.group[s] < 0]
        fresh = Index(self.cfg, self.ingest, self.vocab)

        def terms_of(mem: Memory) -> tuple[np.ndarray, np.ndarray]:
            got = terms.get(mem.id)
            if got is None:  # not live (an inconsistent change): count it afresh
                ids = fresh.learn(mem.content)
                return np.asarray(ids, dtype=np.int32), np.ones(len(ids), dtype=np.float32)
            return got

        return fresh._apply(clusters, (), unsorted, (), terms_of)

    # ------------------------------------------------------------------ reading
    def __len__(self) -> int:
        return self.memories.n_alive

    @property
    def n_clusters(self) -> int:
        return len(self.profiles.slot_of)

    @property
    def cache_hits(self) -> int:
        """Searches this snapshot answered from its result cache."""
        return self.results.hits

    def cluster(self, cid: str) -> Cluster | None:
        cslot = self.profiles.slot_of.get(cid)
        return self.profiles.clusters[cslot] if cslot is not None else None

    def memory_ids(self) -> set[str]:
        return {mid for mid, _ in self.memories.slot_of.items()}

    def tokens(self, text: str) -> list[str]:
        """The index terms of `text` under this index's tokenizer settings."""
        return tokenize(text, stem=self.cfg.stemmer, stopwords=self.cfg.stopwords)

    def term_ids(self, text: str) -> list[int]:
        """Query term ids (terms no memory has are dropped: they score nothing)."""
        get = self.vocab.get
        return [i for i in map(get, self.tokens(text)) if i is not None]

    def learn(self, text: str) -> list[int]:
        """The term ids of `text`, numbering its new terms in the lineage's vocabulary
        (only a change being written calls this)."""
        vocab = self.vocab
        return [vocab.setdefault(t, len(vocab)) for t in self.tokens(text)]

    def memory_scores(self, text: str) -> dict[str, float]:
        """Plain BM25 of every live memory with global IDF (for tests and diagnostics)."""
        s = self.memory_bm25.scores(self.term_ids(text))
        return {mid: float(s[slot]) for mid, slot in self.memories.slot_of.items()}

    def search(
        self,
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
        """Top memories for `text`: ranked by score, deduplicated, cut to k and the budget
        (`retrieval.searching`).

        `where` (metadata key, value) pairs keep only the memories whose metadata holds
        them all; the filter takes the place of the cluster choice (every memory it lets
        through is eligible, wherever it is filed) and applies before the cut, so a
        filtered query fills its `max_memories` and budget from the memories that match.
        `scopes`: the scopes the query sees (None: every scope); memories and clusters of
        any other score nothing, and a cluster of another scope named in `clusters` is
        ignored (`retrieval.scoping`).

        `token_budget` None means the configured budget; 0 or less means no budget.
        `archive` is another snapshot (the archived clusters) merged into the ranking.
        `clusters` replaces the lexical cluster choice (ids of hot clusters; unknown ids
        are ignored): the SLM refinement passes its pick here. `superseded`: memories
        another one supersedes (`Memory.superseded_by`) are searched too, ranked with
        `superseded_penalty`; by default they are left out.

        Results are cached per snapshot (see `results.HOT_CACHE_SIZE`): a snapshot never
        changes, so a repeated query on it has the same answer; a new snapshot starts
        empty.
        """
        return searching.search(
            self,
            text,
            max_memories,
            token_budget,
            archive,
            now,
            clusters,
            where,
            scopes,
            superseded,
        )

    def find(self, mid: str, scopes: Collection[str] | None = None) -> Hit | None:
        """Memory `mid` where this snapshot files it (score 0), or None, also when it is of
        none of `scopes` (None: any scope; `retrieval.listing`)."""
        return listing.find(self, mid, scopes)

    def newest(
        self,
        where: Where = (),
        since: float | None = None,
        limit: int = 100,
        scopes: Collection[str] | None = None,
        superseded: bool = False,
    ) -> tuple[list[Hit], int]:
        """The `limit` newest memories of `scopes` (None: all) that `where` and `since`
        (epoch seconds) let through, superseded ones only with `superseded`, and how many
        do in all (`retrieval.listing`)."""
        return listing.newest(self, where, since, limit, scopes, superseded)

    def unsorted_by_scope(self) -> dict[str, int]:
        """How many unsorted memories each scope has (`status` counts)."""
        mems = self.memories.mems
        out: dict[str, int] = {}
        for slot in self.uslots.tolist():
            scope = mems[slot].scope
            out[scope] = out.get(scope, 0) + 1
        return out

    def cluster_candidates(
        self, text: str, n: int, scopes: Collection[str] | None = None
    ) -> list[tuple[str, str, float]]:
        """The `n` best hot clusters for `text` by profile BM25 (positive scores only), of
        these `scopes` (None: all): the lexical pre-filter of the SLM refinement."""
        return searching.cluster_candidates(self, text, n, scopes)

    def route_many(self, memories: Sequence[Memory]) -> list[str | None]:
        """The cluster each new memory clearly belongs to, or None (it goes to unsorted), in
        one pass for the whole batch (ingest, route passes; `retrieval.routing`).

        Clearly: its best cluster-profile BM25 score is at least `route_min_score` and beats
        the runner-up by `route_margin`."""
        return routing.route_many(self, memories)

    def route_steps(self, memories: Sequence[Memory], step: int) -> Iterator[list[str | None]]:
        """`route_many`'s answers, `step` memories at a time (`retrieval.routing`)."""
        return routing.route_steps(self, memories, step)


def _with_supersedes(c: ClusterSlots) -> list[int]:
    """The live cluster slots whose cluster has supersedes links, in `slot_of` order."""
    return [cslot for cslot in c.slot_of.values() if c.clusters[cslot].supersedes]


def _supersedes(
    m: MemorySlots, c: ClusterSlots, cslots: list[int]
) -> tuple[np.ndarray, np.ndarray]:
    """(superseded slot, successor slot) of every supersedes link of these live clusters
    (`sup_cslots`) whose two memories are both live."""
    old: list[int] = []
    newer: list[int] = []
    for cslot in cslots:
        sup = c.clusters[cslot].supersedes
        if not sup:
            continue
        for new_mid, old_mid in sup.items():
            a, b = m.slot_of.get(old_mid), m.slot_of.get(new_mid)
            if a is not None and b is not None and a != b:
                old.append(a)
                newer.append(b)
    return np.asarray(old, dtype=np.int32), np.asarray(newer, dtype=np.int32)
