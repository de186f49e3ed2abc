"""A person at the keyboard: ordinary (and careless) git use in a store while a real daemon
ingests, plus a few SIGKILLs of the daemon.

While a dropper thread writes bursts of memory files into the inbox and an adder thread sends
`add` requests without pause, a scripted person runs in the store, one after another: a
checkout of an old commit and back, a branch switch and back, `reset --hard HEAD~n`, a rebase
that drops a commit, `commit --amend`, `stash` / `stash pop`, `gc`, `clean -fdx`, a
conflicted merge and `merge --abort`, `git revert` of a daemon commit, vim-style swap and
backup files in clusters/, poison files in the inbox; and SIGKILLs of the daemon (restarted
at once). After each step the person waits for the daemon to have taken it in.

At the end (a clean run that drains the inbox) the harness checks:

* every memory acknowledged after the last history rewrite (an `add` answered ok, an inbox
  file that left the inbox) is in HEAD exactly once; no memory is in HEAD twice;
* every memory a rewrite took out of HEAD is reported in `.git/clagd-history.jsonl`;
* the daemon serves HEAD (its head, its counts), `git fsck --full` is clean;
* a start without the warm-start file succeeds and serves the same.

With `--daemon-gc` the daemon's own `git gc --auto` (store/packing.py) runs all along beside
all of that: checked every 0.6 s, with git's threshold at its lowest (`gc.auto = 1`).

    python benchmarks/person_harness.py --rounds 3 [--kills 3] [--seed 1] [--keep] [--daemon-gc]
        [--realistic N]

`--realistic N` starts from a store of N memories shaped as the daemon shapes one
(`realistic.py`: ~12 a cluster), checked as the acknowledged ones are.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # realistic.py, corpus.py

from helpers import DaemonProcess, make_store, wait_for  # noqa: E402
from realistic import seed_store  # noqa: E402

from clagd.client import Client, ClientError  # noqa: E402
from clagd.model import memory_id  # noqa: E402
from clagd.store.history import HISTORY_FILE, _ls, ids_at  # noqa: E402

DATA_DIRS = ("clusters", "archive", "unsorted")
WORDS = (
    "garden kettle violin harbour lantern meadow pepper orbit canyon falcon ginger marble "
    "nickel oyster pigeon quartz saddle thistle tunnel walnut yellow zephyr anchor basil"
).split()
POISON = {
    "p-utf16.txt": "saved as UTF-16".encode("utf-16-le"),
    "p-deep.yaml": ("content: x\nmetadata: " + "[" * 800 + "]" * 800 + "\n").encode(),
    "p-bigint.json": ('{"content": "big", "metadata": {"n": ' + "9" * 5000 + "}}").encode(),
    "p-late.yaml": b"content: far future\ncreated_at: 9999-12-31T23:59:59-14:00\n",
    "p-surrogate.json": b'{"content": "broken \\ud800 text"}',
}


# what a person's git says when the daemon's git is busy in the store at the same moment;
# "would be overwritten" is a checkout that met a daemon's write in flight (the cluster file
# written, its commit not landed yet): a few milliseconds, so a person tries again. A file
# the daemon left changed for good still fails the step, after the retries' 5 s
RETRIED = (".lock", "cannot lock ref", "gc is already running", "would be overwritten by")


def git(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """A person's git command; tried again (as a person would) when the daemon held a lock,
    committed in the same instant (git's own compare-and-swap: "cannot lock ref"), or ran
    its own gc (git refuses a second one: "gc is already running")."""
    cmd = ["git", "-c", "user.name=person", "-c", "user.email=p@example.com", *args]
    for _ in range(100):
        r = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
        if r.returncode == 0 or not any(s in r.stderr for s in RETRIED):
            break
        time.sleep(0.05)
    if check and r.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {r.stderr.strip()} {r.stdout.strip()}")
    return r


def head_ids(root: Path, rev: str = "HEAD") -> set[str]:
    sha = git(root, "rev-parse", rev).stdout.strip()
    return ids_at(root, sha, _ls(root, sha))


def head_contents(root: Path) -> Counter[str]:
    sha = git(root, "rev-parse", "HEAD").stdout.strip()
    out: Counter[str] = Counter()
    for f in _ls(root, sha):
        text = git(root, "show", f"{sha}:{f}").stdout
        import yaml

        data = yaml.safe_load(text) or {}
        out.update(m["content"] for m in data.get("memories") or [])
    return out


class Load(threading.Thread):
    """Inbox bursts and socket adds; remembers what was acknowledged, and when."""

    def __init__(self, root: Path, sock: Path, rng: random.Random) -> None:
        super().__init__(name="load", daemon=True)
        self.root, self.sock, self.rng = root, sock, rng
        self.inbox = root / "inbox"
        self.stop_event = threading.Event()
        self.inbox_lock = threading.Lock()  # the person's `git clean -fdx` takes it
        self.pending: dict[str, tuple[str, float]] = {}  # name -> (content, last seen there)
        self.acked: dict[str, float] = {}  # content -> the time before which it was not stored
        self.cleaned: set[str] = set()  # inbox files the person's clean removed
        self.counts: Counter[str] = Counter()
        self.errors: list[str] = []  # `store` and `internal` replies, for the report
        self.n = 0

    def _text(self, kind: str) -> str:
        self.n += 1
        return f"person {kind} {self.n} " + " ".join(self.rng.choice(WORDS) for _ in range(5))

    def run(self) -> None:
        while not self.stop_event.is_set():
            with self.inbox_lock:
                self._drop_burst()
                self._observe()
            self._add()
            self.stop_event.wait(self.rng.uniform(0.02, 0.1))

    def _drop_burst(self) -> None:
        for _ in range(self.rng.choice((1, 1, 2, 4))):
            text = self._text("file")
            name = f"f{self.n:06d}.txt"
            tmp = self.inbox / ".tmp" / name
            try:
                tmp.parent.mkdir(parents=True, exist_ok=True)
                tmp.write_text(text + "\n", encoding="utf-8")
                os.rename(tmp, self.inbox / name)
            except OSError:
                continue  # the inbox was just removed by the person: try later
            self.pending[name] = (text, time.time())
            self.counts["files"] += 1

    def _observe(self) -> None:
        now = time.time()
        for name, (text, _seen) in list(self.pending.items()):
            if (self.inbox / name).exists():
                self.pending[name] = (text, now)
            else:
                # it left the inbox: committed (the daemon deletes only after the commit),
                # after the last moment it was seen there
                self.acked[text] = self.pending.pop(name)[1]
                self.counts["files_acked"] += 1

    def _add(self) -> None:
        text = self._text("add")
        sent = time.time()
        try:
            with Client(self.sock, timeout=30) as c:
                c.call("add", content=text)
            self.acked[text] = sent
            self.counts["adds_acked"] += 1
        except ClientError as exc:
            self.counts[f"add_{exc.code}"] += 1
            if exc.code in ("internal", "store"):
                self.errors.append(f"{exc.code}: {exc}")
        except OSError:
            self.counts["add_oserror"] += 1

    def forget_cleaned(self) -> None:
        """Called with inbox_lock held, after the person's `git clean -fdx`."""
        for name in [n for n in self.pending if not (self.inbox / n).exists()]:
            self.cleaned.add(self.pending.pop(name)[0])


class Person:
    def __init__(self, root: Path, daemon: DaemonProcess, load: Load, rng: random.Random):
        self.root, self.daemon, self.load, self.rng = root, daemon, load, rng
        self.ops: Counter[str] = Counter()
        self.skipped: Counter[str] = Counter()
        # what the person had to clear up after git's own race for HEAD (see `merge`)
        self.cleanups: Counter[str] = Counter()
        self.last_rewrite_end = 0.0
        self.removed: dict[str, set[str]] = {}  # op label -> ids it took out of HEAD
        self.kills = 0
        self.n = 0

    # -- helpers ------------------------------------------------------------------------
    def settle(self) -> None:
        """Wait until the daemon has taken in the last step (or says it is paused)."""

        def taken_in() -> bool:
            try:
                with Client(self.daemon.socket, timeout=10) as c:
                    st = c.status()
            except Exception:  # noqa: BLE001 - re-created socket, restart
                return False
            if self.clear_staged_leftover(st):
                return False
            head = git(self.root, "rev-parse", "HEAD").stdout.strip()
            return bool(st["paused"]) or st["head"] == head

        wait_for(taken_in, 30, "the daemon to take in the person's step")

    def clear_staged_leftover(self, st: dict | None = None) -> bool:
        """A git command of the person's that lost git's own race for HEAD with a commit
        of the daemon's leaves the index (and files) of the commit before: the daemon
        pauses and says so in status; the person reads it and resets. True: reset."""
        if st is None:
            try:
                with Client(self.daemon.socket, timeout=10) as c:
                    st = c.status()
            except Exception:  # noqa: BLE001 - re-created socket, restart
                return False
        if "staged in the memory folders" not in st["paused"]:
            return False
        git(self.root, "reset", "-q", "--hard")
        self.cleanups["reset_after_paused_staged"] += 1
        # a reset --hard that read HEAD just before a commit of the daemon's landed writes the
        # commit before (git's own race, as with clean): it may remove, reported
        self.last_rewrite_end = time.time()
        return True

    def rewrite(self, label: str, *args: str) -> bool:
        before = head_ids(self.root)
        r = git(self.root, *args, check=False)
        ok = r.returncode == 0
        if ok:
            gone = before - head_ids(self.root)
            if gone:
                self.removed[f"{label}#{self.n}"] = gone
            self.last_rewrite_end = time.time()
        return ok

    def commits_beyond_setup(self) -> int:
        return int(git(self.root, "rev-list", "--count", "HEAD").stdout) - 3

    # -- the steps ------------------------------------------------------------------------
    def checkout_old(self) -> None:
        git(self.root, "checkout", "-q", "HEAD~1")
        time.sleep(0.5)
        git(self.root, "checkout", "-q", "main")

    def branch(self) -> None:
        git(self.root, "checkout", "-q", "-b", f"side-{self.n}")
        time.sleep(0.5)
        git(self.root, "checkout", "-q", "main")

    def reset(self) -> None:
        n = self.rng.choice((1, 2))
        if self.commits_beyond_setup() <= n + 1:
            self.skipped["reset"] += 1
            return
        self.rewrite("reset", "reset", "-q", "--hard", f"HEAD~{n}")

    def rebase(self) -> None:
        if self.commits_beyond_setup() <= 3:
            self.skipped["rebase"] += 1
            return
        for _ in range(20):  # refused while a write of the daemon's is in flight: again
            if self.rewrite("rebase", "rebase", "-q", "--onto", "HEAD~2", "HEAD~1"):
                return
            if (self.root / ".git" / "rebase-merge").exists():
                # a conflict: give up. The abort moves the branch back to where the rebase
                # began, so a commit of the daemon's that landed in git's race window before
                # the rebase marked itself in progress leaves HEAD: a rewrite (reported)
                self.rewrite("rebase-abort", "rebase", "--abort")
                break
            time.sleep(0.1)
        self.skipped["rebase"] += 1

    def amend(self) -> None:
        self.rewrite("amend", "commit", "-q", "--amend", "--only", "-m", "amended by the person")

    def stash(self) -> None:
        cfg = self.root / "clagd.yaml"
        with open(cfg, "a", encoding="utf-8") as fh:
            fh.write(f"# the person's note {self.n}\n")
        self.again("stash", "-q")
        time.sleep(0.3)
        if git(self.root, "stash", "list").stdout.strip():
            # a stash that a write of the daemon's cut half-way (the stash made, the reset
            # refused by the index lock) leaves the change in place too: the stash holds it
            git(self.root, "checkout", "-q", "--", "clagd.yaml")
            self.pop()
        git(self.root, "checkout", "-q", "--", "clagd.yaml")

    def pop(self) -> None:
        """`stash pop`, as a person resolves it: a stash that caught a daemon's write in
        flight (a cluster file the daemon committed since) conflicts with HEAD; the person
        takes HEAD's memory files and drops the stash (their own change is clagd.yaml)."""
        for _ in range(30):
            r = git(self.root, "stash", "pop", "-q", check=False)
            if r.returncode == 0:
                return
            if "index.lock" not in r.stderr:
                break
            time.sleep(0.1)
        self.cleanups["stash-conflict"] += 1
        self.again("reset", "-q")  # the unmerged entries out of the index
        tracked = set(git(self.root, "ls-tree", "--name-only", "HEAD").stdout.split())
        self.again("checkout", "-q", "HEAD", "--", *(d for d in DATA_DIRS if d in tracked))
        git(self.root, "stash", "drop", "-q", check=False)

    def again(self, *args: str) -> None:
        """A command git refuses while a write of the daemon's is in flight: try again."""
        for _ in range(30):
            r = git(self.root, *args, check=False)
            if r.returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError(f"git {' '.join(args)}: {r.stdout.strip()} {r.stderr.strip()}")

    def gc(self) -> None:
        git(self.root, "gc", "-q")

    def clean(self) -> None:
        with self.load.inbox_lock:
            self.load._observe()  # what left the inbox before the clean was stored
            for _ in range(5):  # a file the daemon removed meanwhile makes clean complain
                if git(self.root, "clean", "-fdxq", check=False).returncode == 0:
                    break
            self.load.forget_cleaned()
        # a clean racing a commit of the daemon's can delete a file the daemon has just
        # committed (it was untracked when clean listed it): the daemon commits and reports
        # that deletion like a hand edit, so a clean counts as a step that may remove
        self.last_rewrite_end = time.time()

    def merge(self) -> None:
        notes = self.root / "notes.txt"
        git(self.root, "checkout", "-q", "-b", f"m-{self.n}")
        notes.write_text(f"theirs {self.n}\n")
        git(self.root, "commit", "-q", "-m", "theirs", "--", "notes.txt")
        git(self.root, "checkout", "-q", "main")
        notes.write_text(f"ours {self.n}\n")
        git(self.root, "commit", "-q", "-m", "ours", "--", "notes.txt")
        for _ in range(50):  # refused while a write of the daemon's is in flight: again
            r = git(self.root, "merge", "-q", f"m-{self.n}", check=False)
            if (self.root / ".git" / "MERGE_HEAD").exists():
                break
            self.clear_staged_leftover()  # git refuses to merge over staged leftovers
            time.sleep(0.1)
        assert r.returncode != 0 and (self.root / ".git" / "MERGE_HEAD").exists(), r.stderr
        time.sleep(0.5)
        # the abort (reset --merge) of a merge that read HEAD just before a commit of the
        # daemon's landed takes that commit's new files out of the working tree (git's own
        # race for HEAD); the daemon commits and reports the deletion: a step that may remove
        if git(self.root, "merge", "--abort", check=False).returncode != 0:
            # the merge read HEAD just before a commit of the daemon's landed and wrote the
            # index of the commit before (git's own race for HEAD): the daemon's new file is
            # untracked now and `reset --merge` refuses to overwrite it; the person resets
            git(self.root, "reset", "-q", "--hard")
            self.cleanups["reset_after_failed_merge_abort"] += 1
        self.last_rewrite_end = time.time()

    def revert(self) -> None:
        log = git(self.root, "log", "-n", "30", "--format=%H %s").stdout.splitlines()
        ingests = [line.split()[0] for line in log if " ingest:" in f" {line.split(' ', 1)[1]}"]
        if not ingests:
            self.skipped["revert"] += 1
            return
        sha = self.rng.choice(ingests)
        if not self.rewrite("revert", "revert", "--no-edit", sha):
            git(self.root, "revert", "--abort", check=False)
            self.skipped["revert"] += 1

    def swap_files(self) -> None:
        clusters = self.root / "clusters"
        files = [clusters / f".c-{self.n:08x}.yaml.swp", clusters / f"c-{self.n:08x}.yaml~"]
        for f in files:
            f.write_bytes(b"b0VIM 9.0\x00person\x00/home/person/secret\x00")
        (clusters / "4913").write_text("")
        time.sleep(0.5)
        for f in [*files, clusters / "4913"]:
            f.unlink(missing_ok=True)

    def poison(self) -> None:
        for name, data in POISON.items():
            tmp = self.root / "inbox" / ".tmp" / f"{self.n}-{name}"
            tmp.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(data)
            os.rename(tmp, self.root / "inbox" / tmp.name)

    def kill(self) -> None:
        assert self.daemon.proc is not None
        os.kill(self.daemon.proc.pid, signal.SIGKILL)
        self.daemon.proc.wait(10)
        self.kills += 1
        self.daemon.start(wait=True)

    STEPS = (
        "checkout_old",
        "branch",
        "reset",
        "rebase",
        "amend",
        "stash",
        "gc",
        "clean",
        "merge",
        "revert",
        "swap_files",
        "poison",
    )

    def play(self, rounds: int, kills: int) -> None:
        plan = [s for _ in range(rounds) for s in self.rng.sample(self.STEPS, len(self.STEPS))]
        for _ in range(kills):  # spread the kills over the plan
            plan.insert(self.rng.randrange(1, len(plan)), "kill")
        for step in plan:
            self.n += 1
            time.sleep(self.rng.uniform(0.1, 0.4))  # the load runs between steps
            getattr(self, step)()
            self.ops[step] += 1
            self.settle()


def run(
    rounds: int,
    kills: int,
    seed: int = 1,
    workdir: Path | None = None,
    verbose: bool = True,
    daemon_gc: bool = False,
    realistic: int = 0,
) -> dict:
    rng = random.Random(seed)
    base = workdir or Path(tempfile.mkdtemp(prefix="clagd-p-", dir="/tmp"))
    root = make_store(base / "m", {"git": {"gc_interval_minutes": 0.01}} if daemon_gc else None)
    if daemon_gc:
        git(root, "config", "gc.auto", "1")
    (root / "notes.txt").write_text("the person's notes\n")
    git(root, "add", "clagd.yaml", "notes.txt")
    git(root, "commit", "-q", "-m", "settings and notes")
    seeded = seed_store(root, realistic, seed) if realistic else []
    sock = root / ".clagd" / "clagd.sock"
    daemon = DaemonProcess(root, sock).start()
    t0 = time.monotonic()
    load = Load(root, sock, rng)
    # in HEAD before the daemon started: checked as memories acknowledged then are
    load.acked.update({t: 0.0 for t in seeded})
    person = Person(root, daemon, load, rng)
    load.start()
    try:
        person.play(rounds, kills)
        # the load goes on until something is acknowledged after the person's last rewrite,
        # so that the check of what came after it never checks nothing
        wait_for(
            lambda: any(at > person.last_rewrite_end for at in list(load.acked.values())),
            60,
            "an acknowledgement after the last rewrite",
        )
    finally:
        load.stop_event.set()
        load.join(30)
    report = finish(root, daemon, load, person)
    log = daemon.log.read_text(errors="replace")
    report["daemon_gc"] = {
        "packed": log.count("git gc --auto: packed"),
        "failed": log.count("failed: git gc"),
        "packs_at_end": len(list((root / ".git" / "objects" / "pack").glob("*.pack"))),
    }
    report["seconds"] = round(time.monotonic() - t0, 1)
    report["realistic_memories"] = len(seeded)
    if verbose:
        print(json.dumps(report, indent=1, default=str))
    if workdir is None and not report["problems"]:
        shutil.rmtree(base, ignore_errors=True)
    return report


def query_process_problems(daemon: DaemonProcess, st: dict, texts: list[str]) -> list[str]:
    """The query processes serve the daemon's newest index, and answer as the daemon's own
    (a query of the archive is the daemon's; archive is off here, so they must agree)."""
    if not (st.get("query_processes") or {}).get("configured"):
        return []
    out = []

    def caught_up() -> dict | None:  # one may be starting again (a `git clean` took the socket)
        with Client(daemon.socket, timeout=30) as c:
            qp = c.status()["query_processes"]
        procs = qp["processes"]
        ok = qp["serving"] == qp["configured"] and all(p["applied"] == qp["version"] for p in procs)
        return qp if ok else None

    try:
        wait_for(caught_up, 30, "the query processes")
    except AssertionError:
        with Client(daemon.socket, timeout=30) as c:
            out.append(f"query processes behind the daemon: {c.status()['query_processes']}")
    with Client(daemon.socket, timeout=30) as c:
        for text in texts:
            mine = c.call("query", text=text)
            theirs = c.call("query", text=text, include_archive=True)
            ids = [(m["id"], m["score"]) for m in mine["memories"]]
            if ids != [(m["id"], m["score"]) for m in theirs["memories"]]:
                out.append(f"a query process answers {text!r} unlike the daemon")
                break
    return out


def finish(root: Path, daemon: DaemonProcess, load: Load, person: Person) -> dict:
    problems: list[str] = []
    inbox = root / "inbox"

    def drained() -> bool:
        load._observe()
        return not load.pending and not any(p.is_file() for p in inbox.iterdir())

    wait_for(drained, 120, "the inbox to drain")
    person.settle()
    with Client(daemon.socket, timeout=30) as c:
        st = c.status()
    head = git(root, "rev-parse", "HEAD").stdout.strip()
    contents = head_contents(root)
    twice = [t for t, n in contents.items() if n > 1]
    if twice:
        problems.append(f"{len(twice)} memories in HEAD more than once: {twice[:3]}")
    late = {t for t, at in load.acked.items() if at > person.last_rewrite_end}
    missing = sorted(t for t in late if contents[t] != 1)
    if missing:
        problems.append(
            f"{len(missing)} acknowledged after the last rewrite not in HEAD: "
            + "; ".join(f"{t!r} ({memory_id(t)}, {contents[t]}x)" for t in missing[:3])
        )
    reported: set[str] = set()
    history = root / ".git" / HISTORY_FILE
    events = [json.loads(x) for x in history.read_text().splitlines()] if history.exists() else []
    for e in events:
        reported.update(e.get("ids", []))
    unreported = {k: v - reported for k, v in person.removed.items() if v - reported}
    if unreported:
        problems.append(f"rewrites not reported: {sorted(unreported)}")
    # every acknowledged memory, whenever acknowledged: in HEAD, or taken out of HEAD by a
    # rewrite of the person's that the daemon reported
    gone = [t for t in load.acked if contents[t] == 0]
    silently = [t for t in gone if memory_id(t) not in reported]
    if silently:
        problems.append(
            f"{len(silently)} acknowledged memories left HEAD unreported: {silently[:3]}"
        )
    if st["head"] != head or st["paused"] or st["outside_edit_error"]:
        problems.append(f"daemon not on HEAD: {st['head']} {head} {st['paused']!r}")
    n_hot = sum(n for t, n in contents.items())  # archive is off here: all are served
    if st["counts"]["memories"] != n_hot:
        problems.append(f"daemon serves {st['counts']['memories']}, HEAD holds {n_hot}")
    problems += query_process_problems(daemon, st, list(contents)[:20])
    fsck = subprocess.run(["git", "fsck", "--full"], cwd=root, capture_output=True, text=True)
    if fsck.returncode != 0:
        problems.append(f"git fsck: {fsck.stderr.strip()[:300]}")
    if daemon.terminate() != 0:
        problems.append("the daemon did not stop cleanly")
    for f in (root / ".clagd").glob("warmstart*"):
        if any(p.startswith("daemon serves") for p in problems):
            shutil.copy(f, root.parent / f"served-{f.name}")  # what it served, to compare
        f.unlink()
    daemon.start(wait=True)
    with Client(daemon.socket, timeout=30) as c:
        st2 = c.status()
    if st2["counts"]["memories"] != n_hot or st2["head"] != head:
        problems.append(
            "a start without the warm-start file serves something else: "
            f"{st2['counts']['memories']} memories at {st2['head'][:10]}, "
            f"HEAD holds {n_hot} at {head[:10]}"
        )
    daemon.terminate()
    return {
        "person_steps": dict(person.ops),
        "skipped": dict(person.skipped),
        "person_cleanups": dict(person.cleanups),
        "kills": person.kills,
        "files_dropped": load.counts["files"],
        "files_acked": load.counts["files_acked"],
        "files_cleaned_by_person": len(load.cleaned),
        "adds_acked": load.counts["adds_acked"],
        "add_errors": {k: v for k, v in load.counts.items() if k.startswith("add_")},
        "error_replies": load.errors[:10],
        "acked": len(load.acked),
        "acked_after_last_rewrite": len(late),
        "lost": len(missing),
        "acked_removed_by_reported_rewrites": len(gone),
        "acked_gone_unreported": len(silently),
        "rewrites_removing": len(person.removed),
        "removed_by_rewrites": sum(len(v) for v in person.removed.values()),
        "reported_events": len(events),
        "reported_removed": sum(int(e.get("removed", 0)) for e in events),
        "memories_in_head": n_hot,
        "problems": problems,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="each step this many times")
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the store for inspection")
    ap.add_argument(
        "--daemon-gc", action="store_true", help="the daemon's git gc all along (see above)"
    )
    ap.add_argument("--realistic", type=int, default=0, help="start from N memories")
    a = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="clagd-p-", dir="/tmp")) if a.keep else None
    report = run(a.rounds, a.kills, a.seed, workdir, daemon_gc=a.daemon_gc, realistic=a.realistic)
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
