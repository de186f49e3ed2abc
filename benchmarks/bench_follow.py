"""Followers under a steady write load: how far behind the primary they serve, and what
their queries cost against the primary's, in one run.

A primary daemon pushes each commit (`replication.remote`) to a bare repository served by
`git daemon` on loopback; `--followers` daemons (`clagd follow git://...`) fetch from it
every `--follow-seconds`. The primary holds `--size` memories to start with; then, for
`--seconds`, a writer adds one memory at a time at `--rate` per second while one client per
daemon (the primary and each follower) queries it over its socket.

Reported:
  * lag: from the primary's acknowledgement of an add (its commit exists) to the moment a
    follower serves that commit (its status names it or a later one), per add and follower;
  * query p50/p99 on each follower and on the primary, in the same run (the baseline);
  * each follower's CPU seconds and RSS (its query process included) over the load.

    python benchmarks/bench_follow.py [--followers 3] [--seconds 60] [--rate 5] \\
        [--follow-seconds 2] [--size 2000] [--json]

Targets on 2 cores: lag p99 <= follow_seconds + 1 s; follower query p99 within 1.5x of the
primary's.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from corpus import memories, queries  # noqa: E402
from helpers import DaemonProcess, make_store, wait_for  # noqa: E402

from clagd.client import Client  # noqa: E402


def say(msg: str) -> None:
    print(f"[bench_follow] {msg}", file=sys.stderr, flush=True)


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def git_daemon(base: Path, port: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [
            "git",
            "daemon",
            "--reuseaddr",
            "--export-all",
            "--enable=receive-pack",
            f"--base-path={base}",
            "--listen=127.0.0.1",
            f"--port={port}",
            str(base),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def listening() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            return False

    wait_for(listening, 15, "git daemon")
    return proc


def start_follower(url: str, root: Path, sock: Path) -> subprocess.Popen:
    log = open(root.parent / f"{root.name}.log", "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "clagd", "--socket", str(sock), "follow", url, str(root)],
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    log.close()

    def up() -> bool:
        try:
            with Client(sock, timeout=5) as c:
                c.ping()
            return True
        except Exception:  # noqa: BLE001 - not yet
            return False

    wait_for(up, 120, "a follower")
    return proc


def tree(pid: int) -> list[int]:
    """The process and its descendants (a daemon's query processes are its children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
    return out


def cpu_seconds(pid: int) -> float:
    total = 0.0
    for p in tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / 100.0  # utime + stime, in ticks
    return total


def rss_mb(pid: int) -> float:
    total = 0
    for p in tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


class HeadWatch(threading.Thread):
    """Polls one follower's served commit; records when it changes."""

    def __init__(self, sock: Path, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.sock, self.stop = sock, stop
        self.changes: list[tuple[float, str]] = []

    def run(self) -> None:
        last = None
        with Client(self.sock, timeout=30) as c:
            while not self.stop.is_set():
                head = c.status()["head"]
                if head != last:
                    self.changes.append((time.monotonic(), head))
                    last = head
                time.sleep(0.02)


class Querier(threading.Thread):
    def __init__(self, sock: Path, qs: list[str], stop: threading.Event, gap: float) -> None:
        super().__init__(daemon=True)
        self.sock, self.qs, self.stop, self.gap = sock, qs, stop, gap
        self.ms: list[float] = []

    def run(self) -> None:
        with Client(self.sock, timeout=60) as c:
            i = 0
            while not self.stop.is_set():
                t = time.perf_counter()
                c.query(self.qs[i % len(self.qs)])
                self.ms.append((time.perf_counter() - t) * 1000)
                i += 1
                time.sleep(self.gap)


def lags(primary_root: Path, acks: list[tuple[float, str]], watch: HeadWatch) -> list[float]:
    """For each acknowledged add, seconds until the follower served its commit or a later
    one (the primary's history is linear: a later head contains every earlier commit)."""
    cache: dict[tuple[str, str], bool] = {}

    def contains(head: str, commit: str) -> bool:
        key = (head, commit)
        if key not in cache:
            r = subprocess.run(
                ["git", "-C", str(primary_root), "merge-base", "--is-ancestor", commit, head]
            )
            cache[key] = r.returncode == 0
        return cache[key]

    out, j = [], 0
    changes = watch.changes
    for t_ack, commit in acks:
        while j < len(changes) and not contains(changes[j][1], commit):
            j += 1
        if j == len(changes):
            break  # not served before the end of the run
        out.append(max(0.0, changes[j][0] - t_ack))
    return out


def run(args: argparse.Namespace, work: Path) -> dict:
    srv = work / "srv"
    srv.mkdir()
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(srv / "p.git")], check=True)
    port = free_port()
    gd = git_daemon(srv, port)
    url = f"git://127.0.0.1:{port}/p.git"
    cfg = {
        "replication": {"remote": url, "follow_seconds": args.follow_seconds, "retry_seconds": 1}
    }
    store = make_store(work / "primary", cfg)
    primary = DaemonProcess(store, work / "p.sock").start()
    procs: list[subprocess.Popen] = []
    try:
        with primary.client(timeout=600) as c:
            texts = memories(args.size + int(args.seconds * args.rate) + 10)
            say(f"primary: adding {args.size} memories")
            for i in range(0, args.size, 500):
                c.add_many([{"content": t} for t in texts[i : min(args.size, i + 500)]])
        say(f"starting {args.followers} followers of {url}")
        socks = [work / f"f{i}.sock" for i in range(args.followers)]
        procs = [start_follower(url, work / f"f{i}", s) for i, s in enumerate(socks)]
        for s in socks:
            with Client(s, timeout=30) as c:
                wait_for(lambda c=c: c.status()["counts"]["memories"] >= args.size, 120, "serve")
        return measure(args, store, primary, procs, socks, texts[args.size :])
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(60)
        primary.terminate()
        gd.terminate()


def measure(
    args: argparse.Namespace,
    store: Path,
    primary: DaemonProcess,
    procs: list[subprocess.Popen],
    socks: list[Path],
    texts: list[str],
) -> dict:
    stop = threading.Event()
    watches = [HeadWatch(s, stop) for s in socks]
    qs = queries(500)
    queriers = [Querier(s, qs, stop, 0.02) for s in [primary.socket, *socks]]
    cpu0 = [cpu_seconds(p.pid) for p in procs]
    for t in [*watches, *queriers]:
        t.start()
    acks: list[tuple[float, str]] = []
    say(f"load: {args.rate}/s adds for {args.seconds}s")
    t_end = time.monotonic() + args.seconds
    with primary.client(timeout=120) as c:
        i = 0
        while time.monotonic() < t_end:
            res = c.add(texts[i])
            if res.get("commit"):
                acks.append((time.monotonic(), res["commit"]))
            i += 1
            time.sleep(max(0.0, 1.0 / args.rate - 0.001))
    time.sleep(args.follow_seconds + 3)  # let the last adds reach the followers
    stop.set()
    for t in [*watches, *queriers]:
        t.join(30)
    cpu = [cpu_seconds(p.pid) - c0 for p, c0 in zip(procs, cpu0)]
    per = [lags(store, acks, w) for w in watches]
    all_lags = [x for xs in per for x in xs]
    served = sum(len(xs) for xs in per)
    return {
        "followers": args.followers,
        "follow_seconds": args.follow_seconds,
        "adds": len(acks),
        "served": f"{served} of {len(acks) * len(per)}",
        "lag_s": {"p50": pct(all_lags, 50), "p99": pct(all_lags, 99), "max": max(all_lags)},
        "primary_query_ms": {
            "p50": pct(queriers[0].ms, 50),
            "p99": pct(queriers[0].ms, 99),
            "n": len(queriers[0].ms),
        },
        "follower_query_ms": {
            "p50": pct([x for q in queriers[1:] for x in q.ms], 50),
            "p99": pct([x for q in queriers[1:] for x in q.ms], 99),
            "n": sum(len(q.ms) for q in queriers[1:]),
        },
        "follower_cpu_s": [round(x, 2) for x in cpu],
        "follower_rss_mb": [round(rss_mb(p.pid), 1) for p in procs],
        "load_seconds": args.seconds,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--followers", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--rate", type=float, default=5, help="adds per second on the primary")
    ap.add_argument("--follow-seconds", type=float, default=2.0)
    ap.add_argument("--size", type=int, default=2000, help="memories before the load")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="clagd-bf-", dir="/tmp") as d:
        out = run(args, Path(d))
    if args.json:
        print(json.dumps(out, indent=2))
        return
    lag, pq, fq = out["lag_s"], out["primary_query_ms"], out["follower_query_ms"]
    print(
        f"followers {out['followers']}, follow_seconds {out['follow_seconds']}, "
        f"{out['adds']} adds in {out['load_seconds']:.0f}s, served {out['served']}"
    )
    print(
        f"lag (s)            p50 {lag['p50']:.2f}  p99 {lag['p99']:.2f}  max {lag['max']:.2f}"
        f"   target p99 <= {out['follow_seconds'] + 1:.1f}"
    )
    print(f"query primary (ms) p50 {pq['p50']:.2f}  p99 {pq['p99']:.2f}  (n {pq['n']})")
    print(
        f"query follower(ms) p50 {fq['p50']:.2f}  p99 {fq['p99']:.2f}  (n {fq['n']})"
        f"   target p99 <= {1.5 * pq['p99']:.2f}"
    )
    print(f"follower CPU s {out['follower_cpu_s']}, RSS MB {out['follower_rss_mb']}")


if __name__ == "__main__":
    main()
