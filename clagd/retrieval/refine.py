"""Optional SLM refinement of the cluster choice (`retrieval.slm_refine`, off by default).

The lexical pre-filter takes the `slm_refine_candidates` best clusters for a query; the SLM
then picks up to `top_clusters` of them in one schema-constrained call in which the choices
are enumerated (`C1`..`Cn`), so it cannot name a cluster that does not exist. Anything else
(no backend, a timeout, an error, an answer that does not parse) falls back to the lexical
choice and is counted. After a failure the SLM is not asked again for `cooldown` seconds, so
a slow or dead model costs one timeout, not one per query.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from clagd.config import RetrievalConfig
from clagd.errors import BackendError
from clagd.retrieval.index import Index
from clagd.slm.base import Backend
from clagd.slm.schema import array, closed_object, string

log = logging.getLogger("clagd.refine")

SYSTEM = (
    "You route a question to the memory clusters most likely to hold its answer. "
    "Answer with JSON only: the ids of the best clusters, best first."
)


def refine_schema(aliases: list[str], most: int) -> dict[str, Any]:
    return closed_object({"clusters": array(string(enum=aliases), most, min_items=1)})


@dataclass(frozen=True)
class RefineStatus:
    """The `refine` section of `status`: queries the model refined, skipped (paused after
    a failure), and answered lexically after its timeout or error."""

    refined: int
    skipped: int
    fallback_timeout: int
    fallback_error: int
    last_error: str


class Refiner:
    """Picks clusters for `Index.search(clusters=...)`; `choose` returns None to mean
    "use the lexical choice"."""

    def __init__(
        self,
        get_backend: Callable[[], Backend | None],
        cfg: RetrievalConfig,
        cooldown: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.get_backend = get_backend
        self.cfg = cfg
        self.cooldown = cooldown
        self.clock = clock
        self.counts = {"refined": 0, "skipped": 0, "fallback_timeout": 0, "fallback_error": 0}
        self.last_error = ""
        self._paused_until = 0.0
        self._lock = threading.Lock()

    def _count(self, key: str) -> None:
        with self._lock:
            self.counts[key] += 1

    def status(self) -> RefineStatus:
        c = self.counts
        return RefineStatus(
            c["refined"], c["skipped"], c["fallback_timeout"], c["fallback_error"], self.last_error
        )

    def prompt(self, index: Index, text: str, cands: list[tuple[str, str, float]]) -> str:
        lines = [f"Question: {text.strip()[:500]}", "", "Clusters:"]
        for i, (cid, name, _score) in enumerate(cands, 1):
            c = index.cluster(cid)
            desc = c.description if c is not None else ""
            tags = ", ".join(c.tags[:5]) if c is not None else ""
            lines.append(f"C{i}: {name}. {desc} [{tags}]".strip())
        lines.append("")
        lines.append(f"Pick 1 to {self.cfg.top_clusters} clusters.")
        return "\n".join(lines)

    def choose(
        self, index: Index, text: str, scopes: Collection[str] | None = None
    ) -> list[str] | None:
        """`scopes`: the query's; the model is shown only clusters of these scopes."""
        cfg = self.cfg
        cands = index.cluster_candidates(text, cfg.slm_refine_candidates, scopes)
        if len(cands) <= max(1, cfg.top_clusters):
            return None  # nothing to choose between: the lexical choice is the same
        if self.clock() < self._paused_until:
            self._count("skipped")
            return None
        backend = self.get_backend()
        if backend is None:
            self._count("skipped")
            return None
        aliases = [f"C{i}" for i in range(1, len(cands) + 1)]
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": self.prompt(index, text, cands)},
        ]
        try:
            res = backend.chat_json(
                messages,
                refine_schema(aliases, cfg.top_clusters),
                timeout=cfg.slm_refine_timeout,
            )
            picked = res.data.get("clusters")
            if not isinstance(picked, list) or not picked:
                raise BackendError("the answer names no cluster")
            by_alias = dict(zip(aliases, (c[0] for c in cands)))
            chosen = [by_alias[a] for a in dict.fromkeys(picked) if a in by_alias]
            if not chosen:
                raise BackendError("the answer names no known cluster")
        except Exception as exc:  # noqa: BLE001 - any failure means: the lexical choice
            msg = str(exc).lower()
            timeout = isinstance(exc, TimeoutError) or "no answer" in msg or "timed out" in msg
            self._count("fallback_timeout" if timeout else "fallback_error")
            self.last_error = str(exc)[:300]
            self._paused_until = self.clock() + self.cooldown
            log.warning("SLM cluster refinement skipped: %s", self.last_error)
            return None
        self._count("refined")
        return chosen[: cfg.top_clusters]
