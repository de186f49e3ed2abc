"""Shared test helpers: real stores, real daemons (in-process or as a subprocess), polls."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from clagd.client import Client
from clagd.config import Config, load_config
from clagd.retrieval.index import Index
from clagd.retrieval.postings import Segment
from clagd.serve.daemon import Daemon
from clagd.store.create import init_store
from clagd.store.files import load_state

# The repository root (tests live one or two folders below it).
REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"
LOCOMO_DEV = (
    next(
        (
            p
            for p in (SHARED_DATA, Path("/work/shared/data"))
            if (p / "locomo" / "locomo-dev.json").exists()
        ),
        SHARED_DATA,
    )
    / "locomo"
    / "locomo-dev.json"
)
# the harnesses' short runs start from this many realistic memories (LoCoMo turns
# recombined, benchmarks/realistic.py), from none where the LoCoMo file is not here
REALISTIC = 300 if LOCOMO_DEV.exists() else 0

FAST = {
    "backend": {"kind": "none", "recheck_seconds": 0},
    "session": {
        "interval_minutes": 0,
        "memory_add_threshold": 100000,
        "dialogue_round_threshold": 100000,
    },
    "inbox": {"settle_seconds": 0.3, "rescan_seconds": 0.3, "debounce_seconds": 0.05},
    "archive": {"interval_hours": 0},
}


def wait_for(
    cond: Callable[[], Any],
    timeout: float = 20.0,
    what: str = "condition",
    max_delay: float = 0.2,
) -> Any:
    """Poll `cond` until it returns something truthy, or fail after `timeout` seconds.
    The delay between polls grows to `max_delay` (a benchmark that times the wait keeps
    it small: a 0.2-s poll is 10% of a 2-s measurement)."""
    deadline = time.monotonic() + timeout
    delay = min(0.01, max_delay)
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 1.5, max_delay)


def deep_update(base: dict, extra: dict) -> dict:
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            deep_update(base[k], v)
        else:
            base[k] = v
    return base


def make_store(root: Path, overrides: dict | None = None) -> Path:
    """A real store (git repo) with fast test settings written into its clagd.yaml."""
    root, _ = init_store(root)
    cfg = deep_update(yaml.safe_load(yaml.safe_dump(FAST)), overrides or {})
    (root / "clagd.yaml").write_text(yaml.safe_dump(cfg))
    return root


def assert_same_as_files(eng: Any) -> None:
    """The engine's state and index hold exactly the memories of the store's files."""
    files = load_state(eng.root)
    assert eng.state.memory_ids() == files.memory_ids()
    assert eng.index.memory_ids() == {
        m.id for m, area, _ in files.all_memories() if area != "archive"
    }


def idle(status: dict[str, Any]) -> bool:
    """A daemon's `status` reply says no route pass waits and no session is queued or runs:
    its own organizing after the last adds is over."""
    act = status.get("activity") or {}
    return not (status["route_pending"] or act.get("session_queued") or act.get("session_running"))


def git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=test", "-c", "user.email=t@example.com", *args],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def remote_head(bare: Path) -> str:
    """The commit a bare remote's `main` names, or "" before the first push made it."""
    out = subprocess.run(
        ["git", "--git-dir", str(bare), "rev-parse", "-q", "--verify", "refs/heads/main"],
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


def remote_has(bare: Path, commit: str) -> bool:
    """The bare remote's `main` is `commit` or a later commit made on top of it."""
    head = remote_head(bare)
    if not head:
        return False
    out = subprocess.run(
        ["git", "--git-dir", str(bare), "merge-base", "--is-ancestor", commit, head]
    )
    return out.returncode == 0


def head_contents(root: Path) -> list[str]:
    """Every memory's content in HEAD (clusters, archive, unsorted), read through git."""
    out = []
    files = git(root, "ls-tree", "-r", "--name-only", "HEAD").split()
    for f in files:
        if f.endswith(".yaml") and f.split("/")[0] in ("clusters", "archive", "unsorted"):
            data = yaml.safe_load(git(root, "show", f"HEAD:{f}"))
            out.extend(m["content"] for m in data.get("memories", []))
    return out


class InProcessDaemon:
    def __init__(self, root: Path, socket_path: Path | None = None, config: Config | None = None):
        self.root = root
        self.daemon = Daemon(root, socket_path, config or load_config(root))
        self.daemon.start()
        self.socket = self.daemon.socket_path

    @property
    def engine(self) -> Any:
        return self.daemon.engine

    def client(self, timeout: float | None = 30.0) -> Client:
        return Client(self.socket, timeout=timeout)

    def stop(self) -> None:
        self.daemon.shutdown()


class DaemonProcess:
    """`clagd run` as a real subprocess, for signals, kills and restarts."""

    def __init__(self, root: Path, socket_path: Path, env: dict[str, str] | None = None):
        self.root = root
        self.socket = socket_path
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.log = root.parent / f"{root.name}-daemon.log"

    def start(self, wait: bool = True) -> DaemonProcess:
        logf = open(self.log, "ab")
        self.proc = subprocess.Popen(
            self.command(),
            stdout=logf,
            stderr=logf,
            env=self.env,
            start_new_session=True,
        )
        logf.close()
        if wait:
            wait_for(self.ready, 30, "the daemon to answer ping")
        return self

    def command(self) -> list[str]:
        """The daemon's argv (a subclass starts another kind: a follower)."""
        argv = [sys.executable, "-m", "clagd", "--store", str(self.root)]
        return [*argv, "--socket", str(self.socket), "run"]

    def ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(
                f"daemon exited with {self.proc.returncode}:\n{self.log.read_text()}"
            )
        try:
            with Client(self.socket, timeout=5) as c:
                c.ping()
            return True
        except Exception:
            return False

    def client(self, timeout: float | None = 30.0) -> Client:
        return Client(self.socket, timeout=timeout)

    def terminate(self, timeout: float = 60) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)


def _postings(ix: Index, segs: tuple[Segment, ...]) -> tuple[dict, dict]:
    """Inverted (term -> [(slot, tf)]) and forward (slot -> sorted [(term, tf)]) postings,
    keyed by term text."""
    term = {i: t for t, i in ix.vocab.items()}
    inv: dict[str, list[tuple[int, float]]] = {}
    fwd: dict[int, list[tuple[str, float]]] = {}
    for seg in segs:
        for tid in range(len(seg.indptr) - 1):
            a, b = int(seg.indptr[tid]), int(seg.indptr[tid + 1])
            inv.setdefault(term[tid], []).extend(zip(seg.slots[a:b].tolist(), seg.tf[a:b].tolist()))
        for j in range(seg.stop - seg.start):
            a, b = int(seg.fptr[j]), int(seg.fptr[j + 1])
            terms = [term[t] for t in seg.ftid[a:b].tolist()]
            fwd[seg.start + j] = sorted(zip(terms, seg.ftf[a:b].tolist()))
    return {t: p for t, p in inv.items() if p}, fwd


# the arrays of a snapshot, by where they are kept
ARRAYS = {
    "memories": "length alive group prev nxt ts imp hid tok".split(),
    "profiles": "length alive".split(),
    "memory_bm25": "dn dead".split(),
    "cluster_bm25": "dn dead".split(),
    "": "sup_old sup_new uslots unsorted".split(),
}


def assert_same_index(a: Index, b: Index) -> None:
    """Two index snapshots hold the same: every array, every posting and cluster profile
    (by term: term ids may differ), the same memories in the same slots."""
    for part, names in ARRAYS.items():
        for name in names:
            x = getattr(getattr(a, part) if part else a, name)
            y = getattr(getattr(b, part) if part else b, name)
            assert x.dtype == y.dtype, (part, name)
            assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), (part, name)
    ma, mb, ca, cb = a.memories, b.memories, a.profiles, b.profiles
    assert (ma.n_alive, ma.total_len) == (mb.n_alive, mb.total_len)
    assert (ca.total_len, ca.slot_of) == (cb.total_len, cb.slot_of)
    assert dict(ma.slot_of.items()) == dict(mb.slot_of.items())
    assert [ma.mems[i] for i in range(len(ma.mems))] == [mb.mems[i] for i in range(len(mb.mems))]
    assert ca.clusters == cb.clusters
    assert [m.tolist() for m in ca.members] == [m.tolist() for m in cb.members]
    for name in ("order", "prev", "next"):
        assert np.array_equal(getattr(ma.time, name), getattr(mb.time, name)), name
    assert _postings(a, ma.segs) == _postings(b, mb.segs)
    assert _postings(a, ca.segs) == _postings(b, cb.segs)
