"""What a search gives: hits, the result with its formatted context, and the per-snapshot
cache of results (a snapshot never changes, so a repeated query has the same answer)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from clagd.model import Memory, day_label, one_line
from clagd.text import estimate_tokens

# the cluster name a hit from the unsorted area shows
UNSORTED_NAME = "unsorted"

# queries remembered per snapshot (the hot cache; a new snapshot starts empty)
HOT_CACHE_SIZE = 256


@dataclass(frozen=True)
class Hit:
    memory: Memory
    cluster_id: str | None
    cluster_name: str
    score: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.memory.id,
            "content": self.memory.content,
            "cluster_id": self.cluster_id,
            "cluster_name": self.cluster_name,
            "score": round(float(self.score), 4),
            "created_at": self.memory.created_at,
            "metadata": dict(self.memory.metadata),
            "scope": self.memory.scope,
        }


# a ranked hit inside a search, before the cut-offs: the hit, the estimated tokens of its
# context line, the highest weight (IDF) of the query terms the memory has itself, and of
# those it or a time neighbour in its cluster has (both 0 unless the rare-term cut is on).
# A plain tuple: this is built for every hit of every query.
Ranked = tuple[Hit, int, float, float]


@dataclass
class SearchResult:
    memories: list[Hit] = field(default_factory=list)
    clusters: list[tuple[str, str, float]] = field(default_factory=list)
    context: str = ""
    tokens: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The query result shape of the socket protocol (DESIGN.md)."""
        return {
            "memories": [h.to_dict() for h in self.memories],
            "clusters": [
                {"id": cid, "name": name, "score": round(float(score), 4)}
                for cid, name, score in self.clusters
            ],
            "context": self.context,
            "tokens": self.tokens,
        }


# the longest day a line shows: a line's budget is counted on the safe side
LONGEST_DAY = "30 September 2023"


@lru_cache(maxsize=65536)
def label_tokens(name: str) -> int:
    """Estimated tokens of a context line's `[Memory · <name> · <day>]` prefix."""
    return estimate_tokens(f"[Memory · {name} · {LONGEST_DAY}]")


def _line(h: Hit) -> str:
    # one line whatever a model named the cluster (files are made one-line when read)
    label = f"Memory · {one_line(h.cluster_name)}"
    when = day_label(h.memory.created_at)
    if when:
        label += f" · {when}"
    return f"[{label}] {one_line(h.memory.content)}"


def format_context(hits: list[Hit]) -> str:
    """Hits grouped by cluster (groups in order of their best hit), one line per memory,
    each with its cluster's name and its day: `[Memory · Lisbon trip · 8 May 2023] ...`
    (measured in the answer eval: a small model answers "when" questions only with the
    dates shown; docs/answers.md)."""
    groups: dict[str, list[Hit]] = {}
    for h in hits:
        groups.setdefault(h.cluster_id or "", []).append(h)
    return "\n".join(_line(h) for g in groups.values() for h in g)


class ResultCache:
    """The results of one snapshot, by query (at most `HOT_CACHE_SIZE`, the oldest go
    first). Filled without a lock: dict operations are atomic under the GIL; a race costs
    at most one extra eviction or a recomputation."""

    __slots__ = ("results", "hits")

    def __init__(self) -> None:
        self.results: dict[tuple, SearchResult] = {}
        self.hits = 0

    def get(self, key: tuple) -> SearchResult | None:
        got = self.results.get(key)
        if got is not None:
            self.hits += 1
        return got

    def put(self, key: tuple, res: SearchResult) -> None:
        cache = self.results
        cache[key] = res
        while len(cache) > HOT_CACHE_SIZE:
            try:
                del cache[next(iter(cache))]
            except (KeyError, RuntimeError, StopIteration):
                break
