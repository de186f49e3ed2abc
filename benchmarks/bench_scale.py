"""Benchmarks at scale (issue 7): stores of 1k, 10k and 100k memories in clusters.

For each size, against a real daemon (`python -m clagd run`, a subprocess) over its real
Unix socket:
  * start-up: from the YAML files (first start / after a crash) and from the start-up
    snapshot (after a clean stop; the median of three), until the daemon answers `ping`;
  * RSS of the daemon process and its query processes (VmRSS, after the queries);
  * query latency p50/p99 with 1 client and with 16 concurrent clients (processes), each
    query distinct (no hot-cache hits), plus the hot (repeated) query latency;
  * ingest throughput: memories dropped into the inbox as files (tmp + rename), inbox to
    commit, and until the route pass has moved those with a strong match into clusters;
and, in the same run over the same memories, flat rank-bm25 (BM25Okapi.get_top_n) and bm25s
(in-process, no socket), as ratios.

Memories are LoCoMo turns recombined (`corpus.py`). Two store layouts (`--layouts`):
`realistic` (issue 26: bursts organized by the lexical organizer with its own cluster
sizes, `realistic.py`, about 12 memories a cluster) and `runs50`, the old one (runs of 50
consecutive memories written straight into cluster files). On each, also (`--holds`):
  * a session's wall time and the longest writer hold of its operations
    (`status.writer.longest_by_op`), with `add` latency (1 client, back to back) while the
    session runs, while a route pass runs (a burst dropped into the inbox) and while the
    archive job runs (its cold age set so about 2% of the clusters are cold);
  * clusters over `session.max_cluster_size` after all that.

    python benchmarks/bench_scale.py [--sizes 1000,10000,100000] [--queries 300] [--repeats 3]
        [--layouts realistic,runs50] [--organize-size 10000] [--organize-burst 10000] [--json]

`--sizes ""` runs only the while-organizing rows; `--organize-size 0` skips them. Those
rows are measured once per `--organize-query-processes` value (default 0 and 1: the daemon
answering queries itself, the baseline, and the shipped query process), side by side. The
sizes' daemons run with `--query-processes` (the shipped 1); every query is asked once the
query processes serve.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from corpus import memories, queries  # noqa: E402
from helpers import DaemonProcess, git, make_store, wait_for  # noqa: E402
from realistic import cold_days, write_realistic  # noqa: E402

from clagd.client import Client  # noqa: E402
from clagd.model import Cluster, Memory  # noqa: E402
from clagd.store.files import Paths, write_cluster  # noqa: E402
from clagd.text import tokenize  # noqa: E402

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
PER_CLUSTER = 50


def say(msg: str) -> None:
    print(f"[bench_scale] {msg}", file=sys.stderr, flush=True)


def pct(samples: list[float], p: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(round(p * (len(s) - 1))))]


# the shipped session triggers (store_template/clagd.yaml), not the tests' "never"
DEFAULT_SESSIONS = {"memory_add_threshold": 20, "dialogue_round_threshold": 100}


def build_store(
    root: Path,
    texts: list[str],
    sessions: dict | None = None,
    query_processes: int = 1,
    layout: str = "runs50",
    extra: dict | None = None,
) -> Path:
    # the shipped inbox timing (store_template/clagd.yaml), not the tests' faster polling:
    # the debounce is what turns a burst of files into a few large commits
    cfg: dict = {
        "inbox": {"settle_seconds": 1.0, "rescan_seconds": 2.0, "debounce_seconds": 0.3},
        "server": {"query_processes": query_processes},
        **(extra or {}),
    }
    if sessions:
        cfg["session"] = sessions
    store = make_store(root, cfg)
    # access statistics as old as the memories, so the oldest clusters are cold (without
    # any, a fresh store's clusters count as read at its start: nothing is archived)
    (store / ".git" / "clagd-stats.json").write_text('{"since": 1, "memories": {}, "clusters": {}}')
    if layout == "realistic":
        write_realistic(store, texts)
        git(store, "add", "-A", "clusters")
        git(store, "commit", "-qm", "bench: clusters (realistic)")
        return settled(store)
    paths = Paths(store)
    for c in range(0, len(texts), PER_CLUSTER):
        chunk = texts[c : c + PER_CLUSTER]
        mems = [
            Memory.new(t, (T0 + timedelta(hours=c, seconds=10 * i)).strftime("%Y-%m-%dT%H:%M:%SZ"))
            for i, t in enumerate(chunk)
        ]
        words = [w for w in tokenize(chunk[0], stem=False) if len(w) > 3][:3] or ["notes"]
        cid = f"c-{c // PER_CLUSTER:08x}"
        write_cluster(paths, Cluster(cid, " ".join(words), f"{len(mems)} memories.", memories=mems))
    git(store, "add", "-A", "clusters")
    git(store, "commit", "-qm", "bench: clusters")
    return settled(store)


def settled(store: Path) -> Path:
    """`store` once what writing it left in the page cache is on disk: the daemon's commits
    flush their file system (`syncfs`), and its first one would otherwise write back the
    whole store the benchmark has just written (241 ms at 100k realistic: the longest
    inbox-commit hold of a run)."""
    os.sync()
    return store


def _client_worker(args: tuple[str, list[str]]) -> list[float]:
    sock, qs = args
    out = []
    with Client(sock, timeout=60) as c:
        for q in qs:
            t = time.perf_counter()
            c.query(q)
            out.append((time.perf_counter() - t) * 1000)
    return out


def socket_latency(sock: str, qs: list[str], clients: int) -> list[float]:
    if clients == 1:
        return _client_worker((sock, qs))
    parts = [(sock, qs[i::clients]) for i in range(clients)]
    with mp.get_context("fork").Pool(clients) as pool:
        return [x for part in pool.map(_client_worker, parts) for x in part]


def wait_serving(d: DaemonProcess, n: int) -> None:
    """Until the configured query processes serve (they start after the daemon answers
    ping; until then the daemon answers queries itself)."""

    def ready() -> bool:
        with d.client() as c:
            return c.status()["query_processes"]["serving"] >= n

    wait_for(ready, 120, "the query processes")


def drop_burst(inbox: Path, texts: list[str], per_file: int = 5) -> int:
    """The texts as inbox files of `per_file` memories (complete in .tmp, renamed in)."""
    n = 0
    for i in range(0, len(texts), per_file):
        name = f"b{i:07d}.json"
        payload = json.dumps([{"content": x} for x in texts[i : i + per_file]])
        (inbox / ".tmp" / name).write_text(payload)
        os.rename(inbox / ".tmp" / name, inbox / name)
        n += 1
    return n


def burst_done(st: dict, files: int) -> bool:
    """Every file of the burst taken, nothing queued on the writer, no route pass pending."""
    inbox = st.get("inbox", {})
    return (
        inbox.get("files_ingested", 0) + inbox.get("files_rejected", 0) >= files
        and not st["writer"]["pending"]
        and not st["route_pending"]
    )


def bench_organizing(n: int, burst: int, n_queries: int, tmp: Path, qp: int = 1) -> dict:
    """Query latency (1 client, socket) idle, then while the daemon organizes: right after a
    burst of `burst` memories into a store of `n`, with the shipped session triggers, while
    the ingest, the route pass and the sessions triggered by the burst and by the queries'
    own rounds run. Queries are asked back to back until the burst is ingested and routed
    and a session has ended after that (the queries' rounds keep triggering sessions, so
    the daemon is never idle while they are asked)."""
    say(f"{n}: while organizing: store of {n}, burst of {burst}, {qp} query processes")
    texts = memories(n + burst, seed=7)
    store = build_store(tmp / f"org-{n}-{qp}", texts[:n], DEFAULT_SESSIONS, qp)
    sock = tmp / f"o{n}-{qp}.sock"
    d = DaemonProcess(store, sock)
    start(d)
    wait_serving(d, qp)
    qs = list(dict.fromkeys(queries(20 * n_queries, seed=11)))[:n_queries]
    socket_latency(str(sock), qs[:20], 1)  # warm-up
    idle = socket_latency(str(sock), [q + " ." for q in qs[20:]], 1)
    with d.client() as c:
        st0 = c.status()
    files = st0["inbox"]["files_ingested"] + drop_burst(store / "inbox", texts[n:])
    busy: list[float] = []
    t0 = time.perf_counter()
    with Client(str(sock), timeout=60) as c, Client(str(sock), timeout=60) as watch:
        r, sessions_then = 0, None
        while time.perf_counter() - t0 < 120:  # bounded: a daemon whose sessions stall
            for q in qs[20:60]:
                t = time.perf_counter()
                c.query(f"{q} {r}")
                busy.append((time.perf_counter() - t) * 1000)
            r += 1
            st = watch.status()
            if sessions_then is None and burst_done(st, files):
                sessions_then = st["counters"]["sessions"]
            elif sessions_then is not None and st["counters"]["sessions"] > sessions_then:
                break
    busy_s = time.perf_counter() - t0
    d.terminate()
    return {
        "org_query_processes": qp,
        "org_memories": n,
        "org_burst": burst,
        "org_idle_p50_ms": pct(idle, 0.5),
        "org_idle_p99_ms": pct(idle, 0.99),
        "org_busy_p50_ms": pct(busy, 0.5),
        "org_busy_p99_ms": pct(busy, 0.99),
        "org_busy_queries": len(busy),
        "org_busy_s": busy_s,
        "org_sessions": st["counters"]["sessions"] - st0["counters"]["sessions"],
    }


def rss_mb(pid: int) -> float:
    """VmRSS of the daemon plus its query processes (its children)."""
    total = 0.0
    for p in [pid, *children(pid)]:
        for line in Path(f"/proc/{p}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) / 1024
    return total


def children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d.name))
    return out


def start(d: DaemonProcess) -> float:
    """Seconds from launching `clagd run` until it answers ping (polled every 10 ms; the
    tests' helper backs off to 0.2 s, which would add up to that much to the figure)."""
    t = time.perf_counter()
    d.start(wait=False)
    deadline = t + 120
    while not d.ready():
        if time.perf_counter() > deadline:
            raise AssertionError("the daemon did not answer ping within 120 s")
        time.sleep(0.01)
    return time.perf_counter() - t


def flat_baselines(texts: list[str], qs: list[str], n_q: int) -> dict:
    from rank_bm25 import BM25Okapi

    toks = [tokenize(t) for t in texts]
    t = time.perf_counter()
    okapi = BM25Okapi(toks, k1=1.2, b=0.75)
    okapi_build = time.perf_counter() - t
    lat = []
    for q in qs[:n_q]:
        t = time.perf_counter()
        okapi.get_top_n(tokenize(q), texts, n=5)
        lat.append((time.perf_counter() - t) * 1000)
    import bm25s

    t = time.perf_counter()
    ret = bm25s.BM25(k1=1.2, b=0.75)
    ret.index(toks, show_progress=False)
    bm25s_build = time.perf_counter() - t
    lat2 = []
    for q in qs:
        t = time.perf_counter()
        qt = tokenize(q) or ["zzzz"]
        try:
            ret.retrieve([qt], k=5, show_progress=False, n_threads=1)
        except (ValueError, KeyError):  # bm25s refuses a query with no known term
            pass
        lat2.append((time.perf_counter() - t) * 1000)
    return {
        "rank_bm25": {"build_s": okapi_build, "p50_ms": pct(lat, 0.5), "p99_ms": pct(lat, 0.99)},
        "bm25s": {"build_s": bm25s_build, "p50_ms": pct(lat2, 0.5), "p99_ms": pct(lat2, 0.99)},
    }


SESSION_OPS = ("_snapshot_op", "_apply_op", "_size_view_op", "_size_policy_op")


def adds_while(sock: str, busy: Callable[[Client], bool], tag: str, limit: float = 300) -> list:
    """`add` latencies (ms, one memory each, back to back) while `busy(status client)`."""
    out: list[float] = []
    t0 = time.perf_counter()
    with Client(sock, timeout=120) as c, Client(sock, timeout=60) as watch:
        i = 0
        while time.perf_counter() - t0 < limit:
            t = time.perf_counter()
            c.add(f"bench {tag} add {i}: the user noted item {i} for later")
            out.append((time.perf_counter() - t) * 1000)
            i += 1
            if i % 5 == 0 and not busy(watch):
                break
    return out


def lat(prefix: str, xs: list[float]) -> dict:
    xs = xs or [0.0]
    return {
        f"{prefix}_p50_ms": pct(xs, 0.5),
        f"{prefix}_p99_ms": pct(xs, 0.99),
        f"{prefix}_max_ms": max(xs),
        f"{prefix}_n": len(xs),
    }


def bench_holds(d: DaemonProcess, sock: str, fresh: list[str]) -> dict:
    """A session, a route pass and the archive job on the running daemon, with `add`
    latency while each runs; the session's wall time and longest writer holds."""
    out: dict = {}
    with d.client() as c:
        c.recluster(wait=False)

    def session_on(w: Client) -> bool:
        a = w.status()["activity"]
        return bool(a["session_running"] or a["session_queued"])

    say("  adds while a session runs")
    out.update(lat("add_session", adds_while(sock, session_on, "s")))
    with d.client() as c:
        st = c.status()
    last = st["last_session"] or {}
    by_op = st["writer"]["longest_by_op"]
    out["session_s"] = last.get("seconds", 0.0)
    out["session_status"] = last.get("status", "")
    out["session_hold_ms"] = max(by_op.get(k, 0.0) for k in SESSION_OPS)
    out["session_holds_ms"] = {k: by_op[k] for k in SESSION_OPS if k in by_op}
    say("  adds while a route pass runs")
    files = st["inbox"]["files_ingested"] + drop_burst(Path(d.root) / "inbox", fresh, 50)

    def routing(w: Client) -> bool:
        s2 = w.status()
        return not burst_done(s2, files)

    out.update(lat("add_route", adds_while(sock, routing, "r")))
    say("  adds while the archive job runs")
    result: dict = {}

    def archive() -> None:
        with d.client(timeout=600) as c2:
            result.update(c2.call("archive"))

    th = threading.Thread(target=archive)
    th.start()
    out.update(lat("add_archive", adds_while(sock, lambda _w: th.is_alive(), "a")))
    th.join()
    out["archived"] = len(result.get("clusters", []))
    with d.client() as c:
        st = c.status()
        sizes = [x["size"] for x in c.clusters()["clusters"]]
    by_op = st["writer"]["longest_by_op"]
    out["route_hold_ms"] = by_op.get("_route_op", 0.0)
    out["archive_hold_ms"] = by_op.get("_archive_op", 0.0)
    out["ingest_hold_ms"] = by_op.get("_ingest_op", 0.0)
    out["over_max"] = sum(1 for x in sizes if x > MAX_CLUSTER)
    out["largest_cluster"] = max(sizes, default=0)
    out["rss_after_organizing_mb"] = rss_mb(d.proc.pid) if d.proc else 0.0
    return out


MAX_CLUSTER = 60  # session.max_cluster_size, shipped
# starts from the snapshot a run times (the median is reported): this machine runs in fast
# and slow spells 0.3-0.5 s apart at 100k, wider than one start's own spread
SNAPSHOT_STARTS = 3


def median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


def bench_size(
    n: int,
    n_queries: int,
    n_ingest: int,
    tmp: Path,
    repeats: int = 1,
    qp: int = 1,
    layout: str = "runs50",
    holds: bool = True,
) -> dict:
    say(f"{n} ({layout}): generating {n} memories")
    texts = memories(n + 2 * n_ingest, seed=5)
    base, fresh, later = texts[:n], texts[n : n + n_ingest], texts[n + n_ingest :]
    t_build = time.perf_counter()
    # sessions only when asked (as before: the query figures stay comparable); the
    # archive's cold age makes the oldest ~2% cold
    extra = {"archive": {"cold_after_days": cold_days(base, layout, 0.02)}}
    store = build_store(tmp / f"store-{n}-{layout}", base, None, qp, layout, extra)
    build_s = time.perf_counter() - t_build
    sock = tmp / f"s{n}{layout[0]}.sock"
    d = DaemonProcess(store, sock)
    say(f"{n}: starting the daemon from YAML")
    from_yaml = start(d)
    assert d.proc is not None
    with d.client() as c:
        st = c.status()
    wait_serving(d, qp)
    qs = list(dict.fromkeys(queries(20 * n_queries, seed=3)))[:n_queries]
    say(f"{n}: {len(qs)} queries, 1 client")
    socket_latency(str(sock), qs[:20], 1)  # warm-up (imports, caches of the daemon)
    with d.client() as c:  # 20 warm-up queries are now hot; use the rest cold
        pass
    # each repeat asks the same questions as new texts (trailing "!"s: no cache hits);
    # the reported percentiles are the medians over the repeats (the machine is shared)
    ones = [
        socket_latency(str(sock), [q + " " + "!" * r for q in qs[20:]], 1) for r in range(repeats)
    ]
    hot = socket_latency(str(sock), qs[:20] * 5, 1)
    say(f"{n}: 16 concurrent clients")
    sixteens = [
        socket_latency(str(sock), [q + " ?" + "!" * r for q in qs], 16) for r in range(repeats)
    ]
    rss = rss_mb(d.proc.pid)
    say(f"{n}: ingest {len(fresh)} memories through the inbox")
    with d.client() as c:
        before = c.status()["counters"]["added"]
    t = time.perf_counter()
    drop_burst(store / "inbox", fresh)

    def done() -> bool:
        with d.client() as c:
            return c.status()["counters"]["added"] - before >= len(fresh)

    # polled every 20 ms at most: the wait is what is timed
    wait_for(done, 600, "ingest", max_delay=0.02)
    ingest_s = time.perf_counter() - t

    def routed() -> dict | None:
        with d.client() as c:
            st = c.status()
        return st if st["route_pending"] == 0 else None

    # large batches are committed as unsorted files first; the route pass then moves the
    # memories with a strong match into their clusters once the inbox is quiet
    st_routed = wait_for(routed, 600, "the route pass", max_delay=0.02)
    routed_s = time.perf_counter() - t
    rss_after = rss_mb(d.proc.pid)
    held = bench_holds(d, str(sock), later) if holds else {}
    say(f"{n}: clean stop, start from the snapshot ({SNAPSHOT_STARTS} times: the median)")
    d.terminate()
    snaps = []
    for _ in range(SNAPSHOT_STARTS):
        snaps.append(start(d))
        with d.client() as c:
            st2 = c.status()
        d.terminate()
    from_snap = median(snaps)
    say(f"{n}: flat baselines (rank-bm25, bm25s) in-process")
    flat = flat_baselines(base, qs[20:], n_q=min(len(qs) - 20, 300 if n <= 10_000 else 30))
    res = {
        "layout": layout,
        "memories": n,
        "build_s": build_s,
        **held,
        "clusters": st["counts"]["clusters"],
        "startup_yaml_s": from_yaml,
        "startup_yaml_index_load_s": st["load_seconds"],
        "startup_snapshot_s": from_snap,
        "startup_snapshot_runs_s": snaps,
        "startup_snapshot_load_s": st2["load_seconds"],
        "snapshot_used": st2["load_source"] == "warmstart",
        "rss_mb": rss,
        "rss_after_ingest_mb": rss_after,
        "ingest_memories": len(fresh),
        "ingest_per_s": len(fresh) / ingest_s,
        "routed_per_s": len(fresh) / routed_s,
        "routed_n": st_routed["counters"]["routed"],
        "q1_p50_ms": median([pct(one, 0.5) for one in ones]),
        "q1_p99_ms": median([pct(one, 0.99) for one in ones]),
        "q16_p50_ms": median([pct(x, 0.5) for x in sixteens]),
        "q16_p99_ms": median([pct(x, 0.99) for x in sixteens]),
        "hot_p50_ms": pct(hot, 0.5),
        **{f"{k}_{m}": v for k, d2 in flat.items() for m, v in d2.items()},
    }
    res["x_rank_bm25_p99"] = res["rank_bm25_p99_ms"] / res["q1_p99_ms"]
    res["x_rank_bm25_p50"] = res["rank_bm25_p50_ms"] / res["q1_p50_ms"]
    res["x_bm25s_p50"] = res["bm25s_p50_ms"] / res["q1_p50_ms"]
    return res


ROWS = [
    ("layout", "layout", "{}"),
    ("memories", "memories", "{:.0f}"),
    ("clusters", "clusters", "{:.0f}"),
    ("store built in process, s", "build_s", "{:.0f}"),
    ("start-up from YAML, s (until ping)", "startup_yaml_s", "{:.2f}"),
    ("  of which load (parse + index), s", "startup_yaml_index_load_s", "{:.2f}"),
    ("start-up from snapshot, s (median of 3)", "startup_snapshot_s", "{:.2f}"),
    ("  of which load, s", "startup_snapshot_load_s", "{:.2f}"),
    ("RSS, MB (after queries, with query processes)", "rss_mb", "{:.0f}"),
    ("RSS, MB (after ingest)", "rss_after_ingest_mb", "{:.0f}"),
    ("ingest, memories/s (inbox -> commit)", "ingest_per_s", "{:.0f}"),
    ("  until routed into clusters, memories/s", "routed_per_s", "{:.0f}"),
    ("  memories routed into clusters", "routed_n", "{:.0f}"),
    ("query 1 client p50 ms (socket)", "q1_p50_ms", "{:.2f}"),
    ("query 1 client p99 ms (socket)", "q1_p99_ms", "{:.2f}"),
    ("query 16 clients p50 ms", "q16_p50_ms", "{:.2f}"),
    ("query 16 clients p99 ms", "q16_p99_ms", "{:.2f}"),
    ("hot (repeated) query p50 ms", "hot_p50_ms", "{:.2f}"),
    ("rank-bm25 get_top_n p50 ms", "rank_bm25_p50_ms", "{:.2f}"),
    ("rank-bm25 get_top_n p99 ms", "rank_bm25_p99_ms", "{:.2f}"),
    ("bm25s retrieve p50 ms", "bm25s_p50_ms", "{:.2f}"),
    ("bm25s retrieve p99 ms", "bm25s_p99_ms", "{:.2f}"),
    ("rank-bm25 p50 / clagd p50 (x)", "x_rank_bm25_p50", "{:.1f}"),
    ("rank-bm25 p99 / clagd p99 (x)", "x_rank_bm25_p99", "{:.1f}"),
    ("bm25s p50 / clagd p50 (x)", "x_bm25s_p50", "{:.2f}"),
]

HOLD_ROWS = [
    ("session wall time, s", "session_s", "{:.2f}"),
    ("  its status", "session_status", "{}"),
    ("  longest writer hold of its operations, ms", "session_hold_ms", "{:.0f}"),
    ("add p50 ms while the session runs", "add_session_p50_ms", "{:.1f}"),
    ("add p99 ms while the session runs", "add_session_p99_ms", "{:.1f}"),
    ("add max ms while the session runs", "add_session_max_ms", "{:.1f}"),
    ("  adds", "add_session_n", "{:.0f}"),
    ("add p50 ms while a route pass runs", "add_route_p50_ms", "{:.1f}"),
    ("add p99 ms while a route pass runs", "add_route_p99_ms", "{:.1f}"),
    ("add max ms while a route pass runs", "add_route_max_ms", "{:.1f}"),
    ("  adds", "add_route_n", "{:.0f}"),
    ("add p50 ms while the archive job runs", "add_archive_p50_ms", "{:.1f}"),
    ("add p99 ms while the archive job runs", "add_archive_p99_ms", "{:.1f}"),
    ("add max ms while the archive job runs", "add_archive_max_ms", "{:.1f}"),
    ("  adds; clusters archived", "add_archive_n", "{:.0f}"),
    ("  clusters archived", "archived", "{:.0f}"),
    ("longest hold, ms: route pass", "route_hold_ms", "{:.0f}"),
    ("longest hold, ms: archive", "archive_hold_ms", "{:.0f}"),
    ("longest hold, ms: one ingest batch", "ingest_hold_ms", "{:.0f}"),
    ("clusters over max_cluster_size (60)", "over_max", "{:.0f}"),
    ("largest cluster", "largest_cluster", "{:.0f}"),
    ("RSS, MB (after organizing)", "rss_after_organizing_mb", "{:.0f}"),
]

ORG_ROWS = [
    ("while organizing: query processes", "org_query_processes", "{:.0f}"),
    ("while organizing: store, memories", "org_memories", "{:.0f}"),
    ("  burst dropped into the inbox, memories", "org_burst", "{:.0f}"),
    ("  query p50 ms idle (socket, 1 client)", "org_idle_p50_ms", "{:.2f}"),
    ("  query p99 ms idle", "org_idle_p99_ms", "{:.2f}"),
    ("  query p50 ms while organizing", "org_busy_p50_ms", "{:.2f}"),
    ("  query p99 ms while organizing", "org_busy_p99_ms", "{:.2f}"),
    ("  queries asked while organizing", "org_busy_queries", "{:.0f}"),
    ("  seconds (until routed and a session after)", "org_busy_s", "{:.1f}"),
    ("  sessions run meanwhile", "org_sessions", "{:.0f}"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--ingest", type=int, default=5000, help="memories to ingest per size")
    ap.add_argument(
        "--repeats", type=int, default=1, help="query passes per size (medians are reported)"
    )
    ap.add_argument(
        "--organize-size",
        type=int,
        default=10000,
        help="store size for the query latency while organizing (0: skip it)",
    )
    ap.add_argument("--organize-burst", type=int, default=10000, help="memories in that burst")
    ap.add_argument(
        "--query-processes",
        type=int,
        default=1,
        help="server.query_processes for the sizes' daemons (the shipped 1)",
    )
    ap.add_argument(
        "--organize-query-processes",
        default="0,1",
        help="server.query_processes values to measure while organizing, side by side "
        "(0: the daemon answers queries itself, the baseline)",
    )
    ap.add_argument(
        "--layouts",
        default="realistic,runs50",
        help="store layouts per size: realistic (issue 26), runs50 (the old one)",
    )
    ap.add_argument("--no-holds", action="store_true", help="skip the session/route/archive part")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    results = []
    orgs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="clagd-scale-", dir="/tmp") as tmp:
        for n in [int(x) for x in a.sizes.split(",") if x]:
            for layout in [x for x in a.layouts.split(",") if x]:  # interleaved: same load
                results.append(
                    bench_size(
                        n,
                        a.queries,
                        a.ingest,
                        Path(tmp),
                        a.repeats,
                        a.query_processes,
                        layout,
                        not a.no_holds,
                    )
                )
                print(json.dumps(results[-1]), file=sys.stderr, flush=True)
        if a.organize_size:
            for qp in [int(x) for x in a.organize_query_processes.split(",") if x]:
                orgs.append(
                    bench_organizing(a.organize_size, a.organize_burst, a.queries, Path(tmp), qp)
                )
    if a.json:
        print(json.dumps({"sizes": results, "organizing": orgs}, indent=2))
        return
    width = max(len(r[0]) for r in ROWS + HOLD_ROWS + ORG_ROWS)
    if results:
        for label, key, fmt in ROWS + HOLD_ROWS:
            if all(key in r for r in results):
                cells = "  ".join(f"{fmt.format(r[key]):>10}" for r in results)
                print(f"{label:<{width}}  {cells}")
    if orgs:
        for label, key, fmt in ORG_ROWS:
            print(f"{label:<{width}}  " + "  ".join(f"{fmt.format(o[key]):>10}" for o in orgs))


if __name__ == "__main__":
    main()
