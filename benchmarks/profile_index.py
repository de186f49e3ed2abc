"""The index's costs on realistic stores (issue 26), in process: what grows with clusters.

    python benchmarks/profile_index.py [--sizes 10000,40000] [--cache DIR] [--profile]
        [--queries 200] [--repeats 3]

For each size it builds (once; kept in `--cache`) a store the way `bench_scale.py
--layouts realistic` does (`realistic.py`: bursts organized by the lexical organizer,
~12 memories a cluster), then times, best of `--repeats`:

* `load`: `engine.loader.load_store` in this process only (workers=1), the start-up path
  without a warm start, and `engine`: the whole `Engine(...)` construction from the files;
* `query`: `Index.search` of `--queries` distinct questions (each cut to its first stage,
  the cluster scores, `c_stage`, and the whole search, `search`), p50 / p99 per query;
* `apply1`: `Index.apply` of a one-memory add (unsorted) and `route1` of one memory routed
  into a cluster (the cluster upserted), ms each;
* `route100`: `Index.route_many` of 100 new memories, ms.

`--profile` prints the top of a cProfile of each step (cumulative time).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from bench_scale import build_store  # noqa: E402
from corpus import memories, queries  # noqa: E402

from clagd.change import IndexChange  # noqa: E402
from clagd.config import load_config  # noqa: E402
from clagd.engine.core import Engine  # noqa: E402
from clagd.engine.loader import load_store  # noqa: E402
from clagd.model import Memory  # noqa: E402
from clagd.retrieval.index import Index  # noqa: E402


def say(msg: str) -> None:
    print(f"[profile_index] {msg}", file=sys.stderr, flush=True)


def store_of(cache: Path, n: int, layout: str = "realistic") -> Path:
    """The store of `n` memories in this layout (`bench_scale.build_store`), built once."""
    root = cache / f"{layout}-{n}"
    if (root / ".clagd-bench-done").exists():
        return root
    say(f"building a {layout} store of {n} memories in {root}")
    build_store(root, memories(n, seed=5), None, 0, layout)
    (root / ".clagd-bench-done").write_text("done\n")
    return root


def best(fn: Callable[[], object], repeats: int) -> float:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return min(out)


def profiled(name: str, fn: Callable[[], object], on: bool, top: int = 18) -> None:
    if not on:
        return
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(top)
    print(f"---- cProfile: {name}\n{buf.getvalue()}", flush=True)


def pcts(xs: list[float]) -> str:
    s = sorted(xs)
    p99 = s[min(len(s) - 1, int(round(0.99 * (len(s) - 1))))]
    return f"{statistics.median(s) * 1e3:.2f} / {p99 * 1e3:.2f}"


def measure(root: Path, n_q: int, repeats: int, prof: bool) -> dict[str, str]:
    cfg = load_config(root)
    out: dict[str, str] = {}
    out["load_s"] = f"{best(lambda: load_store(root, cfg, workers=1), repeats):.2f}"
    profiled("load_store", lambda: load_store(root, cfg, workers=1), prof)
    ix = load_store(root, cfg, workers=1).index
    out["clusters"] = str(ix.n_clusters)
    out["memories"] = str(len(ix))

    def engine() -> None:
        for p in (root / ".clagd").glob("warm*"):
            p.unlink()
        Engine(root, cfg, start=False)

    out["engine_s"] = f"{best(engine, repeats):.2f}"
    profiled("Engine (from files)", engine, prof)

    qs = list(dict.fromkeys(queries(20 * n_q, seed=3)))[:n_q]
    c_times, s_times = [], []
    fresh = Index.build([], [], cfg.retrieval, cfg.ingest)  # warm imports
    fresh.search("x")
    for r in range(repeats):
        for q in qs:
            text = q + " " + "!" * r
            t = time.perf_counter()
            ix.cluster_bm25.scores(ix.term_ids(text))
            c_times.append(time.perf_counter() - t)
            t = time.perf_counter()
            ix.search(text + "?")
            s_times.append(time.perf_counter() - t)
    out["c_stage_ms"] = pcts(c_times)
    out["search_ms"] = pcts(s_times)
    profiled("200 searches", lambda: [ix.search(q + " #") for q in qs], prof)

    news = [Memory.new(t, "2030-01-01T00:00:00Z") for t in memories(100, seed=99)]
    add1 = IndexChange(add_unsorted=(news[0],))
    out["apply1_ms"] = f"{best(lambda: ix.apply(add1, routes=True), repeats * 3) * 1e3:.2f}"
    profiled("apply one unsorted add", lambda: [ix.apply(add1) for _ in range(20)], prof)
    c0 = next(ix.profiles.clusters[s] for s in ix.profiles.slot_of.values())
    grown = replace(c0, memories=[*c0.memories, news[1]])
    up1 = IndexChange(upsert_clusters=(grown,))
    out["route1_ms"] = f"{best(lambda: ix.apply(up1), repeats * 3) * 1e3:.2f}"
    profiled("apply one routed memory", lambda: [ix.apply(up1) for _ in range(20)], prof)
    out["route100_ms"] = f"{best(lambda: ix.route_many(news), repeats) * 1e3:.1f}"
    profiled("route_many(100)", lambda: [ix.route_many(news) for _ in range(5)], prof)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10000,40000")
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "clagd-profile-index"))
    ap.add_argument("--layouts", default="realistic", help="realistic, runs50 or both")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    cache = Path(a.cache)
    cache.mkdir(parents=True, exist_ok=True)
    rows = {}
    for n in [int(x) for x in a.sizes.split(",") if x]:
        for layout in a.layouts.split(","):
            root = store_of(cache, n, layout)
            say(f"{n} {layout}: measuring")
            col = f"{n:,} {layout}"
            rows[col] = measure(root, a.queries, a.repeats, a.profile)
            print(col, rows[col], flush=True)
    keys = list(next(iter(rows.values())))
    print("| figure | " + " | ".join(rows) + " |")
    print("|---|" + "---|" * len(rows))
    for k in keys:
        print(f"| {k} | " + " | ".join(r[k] for r in rows.values()) + " |")


if __name__ == "__main__":
    main()
