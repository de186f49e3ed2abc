"""Which per-hit signal could cut the tokens a query spends on memories that are not evidence?

    PYTHONPATH=. python benchmarks/precision_curve.py [LOCOMO_JSON]

Prints the trade-off table of docs/retrieval.md ("Precision"): for each candidate relevance
cut-off, recall@10, memories returned, tokens and wasted tokens on the dev split, in the
batch protocol (organizer + index in-process, like `run_eval(pipeline="inprocess")`) and in
an in-process replica of the stream protocol (the engine, one `Engine.add` per LoCoMo
session, the route pass, a session whenever the daemon's memory-count or round trigger
fires). Each query is answered once with k = 10 and no cut; every signal is computed from
the index snapshot that answered it (no dataset labels), then each rule keeps a subset of
those hits. The evidence labels only score the rules, and fit the logistic-regression
bound at the end (fitted on four conversations, tested on the fifth).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from clagd.config import Config
from clagd.eval.data import Turn, arrivals, conversation_turns, load_conversations, questions
from clagd.eval.pipelines import EnginePipeline, InProcessPipeline, line_tokens
from clagd.model import memory_id
from clagd.retrieval import searching
from clagd.retrieval.index import Index

# the shared data beside the repository (../shared/)
PATH = str(Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo" / "locomo-dev.json")
K = 10


class StreamReplica(EnginePipeline):
    """The stream protocol's triggers without the daemon: one add per arrival, the route
    pass, a session when the memory-count or dialogue-round threshold fires."""

    def __init__(self, config: Config) -> None:
        super().__init__(config, "none")
        self.due = False
        self.engine.hooks.on_threshold = self._fire

    def _fire(self, why: str) -> None:
        self.due = True

    def ingest(self, turns: list[Turn]) -> None:
        for group in arrivals(turns, None):
            self.engine.add([{"content": t.content, "created_at": t.created_at} for t in group])
            self.engine.maybe_route(force=True)
            self.settle()

    def settle(self) -> None:
        if self.due:
            self.due = False
            self.engine.recluster(trigger="threshold", backend="none")


@dataclass
class HitRow:
    id: str
    rank: int
    score: float
    cost: int
    own: float  # own BM25 / the best memory's
    cover: float  # share of the query's IDF mass the memory matches itself
    ecover: float  # ... it and its time neighbours together
    rare: float  # highest IDF it or a neighbour matches / the rarest matched by the top 10
    orare: float  # ... its own terms only
    cl: float  # the cluster part of the score (normalized cluster BM25)
    nb: float  # the neighbour part (the better neighbour's BM25 / the best memory's)
    length: int  # its tokens
    matched: float  # share of the query's terms it matches itself
    terms: frozenset[int] = field(default_factory=frozenset)
    slot: int = -1
    group: int = -1
    sub: bool = False  # its matched terms are all matched by higher hits
    adj: bool = False  # a time neighbour of a higher hit
    same: bool = False  # in the best hit's cluster
    rel: float = 0.0
    best_cover: float = 0.0  # the best hit's own coverage
    gap: float = 0.0  # 1 - second score / best score
    query_len: int = 0
    near: tuple[str, ...] = ()  # the ids of its time neighbours (for benchmarks/precision_dense.py)


@dataclass
class QuestionRow:
    conv: int
    evidence: set[str]
    tokens: int
    hits: list[HitRow]
    text: str = ""


def _terms(ix: Index, slot: int, q: dict[int, float]) -> set[int]:
    if slot < 0:
        return set()
    got = (ix.vocab.get(w) for w in ix.tokens(ix.memories.mems[slot].content))
    return {t for t in got if t is not None and t in q}


def _rows(ix: Index, text: str, res: dict[str, Any]) -> list[HitRow]:
    """The signals of each returned hit, read from the snapshot that answered."""
    q = [t for t in map(ix.vocab.get, ix.tokens(text)) if t is not None]
    s = np.append(ix.memory_bm25.scores(q), np.float32(0.0))  # index -1: no neighbour
    smax = float(s.max()) if len(s) else 0.0
    c_norm, _, _ = searching.choose_clusters(ix, ix.cluster_bm25.scores(q), None)
    w = ix.memory_bm25.weights(q)
    total = math.fsum(w.values()) or 1.0
    rows: list[HitRow] = []
    for i, (m, cost) in enumerate(zip(res["memories"], line_tokens(res))):
        slot = ix.memories.slot_of.get(m["id"])
        assert slot is not None
        own = _terms(ix, slot, w)
        prev, nxt = int(ix.memories.prev[slot]), int(ix.memories.nxt[slot])
        near = own | _terms(ix, prev, w) | _terms(ix, nxt, w)
        group = int(ix.memories.group[slot])
        near_ids = tuple(ix.memories.mems[n].id for n in (prev, nxt) if n >= 0)
        rows.append(
            HitRow(
                m["id"],
                i,
                m["score"],
                cost,
                float(s[slot]) / smax if smax else 0.0,
                math.fsum(w[t] for t in own) / total,
                math.fsum(w[t] for t in near) / total,
                max((w[t] for t in near), default=0.0),
                max((w[t] for t in own), default=0.0),
                float(c_norm[group]),
                max(float(s[prev]), float(s[nxt])) / smax if smax else 0.0,
                len(ix.tokens(m["content"])),
                len(own) / max(len(w), 1),
                frozenset(own),
                slot,
                group,
                near=near_ids,
            )
        )
    top = max((h.orare for h in rows), default=0.0) or 1.0
    seen: set[int] = set()
    slots: set[int] = set()
    for h in rows:
        h.rare, h.orare = h.rare / top, h.orare / top
        h.sub = bool(h.terms) and h.terms <= seen
        h.adj = int(ix.memories.prev[h.slot]) in slots or int(ix.memories.nxt[h.slot]) in slots
        h.same = h.group == rows[0].group
        h.rel = h.score / rows[0].score
        h.best_cover = rows[0].cover
        h.gap = 1 - rows[1].score / rows[0].score if len(rows) > 1 else 1.0
        h.query_len = len(w)
        seen |= h.terms
        slots.add(h.slot)
    return rows


def collect(kind: str, path: str) -> list[QuestionRow]:
    cfg = Config()
    out: list[QuestionRow] = []
    for ci, conv in enumerate(load_conversations(path)):
        turns = conversation_turns(conv)
        by_dia = {t.dia_id: memory_id(t.content) for t in turns}
        pipe: InProcessPipeline | StreamReplica
        pipe = InProcessPipeline(cfg) if kind == "batch" else StreamReplica(cfg)
        pipe.ingest(turns)
        for qq in questions(conv):
            ev = {by_dia[d] for d in qq.evidence if d in by_dia}
            if not ev:
                continue
            res = pipe.query(qq.text, K)
            ix = pipe.index if isinstance(pipe, InProcessPipeline) else pipe.engine.index
            rows = _rows(ix, qq.text, res)
            out.append(QuestionRow(ci, ev, int(res["tokens"]), rows, qq.text))
            pipe.settle()
        pipe.close()
    return out


Rule = Callable[[QuestionRow, HitRow], bool]


def evaluate(data: list[QuestionRow], keep: Rule) -> tuple[float, float, float, float]:
    """recall@10, memories, tokens, wasted tokens (the context's tokens shared out by each
    line's estimate, as `clagd.eval.metrics`) of the hits the rule keeps."""
    r, n, t, w = [], [], [], []
    for d in data:
        kept = [h for h in d.hits if h.rank == 0 or keep(d, h)]
        total = sum(h.cost for h in d.hits) or 1
        r.append(len({h.id for h in kept} & d.evidence) / len(d.evidence))
        n.append(len(kept))
        t.append(d.tokens * sum(h.cost for h in kept) / total)
        w.append(d.tokens * sum(h.cost for h in kept if h.id not in d.evidence) / total)
    return float(np.mean(r)), float(np.mean(n)), float(np.mean(t)), float(np.mean(w))


def _clear(d: QuestionRow, h: HitRow, keep: int) -> bool:
    """Past the first `keep` hits of a clear single-hit match: the best hit has every
    query term and the second scores <= 0.7 x it."""
    best = d.hits[0]
    gap = len(d.hits) > 1 and d.hits[1].score <= 0.7 * best.score
    return best.cover >= 0.999 and gap and h.rank >= keep


def _mean_above(d: QuestionRow, h: HitRow, a: float) -> bool:
    return h.score >= a * float(np.mean([x.score for x in d.hits[: h.rank]]))


RULES: list[tuple[str, Rule]] = [
    ("none (off)", lambda d, h: True),
    *[(f"relative score {a}", lambda d, h, a=a: h.rel >= a) for a in (0.35, 0.4, 0.45, 0.5, 0.6)],
    *[(f"rare term {a}", lambda d, h, a=a: h.rare >= a) for a in (0.1, 0.2, 0.3, 0.5)],
    ("rare term 0.2 + relative 0.35", lambda d, h: h.rare >= 0.2 and h.rel >= 0.35),
    ("rare term 0.2 + relative 0.4", lambda d, h: h.rare >= 0.2 and h.rel >= 0.4),
    ("rare term of its own 0.1", lambda d, h: h.orare >= 0.1),
    *[(f"own coverage {a}", lambda d, h, a=a: h.cover >= a) for a in (0.02, 0.2)],
    *[(f"coverage with neighbours {a}", lambda d, h, a=a: h.ecover >= a) for a in (0.1, 0.2)],
    *[
        (
            f"coverage with neighbours {a} x best's",
            lambda d, h, a=a: h.ecover >= a * d.hits[0].ecover,
        )
        for a in (0.2, 0.3)
    ],
    *[
        (f"redundant, relative < {a}", lambda d, h, a=a: not (h.sub and h.rel < a))
        for a in (0.38, 0.42)
    ],
    ("relative >= 0.22 + 0.025 x rank", lambda d, h: h.rel >= 0.22 + 0.025 * h.rank),
    ("score >= 0.58 x mean above", lambda d, h: _mean_above(d, h, 0.58)),
    ("clear single-hit match, keep 5", lambda d, h: not _clear(d, h, 5)),
    ("clear single-hit match, keep 3", lambda d, h: not _clear(d, h, 3)),
    ("clear, keep 2, relative 0.35", lambda d, h: not _clear(d, h, 2) and h.rel >= 0.35),
    (
        "clear, keep 2, relative 0.38, rare 0.2",
        lambda d, h: not _clear(d, h, 2) and h.rel >= 0.38 and h.rare >= 0.2,
    ),
]

FEATURES = (
    "rel", "own", "cl", "nb", "cover", "ecover", "rare", "orare", "sub", "adj", "same",
    "best_cover", "gap", "query_len", "length", "rank", "matched", "cost",
)  # fmt: skip


Score = dict[tuple[int, int], float]  # (question index, rank) -> score; lower is cut first


def cut_at(data: list[QuestionRow], score: Score, drop: float = 0.01) -> tuple[set[int], float]:
    """Cut the lowest-scored hits while recall@10 drops by at most `drop` (hits cut in score
    order; rank 0 is never cut): the cut hits (as `id(hit)`) and the share of wasted tokens
    saved."""
    items, base = [], 0.0
    for qi, d in enumerate(data):
        total = sum(h.cost for h in d.hits) or 1
        for h in d.hits:
            ev = h.id in d.evidence
            waste = 0.0 if ev else d.tokens * h.cost / total / len(data)
            base += waste
            if h.rank:
                loss = (1 / len(d.evidence) if ev else 0.0) / len(data)
                items.append((score[(qi, h.rank)], loss, waste, id(h)))
    lost = saved = 0.0
    cut: set[int] = set()
    for _, loss, waste, key in sorted(items):
        if lost + loss > drop:
            break
        lost += loss
        saved += waste
        cut.add(key)
    return cut, saved / base


def _saving_at(data: list[QuestionRow], score: Score) -> float:
    """Share of wasted tokens saved by cutting the lowest-scored hits while recall@10 drops
    by at most 0.01."""
    return cut_at(data, score)[1]


Columns = Callable[[int, QuestionRow, HitRow], list[float]]


def lexical(qi: int, d: QuestionRow, h: HitRow) -> list[float]:
    return [float(getattr(h, f)) for f in FEATURES]


def loco_folds(
    data: list[QuestionRow], columns: Columns
) -> Iterator[tuple[list[tuple[int, str, HitRow]], np.ndarray, np.ndarray, np.ndarray]]:
    """For leave-one-conversation-out fits: every hit as (question index, conversation,
    hit), the signals `columns` gives per hit, whether each is evidence (1.0 or 0.0), and,
    one fold at a time, the mask of the hits to train on (every other conversation's)."""
    rows = [(qi, d.conv, h) for qi, d in enumerate(data) for h in d.hits]
    x = np.array([columns(qi, data[qi], h) for qi, _, h in rows])
    y = np.array([h.id in data[qi].evidence for qi, _, h in rows], dtype=float)
    conv = np.array([c for _, c, _ in rows])
    for c in sorted(set(conv.tolist())):
        yield rows, x, y, conv != c


def logistic_scores(data: list[QuestionRow], columns: Columns = lexical) -> Score:
    """Leave-one-conversation-out logistic regression over the signals `columns` gives per
    hit: each hit is scored by the model fitted on the other conversations."""
    score: Score = {}
    for rows, x, y, train in loco_folds(data, columns):
        mu, sd = x[train].mean(0), x[train].std(0) + 1e-9
        z = np.c_[(x - mu) / sd, np.ones(len(x))]
        wt = np.zeros(z.shape[1])
        for _ in range(2000):
            p = 1 / (1 + np.exp(-z[train] @ wt))
            wt -= 0.5 * (z[train].T @ (p - y[train]) / train.sum() + 1e-2 * np.r_[wt[:-1], 0])
        for i in np.flatnonzero(~train).tolist():
            qi, _, h = rows[i]
            score[(qi, h.rank)] = float(z[i] @ wt)
    return score


def logistic_bound(data: list[QuestionRow]) -> float:
    """Leave-one-conversation-out logistic regression over the signals: an upper bound for
    rules built from them."""
    return _saving_at(data, logistic_scores(data))


def print_table(runs: dict, base: dict, rows: list[tuple[str, Any, Any]]) -> None:
    """One Markdown row per (name, rule on batch, rule on stream): recall@10 of both, then
    batch's memories, tokens and wasted tokens, and the wasted tokens saved in each."""
    print("| rule | batch R@10 | stream R@10 | memories | tokens | wasted | wasted saved |")
    print("|---|---|---|---|---|---|---|")
    for name, rule_batch, rule_stream in rows:
        rb, nb, tb, wb = evaluate(runs["batch"], rule_batch)
        rs, _, _, ws = evaluate(runs["stream"], rule_stream)
        sb = (wb - base["batch"][3]) / base["batch"][3] * 100
        ss = (ws - base["stream"][3]) / base["stream"][3] * 100
        print(
            f"| {name} | {rb:.4f} | {rs:.4f} | {nb:.2f} | {tb:.0f} | {wb:.0f} | {sb:+.0f}% / {ss:+.0f}% |"
        )


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else PATH
    runs = {kind: collect(kind, path) for kind in ("batch", "stream")}
    base = {kind: evaluate(data, RULES[0][1]) for kind, data in runs.items()}
    print_table(runs, base, [(name, rule, rule) for name, rule in RULES])
    for kind, data in runs.items():
        print(
            f"{kind}: logistic bound (leave one conversation out), wasted saved at -0.01 "
            f"recall@10: {logistic_bound(data) * 100:.1f}%"
        )


if __name__ == "__main__":
    main()
