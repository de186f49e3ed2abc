"""In-process query latency at scale: `Index.search` and a query process's whole answer.

    python benchmarks/bench_query.py [--size 100000] [--queries 300] [--repeats 3]
        [--unsorted 0] [--removed 0] [--json]

The index holds the memories `bench_scale.py` writes into its store (LoCoMo turns
recombined, clusters of 50 consecutive memories), built in this process; `--unsorted`
adds that many more memories to the unsorted area (a burst), `--removed` then removes
that many clustered memories' clusters' first member (dead slots). The queries are the
ones `bench_scale.py` asks, each repeat with a different suffix so that no answer comes
from the hot cache. For each repeat it prints p50 / p99 / mean in ms of:
  * `search`: `Index.search` (uncached: a fresh text);
  * `cold`: the same with no query term's BM25 contributions kept on the snapshot (as on
    the first queries after a commit; `Index._weighted`), where the tree has them;
  * `worker`: what a query process does for one request line, under its compute lock: the
    JSON decode, the dispatcher, `engine.core.answer` (search + reply dict) and the
    encoded reply line (`serve.server.encode_reply`); not the socket itself.

To compare two trees in the same machine state, run it with each tree on PYTHONPATH
(`git archive <commit> clagd | tar -x -C /tmp/old`), alternating.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_scale import PER_CLUSTER, T0, pct  # noqa: E402
from corpus import memories, queries  # noqa: E402

from clagd.change import IndexChange  # noqa: E402
from clagd.engine.answer import answer  # noqa: E402
from clagd.model import Cluster, Memory  # noqa: E402
from clagd.protocol import QueryParams  # noqa: E402
from clagd.retrieval.index import Index  # noqa: E402
from clagd.serve.server import Dispatcher, encode_reply  # noqa: E402
from clagd.text import tokenize  # noqa: E402


def build_index(n: int, unsorted: int = 0, removed: int = 0) -> Index:
    """The index of `bench_scale.build_store`'s store of `n` memories (+ unsorted ones)."""
    texts = memories(n + unsorted, seed=5)
    clusters = []
    for c in range(0, n, PER_CLUSTER):
        chunk = texts[c : min(n, c + PER_CLUSTER)]
        mems = [
            Memory.new(t, (T0 + timedelta(hours=c, seconds=10 * i)).strftime("%Y-%m-%dT%H:%M:%SZ"))
            for i, t in enumerate(chunk)
        ]
        words = [w for w in tokenize(chunk[0], stem=False) if len(w) > 3][:3] or ["notes"]
        cid = f"c-{c // PER_CLUSTER:08x}"
        clusters.append(Cluster(cid, " ".join(words), f"{len(mems)} memories.", memories=mems))
    burst = [
        Memory.new(t, (T0 + timedelta(days=3650, seconds=i)).strftime("%Y-%m-%dT%H:%M:%SZ"))
        for i, t in enumerate(texts[n:])
    ]
    index = Index.build(clusters, burst)
    if removed:
        changed = []
        for c in clusters[: min(removed, len(clusters))]:
            changed.append(Cluster(c.id, c.name, c.description, memories=c.memories[1:]))
        index = index.apply(IndexChange(upsert_clusters=changed))
    return index


def timed(fn, texts: list[str]) -> list[float]:  # type: ignore[no-untyped-def]
    out = []
    for t in texts:
        t0 = time.perf_counter()
        fn(t)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "p50": pct(samples, 0.5),
        "p99": pct(samples, 0.99),
        "mean": statistics.fmean(samples),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--unsorted", type=int, default=0)
    ap.add_argument("--removed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    t0 = time.perf_counter()
    index = build_index(args.size, args.unsorted, args.removed)
    build_s = time.perf_counter() - t0
    qs = list(dict.fromkeys(queries(20 * args.queries, seed=3)))[: args.queries][20:]
    dispatcher = Dispatcher()
    dispatcher.op("query", lambda p: answer(index, QueryParams.from_request(p))[0])

    def worker(text: str) -> bytes:
        line = json.dumps({"op": "query", "text": text, "id": 1}).encode() + b"\n"
        return encode_reply(dispatcher.handle(json.loads(line)))

    for q in qs[:20]:  # warm-up
        worker(q)
    rows: dict[str, list[dict[str, float]]] = {"search": [], "worker": []}
    kept = [getattr(index, k, None) for k in ("_m_terms", "_c_terms")]
    if all(kept):
        rows["cold"] = []
    sizes: list[int] = []
    for r in range(args.repeats):
        rows["search"].append(
            summary(timed(index.search, [f"{q} {'!' * (2 * r + 1)}" for q in qs]))
        )
        sizes = [k.size for k in kept if k]
        if "cold" in rows:
            limits = [k.limit for k in kept]
            for k in kept:
                k.limit, k.terms, k.size = 0, {}, 0
            rows["cold"].append(summary(timed(index.search, [f"{q} {'.' * (r + 1)}" for q in qs])))
            for k, limit in zip(kept, limits):
                k.limit = limit
        rows["worker"].append(summary(timed(worker, [f"{q} {'?' * (2 * r + 2)}" for q in qs])))
    if args.json:
        print(json.dumps({"build_s": build_s, "memories": len(index), **rows}, indent=1))
        return
    import clagd

    print(f"clagd from {Path(clagd.__file__).parent}")
    print(f"{len(index)} memories ({args.unsorted} unsorted), built in {build_s:.1f} s")
    print(f"{len(qs)} queries x {args.repeats} repeats; ms")
    if sizes:
        print(f"postings kept after a repeat: {sizes[0]} memory level, {sizes[1]} cluster level")
    for name, runs in rows.items():
        for r, row in enumerate(runs):
            print(
                f"  {name:7} r{r}  p50 {row['p50']:.3f}  p99 {row['p99']:.3f}  mean {row['mean']:.3f}"
            )


if __name__ == "__main__":
    main()
