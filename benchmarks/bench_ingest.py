"""Ingest and load benchmark.

1. Inbox to commit: N memories dropped into a running daemon's inbox as files (tmp + rename),
   timed until every one is committed; baseline in the same run: the same files written and
   committed with plain `git add` + `git commit` (the floor for any git-backed store).
2. Loading a store of M memories: Engine start-up from the YAML files and from the start-up
   snapshot; baseline: reading every YAML file with CSafeLoader and nothing else.

    python benchmarks/bench_ingest.py [--files 2000] [--per-file 5] [--store-size 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from corpus import memories  # noqa: E402
from helpers import InProcessDaemon, make_store, wait_for  # noqa: E402

from clagd.engine.core import Engine  # noqa: E402
from clagd.ingest.inbox import Item  # noqa: E402


def bench_inbox(files: int, per_file: int, tmp: Path) -> dict:
    texts = memories(files * per_file, seed=11)
    payloads = [
        json.dumps([{"content": t} for t in texts[i * per_file : (i + 1) * per_file]])
        for i in range(files)
    ]
    # baseline: write the files into a git repo and commit them once
    base = tmp / "baseline"
    base.mkdir()
    subprocess.run(["git", "init", "-q", str(base)], check=True)
    t0 = time.perf_counter()
    for i, p in enumerate(payloads):
        (base / f"f{i:06d}.json").write_text(p)
    subprocess.run(["git", "-C", str(base), "add", "-A"], check=True)
    subprocess.run(
        ["git", "-C", str(base), "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "x"],
        check=True,
    )
    baseline = time.perf_counter() - t0

    store = make_store(
        tmp / "store",
        {"inbox": {"settle_seconds": 1.0, "rescan_seconds": 1.0, "debounce_seconds": 0.2}},
    )
    d = InProcessDaemon(store, tmp / "s.sock")
    try:
        inbox = store / "inbox"
        t0 = time.perf_counter()
        for i, p in enumerate(payloads):
            (inbox / ".tmp" / f"f{i:06d}.json").write_text(p)
            os.rename(inbox / ".tmp" / f"f{i:06d}.json", inbox / f"f{i:06d}.json")
        wait_for(lambda: d.engine.counters["added"] >= len(texts), 600, "ingest")
        took = time.perf_counter() - t0
        commits = d.engine.counters["ingest_batches"]
    finally:
        d.stop()
    n = len(texts)
    return {
        "memories": n,
        "files": files,
        "seconds": round(took, 3),
        "memories_per_second": round(n / took, 1),
        "commits": commits,
        "baseline_git_seconds": round(baseline, 3),
        "baseline_memories_per_second": round(n / baseline, 1),
    }


def bench_load(size: int, tmp: Path) -> dict:
    store = make_store(tmp / "big")
    texts = memories(size, seed=5)
    eng = Engine(store)
    t0 = time.perf_counter()
    step = 5000
    for i in range(0, size, step):
        eng.ingest(
            [Item(t, "2026-01-01T00:00:00Z", {}) for t in texts[i : i + step]], source="bench"
        )
        print(f"  building the store: {min(size, i + step)}/{size}", file=sys.stderr, end="\r")
    print(file=sys.stderr)
    build = time.perf_counter() - t0
    # organize it into clusters so the load covers cluster files, as a real store has
    t0 = time.perf_counter()
    eng.recluster("bench") if eng.hooks.session_runner else None
    eng.close()
    # baseline: just parse every YAML file
    t0 = time.perf_counter()
    n = 0
    for d in ("clusters", "unsorted", "archive"):
        for f in (store / d).glob("*.yaml"):
            data = yaml.load(f.read_text(), Loader=yaml.CSafeLoader)
            n += len(data.get("memories", []))
    yaml_only = time.perf_counter() - t0
    (store / ".clagd" / "warmstart.pickle").unlink(missing_ok=True)
    t0 = time.perf_counter()
    eng = Engine(store)
    from_files = time.perf_counter() - t0
    eng.close()  # writes the snapshot
    t0 = time.perf_counter()
    eng = Engine(store)
    from_snapshot = time.perf_counter() - t0
    assert eng.load_source == "warmstart" and len(eng.index) == size
    eng.close()
    return {
        "memories": n,
        "build_seconds": round(build, 2),
        "load_from_files_seconds": round(from_files, 3),
        "load_from_snapshot_seconds": round(from_snapshot, 3),
        "baseline_yaml_parse_seconds": round(yaml_only, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--per-file", type=int, default=5)
    ap.add_argument("--store-size", type=int, default=100_000)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="clagd-bench-", dir="/tmp") as tmp:
        res = {
            "inbox": bench_inbox(a.files, a.per_file, Path(tmp)),
            "load": bench_load(a.store_size, Path(tmp)),
        }
    if a.json:
        print(json.dumps(res, indent=2))
        return
    i, ld = res["inbox"], res["load"]
    print(
        f"inbox -> commit: {i['memories']} memories in {i['files']} files: {i['seconds']} s, "
        f"{i['memories_per_second']} memories/s in {i['commits']} commits "
        f"(baseline plain git add+commit: {i['baseline_memories_per_second']} memories/s)"
    )
    print(
        f"load {ld['memories']} memories: {ld['load_from_files_seconds']} s from YAML files, "
        f"{ld['load_from_snapshot_seconds']} s from the snapshot "
        f"(baseline: parsing the YAML alone {ld['baseline_yaml_parse_seconds']} s)"
    )


if __name__ == "__main__":
    main()
