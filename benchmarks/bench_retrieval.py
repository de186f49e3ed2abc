"""Retrieval benchmark: index build, incremental apply and query latency at store sizes.

    python benchmarks/bench_retrieval.py [--sizes 1000,10000,100000] [--queries 200]

Synthetic memories (Zipf-distributed vocabulary, topics per cluster of 50) so that the
numbers do not depend on any data set. rank-bm25 (BM25Okapi, the flat baseline) is timed up
to 20,000 memories: it is O(N) per query term in Python.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from datetime import datetime, timedelta, timezone

from rank_bm25 import BM25Okapi

from clagd.change import IndexChange
from clagd.config import RetrievalConfig
from clagd.model import Cluster, Memory
from clagd.retrieval.index import Index
from clagd.text import tokenize

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)


def make_store(n: int, seed: int = 1) -> tuple[dict[str, Cluster], list[str]]:
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(20_000)]
    weights = [1.0 / (i + 1) ** 1.05 for i in range(len(vocab))]
    clusters: dict[str, Cluster] = {}
    per = 50
    for c in range(max(1, n // per)):
        topic = rng.sample(vocab[200:], 12)
        mems = []
        for i in range(per):
            words = rng.choices(vocab, weights=weights, k=rng.randint(8, 30))
            words += rng.sample(topic, 3)
            at = T0 + timedelta(days=c, seconds=10 * i)
            mems.append(Memory.new(f"{c}-{i} " + " ".join(words), at.isoformat()))
        cid = f"c-{c:08x}"
        clusters[cid] = Cluster(cid, f"topic {topic[0]} {topic[1]}", memories=mems)
    queries = [" ".join(rng.sample(vocab[50:3000], 4)) for _ in range(1000)]
    return clusters, queries


def ms(samples: list[float]) -> str:
    s = sorted(samples)
    return f"p50 {statistics.median(s):.3f} ms  p99 {s[int(0.99 * (len(s) - 1))]:.3f} ms"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--queries", type=int, default=200)
    args = ap.parse_args()
    cfg = RetrievalConfig()
    for n in [int(x) for x in args.sizes.split(",")]:
        clusters, queries = make_store(n)
        queries = queries[: args.queries]
        t = time.perf_counter()
        ix = Index.build(clusters, [], cfg)
        build = time.perf_counter() - t
        batch = [Memory.new(f"new memory {i} " + queries[i], T0.isoformat()) for i in range(100)]
        t = time.perf_counter()
        ix2 = ix.apply(IndexChange(add_unsorted=batch), routes=True)
        apply_ms = (time.perf_counter() - t) * 1000
        first = next(iter(clusters.values()))
        changed = Cluster(first.id, "renamed topic", memories=first.memories[:40])
        t = time.perf_counter()
        ix2.apply(
            IndexChange(upsert_clusters=[changed], remove_unsorted=[m.id for m in batch[:10]])
        )
        session_ms = (time.perf_counter() - t) * 1000
        lat = []
        for q in queries:
            t = time.perf_counter()
            ix2.search(q, max_memories=5)
            lat.append((time.perf_counter() - t) * 1000)
        print(
            f"n={len(ix2):>7}  build {build:.2f} s  apply(100 new) {apply_ms:.1f} ms  "
            f"apply(session) {session_ms:.1f} ms  clagd search {ms(lat)}"
        )
        if n <= 20_000:
            docs = [m.content for c in clusters.values() for m in c.memories]
            flat = BM25Okapi([tokenize(d) for d in docs], k1=cfg.k1, b=cfg.b)
            lat = []
            for q in queries:
                t = time.perf_counter()
                scores = flat.get_scores(tokenize(q))
                sorted(range(len(scores)), key=lambda i: -scores[i])[:5]
                lat.append((time.perf_counter() - t) * 1000)
            print(f"{'':>9}  rank-bm25 BM25Okapi flat search {ms(lat)}")


if __name__ == "__main__":
    main()
