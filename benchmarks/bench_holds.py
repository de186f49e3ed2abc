"""How long each writer operation holds the writer on a realistic store (issue 26), in
process: a store shaped as the daemon shapes one (`realistic.py`: about 12 memories a
cluster), an engine on it, then inline ingests (10 memories), a deferred ingest of 100 and
its route pass, a clustering session (backend none) with `add`s back to back beside it, and
the archive job (its cold age set so about 2% of the clusters are cold). Prints the longest
hold of each operation (`status.writer.longest_by_op`) and the `add` latencies while the
session runs; `--profile` also prints each operation's cProfile (cumulative time).

    python benchmarks/bench_holds.py [--sizes 10000,40000] [--profile] [--top 25]

The stores are built once per size under `--cache` (a copy is used each run), so before and
after figures of a change are measured on the same store.
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
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from corpus import memories  # noqa: E402
from helpers import git, make_store  # noqa: E402
from realistic import cold_days, write_realistic  # noqa: E402

from clagd.engine.core import Engine  # noqa: E402
from clagd.ingest.inbox import Item  # noqa: E402
from clagd.store import writer as writer_mod  # noqa: E402


def say(msg: str) -> None:
    print(f"[bench_holds] {msg}", file=sys.stderr, flush=True)


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs) or [0.0]
    return s[min(len(s) - 1, int(round(p * (len(s) - 1))))]


def built_store(cache: Path, n: int, texts: list[str]) -> Path:
    """The realistic store of the first `n` texts, built once under `cache`."""
    src = cache / f"realistic-{n}"
    if not (src / ".git").exists():
        shutil.rmtree(src, ignore_errors=True)
        say(f"building the realistic store of {n}")
        extra = {"archive": {"cold_after_days": cold_days(texts, "realistic", 0.02)}}
        make_store(src, extra)
        write_realistic(src, texts)
        git(src, "add", "-A", "clusters")
        git(src, "commit", "-qm", "bench: clusters (realistic)")
    return src


class Profiles:
    """A cProfile per writer operation name, when asked."""

    def __init__(self, on: bool) -> None:
        self.on = on
        self.by_op: dict[str, cProfile.Profile] = {}
        self._orig = writer_mod.Queued.run

    def install(self) -> None:
        if not self.on:
            return
        profiles, orig = self, self._orig

        def run(item: Any, ctx: Any) -> Any:
            prof = profiles.by_op.setdefault(item.name, cProfile.Profile())
            prof.enable()
            try:
                return orig(item, ctx)
            finally:
                prof.disable()

        writer_mod.Queued.run = run  # type: ignore[method-assign]

    def uninstall(self) -> None:
        writer_mod.Queued.run = self._orig  # type: ignore[method-assign]

    def report(self, top: int) -> None:
        for name, prof in sorted(self.by_op.items()):
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(top)
            print(f"\n===== {name} =====")
            print(out.getvalue())


def adds_beside(eng: Engine, busy: threading.Thread, tag: str) -> list[float]:
    """`add` latencies (ms, one memory each, back to back) while `busy` runs."""
    out: list[float] = []
    i = 0
    while busy.is_alive() or not out:
        t = time.perf_counter()
        eng.add([{"content": f"bench {tag} add {i}: the user noted item {i} for later"}])
        out.append((time.perf_counter() - t) * 1000)
        i += 1
    return out


def run_size(n: int, cache: Path, work: Path, prof: Profiles) -> dict[str, Any]:
    texts = memories(n + 300, seed=5)
    base, fresh = texts[:n], texts[n:]
    src = built_store(cache, n, base)
    store = work / f"run-{n}"
    shutil.rmtree(store, ignore_errors=True)
    shutil.copytree(src, store, symlinks=True)
    t = time.perf_counter()
    eng = Engine(store)
    say(f"{n}: loaded in {time.perf_counter() - t:.1f} s, {eng.index.n_clusters} clusters")
    prof.install()
    out: dict[str, Any] = {"memories": n, "clusters": eng.index.n_clusters}
    try:
        eng.writer.holds.reset()
        eng.stats.since = 0.0  # statistics as old as the store: the oldest clusters are cold
        inline = []
        for k in range(5):  # inline-routed batches (at most route_inline_max)
            t = time.perf_counter()
            eng.ingest([Item(x, None, {}) for x in fresh[10 * k : 10 * k + 10]], source="bench")
            inline.append((time.perf_counter() - t) * 1000)
        out["ingest10_ms"] = inline
        t = time.perf_counter()
        eng.ingest([Item(x, None, {}) for x in fresh[100:200]], source="bench")
        out["ingest100_ms"] = (time.perf_counter() - t) * 1000
        t = time.perf_counter()
        while eng.maybe_route(force=True) is not None and len(eng.routes):
            pass
        out["route_ms"] = (time.perf_counter() - t) * 1000
        # a session with adds beside it (as a daemon's clients would)
        res: dict[str, Any] = {}
        th = threading.Thread(target=lambda: res.update(o=eng.recluster(backend="none")))
        t = time.perf_counter()
        th.start()
        adds = adds_beside(eng, th, "s")
        th.join()
        o = res["o"]
        out["session_s"] = time.perf_counter() - t
        out["session_status"] = f"{o.status} ({len(o.commits)} commits, {o.sampled} sampled)"
        out["add_session_ms"] = (pct(adds, 0.5), pct(adds, 0.99), max(adds), len(adds))
        th = threading.Thread(target=lambda: res.update(a=eng.archive()))
        th.start()
        adds = adds_beside(eng, th, "a")
        th.join()
        out["archived"] = len(res["a"].clusters)
        out["add_archive_ms"] = (pct(adds, 0.5), pct(adds, 0.99), max(adds), len(adds))
        out["holds"] = dict(sorted(eng.writer.holds.by_op.items()))
    finally:
        prof.uninstall()
        eng.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10000,40000")
    ap.add_argument("--cache", default="/tmp/clagd-holds-cache")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    cache, work = Path(a.cache), Path(a.cache) / "work"
    work.mkdir(parents=True, exist_ok=True)
    prof = Profiles(a.profile)
    for n in [int(x) for x in a.sizes.split(",") if x]:
        r = run_size(n, cache, work, prof)
        print(f"\n## {n} memories, {r['clusters']} clusters")
        for k, v in r.items():
            if k == "holds":
                for op, ms in v.items():
                    print(f"  hold {op:<24} {ms:9.1f} ms")
            elif isinstance(v, float):
                print(f"  {k:<29} {v:9.1f}")
            elif isinstance(v, (list, tuple)):
                print(f"  {k:<29} " + " / ".join(f"{x:.0f}" for x in v))
            else:
                print(f"  {k:<29} {v}")
        prof.report(a.top)
        prof.by_op.clear()


if __name__ == "__main__":
    main()
