"""What the daemon's `git gc --auto` costs the queries (store/packing.py).

A store of `--size` memories in clusters (bench_scale's), made to hold the loose objects of
`--bursts` route passes (bursts of `--burst` memories dropped into the inbox of a running
daemon, each ~500 rewritten cluster files at 100k). Then, against that daemon over its socket
(1 client, each query distinct):

  * the baseline: queries while no gc runs (`gc.auto = 0` in the store: the daemon's runs
    find nothing to do);
  * the same number of queries while the daemon's own gc packs the store (`gc.auto` back
    on, the next housekeeping run starts it: nice 19, one thread);

and how long that gc ran, what it packed, and the loose objects before and after.

    python benchmarks/bench_gc.py [--size 100000] [--bursts 4] [--burst 2000] [--queries 3000]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from bench_scale import build_store, drop_burst, pct, wait_serving  # noqa: E402
from corpus import memories, queries  # noqa: E402
from helpers import DaemonProcess, git, wait_for  # noqa: E402

from clagd.client import Client  # noqa: E402


def say(msg: str) -> None:
    print(f"[bench_gc] {msg}", file=sys.stderr, flush=True)


def objects(store: Path) -> dict[str, str]:
    """`git count-objects -vH`: "count" (loose objects), "size-pack" (human), ..."""
    out = git(store, "count-objects", "-vH")
    return dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)


def ask(sock: Path, qs: list[str], until: Callable[[], bool] | None = None) -> list[float]:
    """Query latencies (ms) for `qs`, stopping early once `until()` is true."""
    out = []
    with Client(sock, timeout=60) as c:
        for i, q in enumerate(qs):
            t = time.perf_counter()
            c.query(q)
            out.append((time.perf_counter() - t) * 1000)
            if until is not None and i % 50 == 0 and until():
                break
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=100_000)
    ap.add_argument("--bursts", type=int, default=4)
    ap.add_argument("--burst", type=int, default=2000, help="memories per burst")
    ap.add_argument("--queries", type=int, default=3000)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    texts = memories(a.size + a.bursts * a.burst, seed=5)
    # distinct texts (no hot-cache hits): the corpus's questions, then again with "!"s
    base_qs = list(dict.fromkeys(queries(4000, seed=3)))
    qs = [q + " " + "!" * r for r in range(2 * a.queries // len(base_qs) + 1) for q in base_qs]
    qs = qs[: 2 * a.queries]
    with tempfile.TemporaryDirectory(prefix="clagd-gc-", dir="/tmp") as tmp:
        store = build_store(Path(tmp) / "store", texts[: a.size], None, 1)
        cfg = store / "clagd.yaml"
        # a gc check every 3 s (the shipped 10 minutes would never come in a benchmark)
        cfg.write_text(cfg.read_text() + "git:\n  gc_interval_minutes: 0.05\n")
        git(store, "config", "gc.auto", "0")
        d = DaemonProcess(store, Path(tmp) / "s.sock")
        d.start()
        try:
            wait_serving(d, 1)
            for b in range(a.bursts):
                say(f"burst {b + 1}/{a.bursts}: {a.burst} memories")
                with d.client() as c:
                    before = c.status()["counters"]["routed"]
                    passes = c.status()["counters"]["route_passes"]
                drop_burst(
                    store / "inbox", texts[a.size + b * a.burst : a.size + (b + 1) * a.burst]
                )

                def routed(before: int = before, passes: int = passes) -> bool:
                    with d.client() as c:
                        st = c.status()
                    return st["counters"]["route_passes"] > passes and not st["route_pending"]

                wait_for(routed, 600, "the route pass")
            n_loose = int(objects(store)["count"])
            say(f"{n_loose} loose objects; baseline queries (no gc)")
            ask(d.socket, qs[:50])  # warm-up
            base = ask(d.socket, qs[: a.queries])
            with d.client() as c:
                runs0 = c.status()["git_gc"]["runs"]
            git(store, "config", "gc.auto", "1")  # git's threshold from now on: any loose object

            def gc_running() -> bool:
                with d.client() as c:
                    return bool(c.status()["git_gc"]["running"])

            def gc_done() -> dict | None:
                with d.client() as c:
                    st = c.status()["git_gc"]
                return st if st["runs"] > runs0 and not st["running"] else None

            say("waiting for the daemon's gc to start")
            wait_for(lambda: gc_running() or gc_done(), 60, "the daemon's gc", max_delay=0.02)
            t = time.perf_counter()
            during = ask(d.socket, qs[a.queries :], until=lambda: not gc_running())
            st = wait_for(gc_done, 600, "the gc to finish")
            gc_s = time.perf_counter() - t
        finally:
            d.terminate()
        after = objects(store)
    res = {
        "memories": a.size,
        "loose_before": n_loose,
        "loose_after": int(after["count"]),
        "size_pack": after.get("size-pack", "?"),
        "gc_result": st["last_result"],
        "gc_seconds_seen": round(gc_s, 2),
        "queries_baseline": len(base),
        "queries_during_gc": len(during),
        "p50_baseline_ms": round(pct(base, 0.5), 3),
        "p99_baseline_ms": round(pct(base, 0.99), 3),
        "p50_during_gc_ms": round(pct(during, 0.5), 3),
        "p99_during_gc_ms": round(pct(during, 0.99), 3),
    }
    res["p99_ratio"] = round(res["p99_during_gc_ms"] / res["p99_baseline_ms"], 2)
    if a.json:
        print(json.dumps(res, indent=2))
        return
    for k, v in res.items():
        print(f"{k:<22} {v}")


if __name__ == "__main__":
    main()
