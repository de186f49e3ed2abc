"""What happens to clients' connections when a query process restarts (issue 23).

While no query process serves (one died and waits out its restart delay), the daemon
accepts connections and answers them itself. Once a process serves again, the daemon stops
accepting; the connections it holds are passed to the process (SCM_RIGHTS, clagd's
hand-off), or, in the tree of branch `pub-release`, released after their next reply (the
daemon shuts down its reading side, and `Client` sends its next request again on a fresh
connection, which a process accepts). The figures and the decision: docs/retrieval.md,
"Scale". This measures both
under repeated SIGKILLs of the query process, against a real daemon (`python -m clagd run`
from each tree given, over its real Unix socket): failed requests by op, request latency
(all, and inside the restart windows), and how many requests the daemon answered itself
after the process served again (the queries a slow, organizing daemon keeps).

    python benchmarks/bench_handoff.py --tree handoff=/path/a --tree close=/path/b
        [--size 10000] [--clients 4] [--kills 5] [--rounds 2] [--add-every 10] [--json]

Each `--tree NAME=PATH` runs its daemon with PYTHONPATH=PATH (its code); rounds alternate
the trees. Clients: each a thread with one `Client` (one connection, reconnected by the
client only), asking distinct queries back to back and an `add` every `--add-every`
requests (an `add` is not retried by the client when the daemon closes a connection it was
sent on: the case a close races).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from bench_scale import build_store, pct, wait_serving  # noqa: E402
from corpus import memories, queries  # noqa: E402
from helpers import DaemonProcess, wait_for  # noqa: E402

from clagd.client import Client, ClientError  # noqa: E402


def say(msg: str) -> None:
    print(f"[bench_handoff] {msg}", file=sys.stderr, flush=True)


@dataclass
class Sample:
    t: float  # perf_counter at the request's start
    op: str
    ms: float
    error: str = ""


@dataclass
class Run:
    samples: list[Sample] = field(default_factory=list)
    windows: list[tuple[float, float]] = field(default_factory=list)  # kill -> serving again
    daemon_answered_after: int = 0  # queries the daemon answered once a process served


def client_loop(sock: str, qs: list[str], add_every: int, stop: threading.Event, out: Run):
    i = 0
    with Client(sock, timeout=60) as c:
        while not stop.is_set():
            q = qs[i % len(qs)] + f" {i}"
            op = "add" if add_every and i % add_every == add_every - 1 else "query"
            t = time.perf_counter()
            err = ""
            try:
                if op == "add":
                    c.add(f"handoff bench note {threading.get_ident()} {i}: {q}")
                else:
                    c.query(q)
            except ClientError as exc:
                err = exc.code or type(exc).__name__
            out.samples.append(Sample(t, op, (time.perf_counter() - t) * 1000, err))
            i += 1


def query_pid(c: Client) -> int | None:
    procs = c.status()["query_processes"]
    serving = [p for p in procs["processes"] if p["state"] == "serving"]
    return serving[0]["pid"] if serving else None


def one_run(tree: str, store_texts: list[str], args: argparse.Namespace, tmp: Path) -> Run:
    name = f"s{time.monotonic_ns()}"
    store = build_store(tmp / name, store_texts, None, 1)
    sock = tmp / f"{name}.sock"
    env = {"PYTHONPATH": tree}
    d = DaemonProcess(store, sock, env)
    d.start(wait=False)
    wait_for(d.ready, 120, "the daemon to answer ping")
    wait_serving(d, 1)
    qs = list(dict.fromkeys(queries(5000, seed=5)))
    run = Run()
    stop = threading.Event()
    threads = [
        threading.Thread(
            target=client_loop,
            args=(str(sock), qs[k :: args.clients], args.add_every, stop, run),
            daemon=True,
        )
        for k in range(args.clients)
    ]
    for t in threads:
        t.start()
    with Client(str(sock), timeout=60) as watch:
        time.sleep(args.settle)
        for _ in range(args.kills):
            pid = query_pid(watch)
            assert pid is not None, "no query process serves"
            t_kill = time.perf_counter()
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda pid=pid: query_pid(watch) not in (None, pid), 120, "a restart")
            run.windows.append((t_kill, time.perf_counter()))
            before = daemon_queries(watch.status())
            time.sleep(args.settle)
            run.daemon_answered_after += daemon_queries(watch.status()) - before
    stop.set()
    for t in threads:
        t.join(60)
    d.terminate()
    return run


def daemon_queries(st: dict) -> int:
    """Queries the daemon answered itself: every query it counted minus those its query
    processes answered (as they reported them)."""
    procs = sum(p["queries"] for p in st["query_processes"]["processes"])
    return int(st["counters"]["queries"]) - procs


def _stats(samples: list[Sample]) -> dict:
    ok = [s.ms for s in samples if not s.error]
    return {
        "n": len(samples),
        "failed": sum(1 for s in samples if s.error),
        "p50_ms": round(pct(ok, 0.5), 2) if ok else None,
        "p99_ms": round(pct(ok, 0.99), 2) if ok else None,
        "max_ms": round(max(ok), 2) if ok else None,
    }


def summary(name: str, runs: list[Run]) -> dict:
    """By op: every request; those asked while the process was down (from the kill until
    it served again); and those asked in the second after it served again (when the
    connections the daemon held are passed on or closed)."""
    out: dict = {"tree": name, "restart_s": [round(b - a, 2) for r in runs for a, b in r.windows]}
    for op in ("query", "add"):
        mine = [(r, s) for r in runs for s in r.samples if s.op == op]
        down = [s for r, s in mine if any(a <= s.t < b for a, b in r.windows)]
        back = [s for r, s in mine if any(b <= s.t < b + 1.0 for _, b in r.windows)]
        out[op] = {
            "all": _stats([s for _, s in mine]),
            "while_down": _stats(down),
            "first_second_back": _stats(back),
        }
    errors: dict[str, int] = {}
    for r in runs:
        for s in r.samples:
            if s.error:
                # in flight when a process was killed (it went through the process), or not
                when = (
                    "at_kill"
                    if any(s.t <= a <= s.t + s.ms / 1000 for a, _ in r.windows)
                    else "other"
                )
                key = f"{s.op}:{s.error}:{when}"
                errors[key] = errors.get(key, 0) + 1
    out["errors"] = errors
    out["daemon_answered_after_serving"] = sum(r.daemon_answered_after for r in runs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", action="append", required=True, help="NAME=PATH (repeatable)")
    ap.add_argument("--size", type=int, default=10000)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--add-every", type=int, default=10)
    ap.add_argument("--settle", type=float, default=2.0, help="seconds between kills")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    trees = [t.split("=", 1) for t in args.tree]
    texts = memories(args.size, seed=7)
    runs: dict[str, list[Run]] = {n: [] for n, _ in trees}
    with tempfile.TemporaryDirectory(prefix="bench-handoff-") as tmp:
        for r in range(args.rounds):
            for name, path in trees:
                say(f"round {r + 1}: {name} ({path})")
                runs[name].append(one_run(path, texts, args, Path(tmp)))
    out = [summary(n, runs[n]) for n, _ in trees]
    if args.json:
        print(json.dumps(out, indent=2))
        return
    for s in out:
        print(json.dumps(s))


if __name__ == "__main__":
    main()
