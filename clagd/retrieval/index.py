"""The retrieval package's public face: what the rest of clagd imports to search.

`Index` (`retrieval.snapshot`) is one immutable snapshot; `IndexChange`
(`clagd.change`) is what `Index.apply` takes; a search gives a `SearchResult` of `Hit`s
(`retrieval.results`); `ClusterScorer` (`retrieval.scoring`) scores a text against a set
of clusters with the index's own BM25. docs/ARCHITECTURE.md, "Index snapshots", maps the
modules behind them.
"""

from __future__ import annotations

from clagd.change import IndexChange
from clagd.retrieval.results import Hit, SearchResult, format_context
from clagd.retrieval.scoring import ClusterScorer
from clagd.retrieval.snapshot import Index

__all__ = ["ClusterScorer", "Hit", "Index", "IndexChange", "SearchResult", "format_context"]
