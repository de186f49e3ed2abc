"""Crash harness: SIGKILL a real `clagd run` at random moments, restart it, check the store.

While the daemon runs, a writer thread keeps dropping memory files into the inbox (most
written under a temporary name and renamed in, some written in place in two chunks), and a
client thread keeps asking for `add`, `recluster` (backend none), `archive` and `revert` (of
cluster, route, archive and thaw commits only, never of an ingest, so no memory may leave
HEAD).
The daemon is killed with SIGKILL after a random delay, sometimes while it is still starting
up, and restarted each time. At the end a clean run drains the inbox and stops, and the
harness checks:

* every file completely written into the inbox is in HEAD exactly once, or still in the inbox;
* every memory that was in HEAD at any observed point (and every acknowledged `add`) is still
  in HEAD, exactly once;
* `git fsck --full` is clean, and no restart was blocked by a stale lock.

    python benchmarks/crash_harness.py --kills 200 [--seed 1] [--keep] [--realistic N]

`--realistic N` starts from a store of N memories shaped as the daemon shapes one
(`realistic.py`: ~12 a cluster), each of which must also stay in HEAD exactly once.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # realistic.py, corpus.py

from helpers import DaemonProcess, make_store, wait_for  # noqa: E402
from realistic import seed_store  # noqa: E402

from clagd.client import Client  # noqa: E402

DATA_DIRS = ("clusters", "archive", "unsorted")
WORDS = (
    "garden kettle violin harbour lantern meadow pepper orbit canyon falcon ginger marble "
    "nickel oyster pigeon quartz saddle thistle tunnel walnut yellow zephyr anchor basil "
    "cobalt dahlia ember fennel glacier hazel iris juniper"
).split()
OVERRIDES = {
    # clusters go cold about a second after they are made, so `archive` moves something
    "archive": {"cold_after_days": 1e-5, "min_size": 0, "thaw_on_hit": True},
    "session": {"sample_size": 40},
    # most batches go whole into an unsorted file and are routed by a route pass soon after
    # (with a low bar for a match, as the random texts here rarely match strongly), so kills
    # also land in route passes, and reverts pick route commits too
    "ingest": {
        "route_inline_max": 1,
        "route_delay_seconds": 0.05,
        "route_min_score": 1.0,
        "route_margin": 0.1,
    },
}


def _git(root: Path, *args: str, check: bool = True) -> str:
    return subprocess.run(
        ["git", *args], cwd=root, check=check, capture_output=True, text=True
    ).stdout


def head_memories(root: Path) -> Counter[str]:
    """Contents of every memory in one HEAD commit (read at one sha, through git)."""
    sha = _git(root, "rev-parse", "HEAD").strip()
    names = [
        f
        for f in _git(root, "ls-tree", "-r", "--name-only", sha).split("\n")
        if f.endswith(".yaml") and f.split("/")[0] in DATA_DIRS
    ]
    out: Counter[str] = Counter()
    if not names:
        return out
    req = "".join(f"{sha}:{n}\n" for n in names)
    raw = subprocess.run(
        ["git", "cat-file", "--batch"], cwd=root, input=req.encode(), capture_output=True
    ).stdout
    pos = 0
    while pos < len(raw):
        header_end = raw.index(b"\n", pos)
        size = int(raw[pos:header_end].split()[2])
        body = raw[header_end + 1 : header_end + 1 + size]
        pos = header_end + 1 + size + 1
        data = yaml.safe_load(body.decode("utf-8")) or {}
        out.update(m["content"] for m in data.get("memories") or [])
    return out


@dataclass
class Counts:
    kills: int = 0
    kills_during_startup: int = 0
    restarts: int = 0
    recoveries: int = 0
    recovery_notes: Counter[str] = field(default_factory=Counter)
    files: int = 0
    files_in_place: int = 0
    memories_in_files: int = 0
    acked_adds: int = 0
    ops: Counter[str] = field(default_factory=Counter)
    op_errors: Counter[str] = field(default_factory=Counter)
    observed_heads: int = 0


class FileDropper(threading.Thread):
    """Drops memory files into the inbox until stopped; remembers every complete one."""

    def __init__(self, inbox: Path, rng: random.Random, counts: Counts) -> None:
        super().__init__(name="dropper", daemon=True)
        self.inbox = inbox
        self.rng = rng
        self.counts = counts
        self.complete: dict[str, list[str]] = {}  # file name -> memory contents
        self.stop_event = threading.Event()
        self.n = 0

    def text(self) -> str:
        self.n += 1
        return f"crash memory {self.n} " + " ".join(self.rng.choice(WORDS) for _ in range(6))

    def run(self) -> None:
        tmpdir = self.inbox / ".tmp"
        while not self.stop_event.is_set():
            k = self.rng.choice((1, 1, 1, 2, 3))
            contents = [self.text() for _ in range(k)]
            kind = self.rng.choice(("txt", "yaml", "json", "md"))
            name = f"drop-{self.n:06d}.{kind}"
            if kind == "txt" or (kind == "md" and k == 1):
                contents = contents[:1]
                body = contents[0] + "\n"
            elif kind == "md":
                contents = contents[:1]
                body = f"---\nmetadata:\n  source: harness\n---\n{contents[0]}\n"
            elif kind == "json":
                body = json.dumps([{"content": c} for c in contents])
            else:
                body = yaml.safe_dump([{"content": c, "metadata": {"i": self.n}} for c in contents])
            if self.rng.random() < 0.2:  # in place, in two chunks, then closed
                half = len(body) // 2
                with open(self.inbox / name, "w", encoding="utf-8") as fh:
                    fh.write(body[:half])
                    fh.flush()
                    time.sleep(0.01)
                    fh.write(body[half:])
                self.counts.files_in_place += 1
            else:
                tmp = tmpdir / name
                tmp.write_text(body, encoding="utf-8")
                os.rename(tmp, self.inbox / name)
            self.complete[name] = contents
            self.counts.files += 1
            self.counts.memories_in_files += len(contents)
            self.stop_event.wait(self.rng.uniform(0.01, 0.08))


class Requester(threading.Thread):
    """Sends add / recluster / archive / revert requests to the current daemon."""

    def __init__(self, sock: Path, rng: random.Random, counts: Counts) -> None:
        super().__init__(name="requester", daemon=True)
        self.sock = sock
        self.rng = rng
        self.counts = counts
        self.acked: set[str] = set()
        self.stop_event = threading.Event()
        self.n = 0

    def run(self) -> None:
        while not self.stop_event.is_set():
            op = self.rng.choice(("add", "add", "recluster", "recluster", "archive", "revert"))
            try:
                with Client(self.sock, timeout=20) as c:
                    self.counts.ops[op] += 1
                    if op == "add":
                        self.n += 1
                        text = f"socket memory {self.n} " + " ".join(
                            self.rng.choice(WORDS) for _ in range(5)
                        )
                        c.call("add", content=text)
                        self.acked.add(text)
                        self.counts.acked_adds += 1
                    elif op == "recluster":
                        c.call("recluster", backend="none")
                    elif op == "archive":
                        c.call("archive")
                    else:
                        entries = c.call("log", n=50)["entries"]
                        refs = [
                            e["commit"]
                            for e in entries
                            if e["kind"] in ("cluster", "archive", "thaw", "route")
                        ]
                        if refs:
                            c.call("revert", ref=self.rng.choice(refs))
            except Exception as exc:  # noqa: BLE001 - the daemon is killed under us
                self.counts.op_errors[type(exc).__name__] += 1
            self.stop_event.wait(self.rng.uniform(0.0, 0.15))


def inbox_leftovers(inbox: Path) -> set[str]:
    return {p.name for p in inbox.iterdir() if p.is_file()}


def run(
    kills: int,
    seed: int = 1,
    workdir: Path | None = None,
    verbose: bool = True,
    realistic: int = 0,
) -> dict:
    rng = random.Random(seed)
    base = Path(workdir or tempfile.mkdtemp(prefix="clagd-crash-"))
    store = make_store(base / "memory", OVERRIDES)
    seeded = seed_store(store, realistic, seed) if realistic else []
    sock = Path(tempfile.mkdtemp(prefix="clagd-c-", dir="/tmp")) / "s.sock"
    counts = Counts()
    observed: Counter[str] = Counter()
    problems: list[str] = []

    def observe() -> None:
        counts.observed_heads += 1
        for content in head_memories(store):
            observed[content] += 1

    def status_of(d: DaemonProcess) -> dict:
        with d.client(timeout=20) as c:
            return c.call("status")

    dropper = FileDropper(store / "inbox", rng, counts)
    requester = Requester(sock, random.Random(seed + 1), counts)
    dropper.start()
    requester.start()
    t0 = time.monotonic()
    d = DaemonProcess(store, sock)
    try:
        for i in range(kills):
            d.start(wait=False)
            counts.restarts += 1
            if rng.random() < 0.15:  # kill during start-up and recovery
                time.sleep(rng.uniform(0.0, 0.8))
                if d.proc is not None and d.proc.poll() is None and not d.ready():
                    counts.kills_during_startup += 1
            else:
                wait_for(d.ready, 60, "the daemon to answer ping after a restart")
                st = status_of(d)
                if st["recovery"]:
                    counts.recoveries += 1
                    counts.recovery_notes.update(st["recovery"])
                observe()
                time.sleep(rng.uniform(0.05, 1.2))
            d.kill()
            counts.kills += 1
            if verbose and (i + 1) % 10 == 0:
                print(
                    f"  {i + 1}/{kills} kills, {counts.files} files, {time.monotonic() - t0:.0f}s",
                    flush=True,
                )
            if rng.random() < 0.3:
                observe()  # HEAD as the killed daemon left it
    finally:
        dropper.stop_event.set()
        requester.stop_event.set()
        dropper.join(10)
        requester.join(30)
        if d.proc is not None and d.proc.poll() is None:
            d.kill()

    # a clean final run: drain the inbox, stop with SIGTERM
    d.start()
    counts.restarts += 1
    st = status_of(d)
    if st["recovery"]:
        counts.recoveries += 1
        counts.recovery_notes.update(st["recovery"])
    inbox = store / "inbox"
    try:
        wait_for(lambda: not inbox_leftovers(inbox), 120, "the inbox to drain")
    except AssertionError:
        problems.append(f"inbox not drained: {sorted(inbox_leftovers(inbox))[:10]}")
    rc = d.terminate()
    if rc != 0:
        problems.append(f"clean stop exited with {rc}")
    elapsed = time.monotonic() - t0

    final = head_memories(store)
    left = inbox_leftovers(inbox)
    rejected = sorted(p.name for p in (inbox / "rejected").iterdir() if p.is_file())
    if rejected:
        problems.append(f"{len(rejected)} files rejected: {rejected[:6]}")
    missing_files = 0
    for name, contents in dropper.complete.items():
        if name in left:
            continue
        for content in contents:
            if final[content] != 1:
                missing_files += 1
                problems.append(f"{name}: {content!r} is in HEAD {final[content]} times")
    for content in observed:
        if final[content] != 1:
            problems.append(f"observed memory {content!r} is in HEAD {final[content]} times")
    for content in requester.acked:
        if final[content] != 1:
            problems.append(f"acknowledged add {content!r} is in HEAD {final[content]} times")
    lost = [c for c in seeded if final[c] != 1]
    if lost:
        problems.append(f"{len(lost)} of the realistic store's memories not in HEAD once")
    dupes = [c for c, n in final.items() if n > 1]
    if dupes:
        problems.append(f"{len(dupes)} memories twice in HEAD, e.g. {dupes[0]!r}")
    fsck = subprocess.run(
        ["git", "fsck", "--full", "--no-progress"], cwd=store, capture_output=True, text=True
    )
    if fsck.returncode != 0 or "error" in fsck.stderr.lower():
        problems.append(f"git fsck: {fsck.returncode} {fsck.stderr.strip()[:300]}")
    kinds = Counter(
        line.strip()
        for line in _git(
            store, "log", "--format=%(trailers:key=Clagd-Kind,valueonly,separator=)"
        ).splitlines()
    )
    report = {
        "kills": counts.kills,
        "kills_during_startup": counts.kills_during_startup,
        "restarts": counts.restarts,
        "recoveries": counts.recoveries,
        "recovery_notes": dict(counts.recovery_notes),
        "files": counts.files,
        "files_in_place": counts.files_in_place,
        "files_left_in_inbox": len(left),
        "memories_in_files": counts.memories_in_files,
        "acked_adds": counts.acked_adds,
        "realistic_memories": len(seeded),
        "memories_in_head": sum(final.values()),
        "observed_heads": counts.observed_heads,
        "requests": dict(counts.ops),
        "request_errors": dict(counts.op_errors),
        "commits": dict(kinds),
        "seconds": round(elapsed, 1),
        "problems": problems,
    }
    if workdir is None and not problems:
        shutil.rmtree(base, ignore_errors=True)
    else:
        report["store"] = str(store)
    shutil.rmtree(sock.parent, ignore_errors=True)
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workdir", type=Path, default=None, help="keep the store here")
    ap.add_argument("--realistic", type=int, default=0, help="start from N memories")
    args = ap.parse_args()
    report = run(args.kills, args.seed, args.workdir, realistic=args.realistic)
    print(json.dumps(report, indent=2))
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
