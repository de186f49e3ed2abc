"""An inbox burst on a realistic store, in process (issue 26): what each ingest commit and
the route pass cost as the number of clusters grows, and what an `add` waits beside them.

A store shaped as the daemon shapes one (`realistic.py`, ~9-12 memories a cluster; built
once per size under `--cache`, as `bench_holds.py` does), an engine on a copy of it, then
`--burst` memories ingested in batches of `--batch` (each above `route_inline_max`: committed
unsorted, scored for the route pass), `ingest.route_delay_seconds` of quiet, and the route
pass to its last slice. With `--adds`, one client adds a memory back to back meanwhile.

Prints memories/s (ingest, and until routed), each writer operation's holds, the commits'
time on the git thread and each git command's time (count, sum, mean, max).

    python benchmarks/bench_burst.py [--sizes 10000,40000] [--burst 2000] [--batch 200]
        [--adds] [--idle N] [--profile]

`--idle N`: N adds one after the other before the burst, nothing else running (what one
`add` costs on the store: its p50/p99 and its commit's time on the git thread).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from bench_holds import built_store, pct  # noqa: E402
from corpus import memories  # noqa: E402

from clagd.engine.core import Engine  # noqa: E402
from clagd.ingest.inbox import Item  # noqa: E402
from clagd.store import gitcmd  # noqa: E402
from clagd.store import writer as writer_mod  # noqa: E402


class Timings:
    """Writer operations, commits on the git thread and git commands, timed (ms)."""

    def __init__(self, profile: bool) -> None:
        self.ops: dict[str, list[float]] = {}
        self.commits: list[float] = []
        self.git: dict[str, list[float]] = {}
        self.profiles: dict[str, cProfile.Profile] = {}
        self.profile = profile
        self._undo: list[Callable[[], None]] = []

    def install(self) -> None:
        t = self
        run, grun = writer_mod.Queued.run, gitcmd.GitRunner.run
        cbp = writer_mod.Writer.commit_beside_prepare

        def timed(name: str, into: list[float], fn: Callable[[], Any]) -> Any:
            prof = t.profiles.setdefault(name, cProfile.Profile()) if t.profile else None
            start = time.perf_counter()
            if prof is not None:
                prof.enable()
            try:
                return fn()
            finally:
                if prof is not None:
                    prof.disable()
                into.append((time.perf_counter() - start) * 1000)

        def op(item: Any, ctx: Any) -> Any:
            return timed(item.name, t.ops.setdefault(item.name, []), lambda: run(item, ctx))

        def git(self: Any, *args: str, **kw: Any) -> str:
            cmd = next((a for a in args if not a.startswith("-") and "=" not in a), "?")
            start = time.perf_counter()
            try:
                return grun(self, *args, **kw)
            finally:
                t.git.setdefault(cmd, []).append((time.perf_counter() - start) * 1000)

        def commit_beside(self: Any, commit: Callable[[], Any], change: Any) -> Any:
            return cbp(self, lambda: timed("git-thread commit", t.commits, commit), change)

        writer_mod.Queued.run = op  # type: ignore[method-assign]
        gitcmd.GitRunner.run = git  # type: ignore[method-assign]
        writer_mod.Writer.commit_beside_prepare = commit_beside  # type: ignore[method-assign]

        def undo() -> None:
            writer_mod.Queued.run = run  # type: ignore[method-assign]
            gitcmd.GitRunner.run = grun  # type: ignore[method-assign]
            writer_mod.Writer.commit_beside_prepare = cbp  # type: ignore[method-assign]

        self._undo.append(undo)

    def uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()


def idle_adds(eng: Engine, k: int) -> tuple[float, float, float, float]:
    """`k` adds one after the other with nothing else running (after 3 to warm up): p50,
    p99 and max of each add, and the mean of its commit on the git thread (ms)."""
    for i in range(3):
        eng.add([{"content": f"bench warm-up add {i}: the user noted item {i}"}])
    t = Timings(profile=False)
    t.install()
    lat = []
    try:
        for i in range(k):
            start = time.perf_counter()
            eng.add([{"content": f"bench idle add {i}: the user noted thing {i} for later"}])
            lat.append((time.perf_counter() - start) * 1000)
    finally:
        t.uninstall()
    return pct(lat, 0.5), pct(lat, 0.99), max(lat), sum(t.commits) / max(1, len(t.commits))


def run_size(n: int, a: argparse.Namespace, t: Timings) -> dict[str, Any]:
    texts = memories(n + a.burst, seed=5)
    src = built_store(Path(a.cache), n, texts[:n])
    store = Path(a.cache) / "work" / f"burst-{n}"
    shutil.rmtree(store, ignore_errors=True)
    shutil.copytree(src, store, symlinks=True)
    eng = Engine(store)
    out: dict[str, Any] = {"memories": n, "clusters": eng.index.n_clusters}
    fresh = texts[n:]
    stop, adds = threading.Event(), []

    def adder() -> None:
        i = 0
        while not stop.is_set():
            start = time.perf_counter()
            eng.add([{"content": f"bench burst add {i}: the user noted item {i} for later"}])
            adds.append((time.perf_counter() - start) * 1000)
            i += 1

    th = threading.Thread(target=adder) if a.adds else None
    if a.idle:
        out["idle"] = idle_adds(eng, a.idle)
    t.install()
    try:
        if th is not None:
            th.start()
        t0 = time.perf_counter()
        for i in range(0, len(fresh), a.batch):
            batch = [Item(x, None, {}) for x in fresh[i : i + a.batch]]
            eng.ingest(batch, source="inbox", files=max(1, len(batch) // 5))
        ingest_s = time.perf_counter() - t0
        time.sleep(eng.config.ingest.route_delay_seconds)  # the quiet the pass waits for
        while eng.maybe_route(force=True) is not None and len(eng.routes):
            pass
        routed_s = time.perf_counter() - t0
        stop.set()
        if th is not None:
            th.join()
        out["ingest_per_s"] = len(fresh) / ingest_s
        out["routed_per_s"] = len(fresh) / routed_s
        out["routed"] = eng.counters["routed"]
        if adds:
            out["adds"] = (len(adds), pct(adds, 0.5), pct(adds, 0.99), max(adds))
    finally:
        stop.set()
        t.uninstall()
        eng.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10000,40000")
    ap.add_argument("--burst", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--adds", action="store_true")
    ap.add_argument("--idle", type=int, default=0, help="idle adds timed before the burst")
    ap.add_argument("--cache", default="/tmp/clagd-holds-cache")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    (Path(a.cache) / "work").mkdir(parents=True, exist_ok=True)
    for n in [int(x) for x in a.sizes.split(",") if x]:
        t = Timings(a.profile)
        r = run_size(n, a, t)
        print(f"\n## {n} memories, {r['clusters']} clusters, burst {a.burst} in {a.batch}s")
        print(f"  ingest {r['ingest_per_s']:.0f} memories/s, until routed {r['routed_per_s']:.0f}")
        print(f"  routed {r['routed']}")
        if "idle" in r:
            p50, p99, most, commit = r["idle"]
            print(
                f"  idle adds: n={a.idle} p50 {p50:.0f} p99 {p99:.0f} max {most:.0f} ms,"
                f" git-thread commit mean {commit:.0f} ms"
            )
        if "adds" in r:
            k, p50, p99, most = r["adds"]
            print(f"  adds beside: n={k} p50 {p50:.0f} p99 {p99:.0f} max {most:.0f} ms")
        for name, xs in t.ops.items():
            print(f"  op  {name:<20} n={len(xs):3d} sum {sum(xs):7.0f} max {max(xs):6.0f} ms")
        cs = t.commits or [0.0]
        print(
            f"  git-thread commits  n={len(t.commits):3d} sum {sum(cs):7.0f} max {max(cs):6.0f} ms"
        )
        for cmd, xs in sorted(t.git.items(), key=lambda kv: -sum(kv[1])):
            print(
                f"  git {cmd:<14} n={len(xs):4d} sum {sum(xs):7.0f} mean {sum(xs) / len(xs):5.1f}"
                f" max {max(xs):5.0f} ms"
            )
        for name, prof in t.profiles.items():
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(a.top)
            print(f"\n===== {name} =====\n{buf.getvalue()}")


if __name__ == "__main__":
    main()
