"""Per-system tallies for the eval: evidence recall, hit, precision, tokens, latency.

precision@k = evidence memories among the first k returned / memories returned (at most k;
0 when nothing came back). session@k = 1 when any of the first k memories comes from a
LoCoMo session that holds evidence (LoCoMo's own session-level retrieval: whether the
right part of the history was found at all). `wasted_tokens` = the share of the context's estimated tokens
(at the largest k) that goes to returned memories that are not evidence: what a small model reads for nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


class Tally:
    def __init__(self, ks: Sequence[int]) -> None:
        self.ks = tuple(ks)
        self.recall: dict[int, list[float]] = {k: [] for k in self.ks}
        self.hit: dict[int, list[float]] = {k: [] for k in self.ks}
        self.precision: dict[int, list[float]] = {k: [] for k in self.ks}
        self.session: dict[int, list[float]] = {k: [] for k in self.ks}
        self.tokens: list[int] = []
        self.wasted: list[int] = []
        self.returned: list[int] = []
        self.ms: list[float] = []

    def add(
        self,
        ranked: list[str],
        evidence: set[str],
        tokens: int,
        ms: float,
        line_tokens: Sequence[int] | None = None,
        session_of: Mapping[str, int] | None = None,
    ) -> None:
        """One question: `ranked` memory ids (best first), the context's `tokens`, the
        tokens of each returned memory's line (same order as `ranked`), and the LoCoMo
        session of each memory (for session@k)."""
        sessions = session_of or {}
        wanted = {sessions[e] for e in evidence if e in sessions}
        for k in self.ks:
            top = ranked[:k]
            found = len(set(top) & evidence)
            self.session[k].append(1.0 if any(sessions.get(m) in wanted for m in top) else 0.0)
            self.recall[k].append(found / len(evidence))
            self.hit[k].append(1.0 if found else 0.0)
            self.precision[k].append(found / len(top) if top else 0.0)
        kmax = max(self.ks)
        # the context's tokens, shared out by each line's estimate (the per-line estimates
        # sum to a little more than the estimate of the joined context)
        costs = list(line_tokens or [])[:kmax]
        waste = sum(c for mid, c in zip(ranked[:kmax], costs) if mid not in evidence)
        self.wasted.append(round(tokens * waste / sum(costs)) if sum(costs) else 0)
        self.returned.append(min(len(ranked), kmax))
        self.tokens.append(tokens)
        self.ms.append(ms)

    def __len__(self) -> int:
        return len(self.ms)

    def summary(self) -> dict[str, float]:
        out: dict[str, float] = {}
        empty = not self.ms

        def mean(xs: Sequence[float], nd: int = 4) -> float:
            return 0.0 if empty else round(float(np.mean(xs)), nd)

        for k in self.ks:
            out[f"recall@{k}"] = mean(self.recall[k])
            out[f"hit@{k}"] = mean(self.hit[k])
            out[f"precision@{k}"] = mean(self.precision[k])
            out[f"session@{k}"] = mean(self.session[k])
        out["tokens"] = mean(self.tokens, 1)
        out["wasted_tokens"] = mean(self.wasted, 1)
        out["returned"] = mean(self.returned, 2)
        out["p50_ms"] = 0.0 if empty else round(float(np.percentile(self.ms, 50)), 3)
        out["p99_ms"] = 0.0 if empty else round(float(np.percentile(self.ms, 99)), 3)
        return out
