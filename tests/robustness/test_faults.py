"""Faults around a real daemon: the SLM failing in every way (against the loopback Ollama
server), the disk filling up during commits (a size-limited tmpfs), git locks and commits of
other processes, and an inbox watcher that cannot use inotify."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from competent import Competent, pass_gate
from fake_ollama import FakeOllama, delay, http_error, invalid_json
from helpers import InProcessDaemon, git, head_contents, make_store, wait_for

import clagd.ingest.watcher as watcher_mod

TEXTS = [
    "User is always cold in the evening",
    "User asked where the heating switch is",
    "Anna is the user's sister",
    "Anna lives in Lyon",
    "User likes green tea in the afternoon",
    "User drinks black coffee in the morning",
]


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _drop(inbox: Path, name: str, text: str) -> None:
    tmp = inbox / ".tmp" / name
    tmp.write_text(text, encoding="utf-8")
    os.rename(tmp, inbox / name)


def _ingests_and_serves(d: InProcessDaemon, tag: str) -> None:
    _drop(d.root / "inbox", f"{tag}.txt", f"inbox memory while the model is {tag}")
    with d.client() as c:
        assert c.add(f"socket memory while the model is {tag}")["commit"]
        wait_for(lambda: not (d.root / "inbox" / f"{tag}.txt").exists(), 20, "the inbox file")
        q = c.query(f"memory while the model is {tag}", max_memories=5)
        assert len(q.memories) >= 2


# -- SLM faults ---------------------------------------------------------------------------


def _slm_daemon(
    tmp_path: Path, short_tmp: Path, host: str, timeout: float = 1.0, fake: FakeOllama | None = None
):
    store = make_store(
        tmp_path / "memory",
        {"backend": {"kind": "ollama", "ollama": {"host": host, "timeout": timeout}}},
    )
    d = InProcessDaemon(store, short_tmp / "s.sock")
    if fake is not None:  # the model passed the competence gate before it started failing
        pass_gate(fake, d.daemon.backends.recheck(), d.daemon.config, store)
    with d.client() as c:
        c.add_many([{"content": t} for t in TEXTS])
    return d


@pytest.mark.parametrize("kind", ["refused", "model_missing"])
def test_unreachable_model_means_lexical_sessions(
    tmp_path: Path, short_tmp: Path, fake: FakeOllama, kind: str
) -> None:
    if kind == "refused":
        host = f"http://127.0.0.1:{_free_port()}"
    else:
        fake.models = ["some-other-model:7b"]
        host = fake.url
    d = _slm_daemon(tmp_path, short_tmp, host)
    try:
        _ingests_and_serves(d, kind)
        with d.client(timeout=60) as c:
            out = c.call("recluster")
            assert out["status"] in ("accepted", "noop") and out["backend"] == "none"
            st = c.status()
            assert st["backend"]["active"] == "none"
            why = st["backend"]["reason"]
            assert ("no Ollama server" in why) if kind == "refused" else ("ollama pull" in why)
            assert sorted(head_contents(d.root)) == sorted(
                TEXTS
                + [f"inbox memory while the model is {kind}"]
                + [f"socket memory while the model is {kind}"]
            )
    finally:
        d.stop()


BAD = {
    "timeout": lambda: delay(3.0),
    "garbage": invalid_json,
    "http_500": lambda: http_error(500, "CUDA error: out of memory"),
    "not_json_at_all": lambda: {"content": "I am sorry, as a language model I cannot"},
}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_failing_model_falls_back_and_says_so(
    tmp_path: Path, short_tmp: Path, fake: FakeOllama, kind: str
) -> None:
    d = _slm_daemon(tmp_path, short_tmp, fake.url, timeout=0.5, fake=fake)
    try:
        fake.script += [BAD[kind](), BAD[kind]()]
        with d.client(timeout=60) as c:
            # the session runs in the background; ingest and queries go on meanwhile
            assert c.call("recluster", wait=False)["status"] == "scheduled"
            _ingests_and_serves(d, kind)
            st = wait_for(
                lambda: (s := c.status())["counters"]["sessions"] >= 1 and s, 30, "the session"
            )
            assert st["counters"]["sessions_fallback"] == 1, st["last_session"]
            assert st["last_session"]["status"] == "fallback"
            assert any("lexical organizer applied" in r for r in st["last_session"]["reasons"])
            assert st["backend"]["failures"] >= 1 and st["backend"]["last_error"]
            kinds = [e["kind"] for e in c.log(20)["entries"]]
            assert "cluster" in kinds
        contents = Counter(head_contents(d.root))
        assert set(contents.values()) == {1} and len(contents) == len(TEXTS) + 2
    finally:
        d.stop()


def test_slow_model_within_its_timeout_is_used(
    tmp_path: Path, short_tmp: Path, fake: FakeOllama
) -> None:
    d = _slm_daemon(tmp_path, short_tmp, fake.url, timeout=5.0, fake=fake)
    try:
        # a sound plan (grouped as a person would), one second late
        competent = Competent(dict(zip(TEXTS, ["home heating"] * 2 + ["sister Anna"] * 2
                                                + ["drinks the user likes"] * 2)))  # fmt: skip
        fake.default = competent
        fake.script += [lambda req: {**competent(req), "delay": 1.0}]
        with d.client(timeout=60) as c:
            t0 = time.monotonic()
            q = c.query("where is the heating switch")  # not blocked by the session
            assert q.memories and time.monotonic() - t0 < 1.0
            out = c.call("recluster")
            assert out["status"] == "accepted" and out["backend"] == "ollama", out["reasons"]
    finally:
        d.stop()


# -- disk full ----------------------------------------------------------------------------


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 6 MiB tmpfs: a real ENOSPC for git and for clagd's own writes."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mnt)], capture_output=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _fill(path: Path) -> None:
    """Write until the file system is full, down to the last block."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        size = 1 << 20
        while size >= 512:
            try:
                os.write(fd, b"\0" * size)
            except OSError:
                size //= 2
    finally:
        os.close(fd)


def test_disk_full_pauses_ingest_and_resumes(small_fs: Path, short_tmp: Path) -> None:
    store = make_store(small_fs / "memory")
    d = InProcessDaemon(store, short_tmp / "s.sock")
    inbox = store / "inbox"
    try:
        with d.client() as c:
            c.add("a memory from before the disk filled up")
        names = [f"full-{i}.txt" for i in range(5)]
        for i, n in enumerate(names):
            (inbox / ".tmp" / n).write_text(f"memory {i} written while the disk is full")
        ballast = small_fs / "ballast"
        _fill(ballast)
        head = git(store, "rev-parse", "HEAD")
        for n in names:
            os.rename(inbox / ".tmp" / n, inbox / n)  # a rename needs no space
        with d.client() as c:
            st = wait_for(
                lambda: (s := c.status())["counters"]["ingest_failures"] >= 1 and s,
                20,
                "an ingest failure",
            )
            assert "No space left" in json.dumps(st.raw), st["writer"]
            assert c.ping()["pong"]
            assert len(c.query("memory before the disk filled").memories) == 1
        assert git(store, "rev-parse", "HEAD") == head
        assert sorted(p.name for p in inbox.glob("*.txt")) == sorted(names)
        ballast.unlink()
        wait_for(lambda: not any(inbox.glob("*.txt")), 60, "ingest to resume")
        with d.client() as c:
            # nothing half-written survives in the state: a session sees each memory once
            assert c.call("recluster", backend="none")["status"] in ("accepted", "noop")
            assert c.status()["counts"]["memories"] == 6
    finally:
        d.stop()
    contents = Counter(head_contents(store))
    assert len(contents) == 6 and set(contents.values()) == {1}
    assert subprocess.run(["git", "fsck", "--full"], cwd=store, capture_output=True).returncode == 0


# -- git: a foreign lock, a user's commits racing the writer ------------------------------


def test_foreign_index_lock_held_for_a_while(daemon: InProcessDaemon) -> None:
    lock = daemon.root / ".git" / "index.lock"
    lock.write_text("")
    inbox = daemon.root / "inbox"
    for i in range(10):
        _drop(inbox, f"l{i}.txt", f"memory {i} behind a foreign git lock")
    with daemon.client() as c:
        time.sleep(1.5)  # the lock is held this long by "another git process"
        assert c.ping()["pong"]
        lock.unlink()
        wait_for(lambda: not any(inbox.glob("*.txt")), 30, "the inbox to drain")
    assert sorted(head_contents(daemon.root)) == sorted(
        f"memory {i} behind a foreign git lock" for i in range(10)
    )


def test_user_commit_races_the_writer(daemon: InProcessDaemon) -> None:
    root = daemon.root
    with daemon.client(timeout=60) as c:
        c.add_many([{"content": t} for t in TEXTS])
        c.call("recluster", backend="none")
    cluster_file = sorted((root / "clusters").glob("c-*.yaml"))[0]
    inbox = root / "inbox"
    stream = [f"zx{i}q streamed memory number {i} with unrelated words" for i in range(40)]
    done = threading.Event()

    def feed() -> None:
        for i, text in enumerate(stream):
            _drop(inbox, f"s{i}.txt", text)
            time.sleep(0.02)
        done.set()

    t = threading.Thread(target=feed)
    t.start()
    edits = 0
    for k in range(5):  # the user edits by hand and commits, as people do
        data = yaml.safe_load(cluster_file.read_text())
        data["description"] = f"Edited by hand, round {k}."
        cluster_file.write_text(yaml.safe_dump(data, sort_keys=False))
        for _ in range(100):
            r = subprocess.run(
                ["git", "-c", "user.name=u", "-c", "user.email=u@x", "commit", "-qam", f"hand {k}"],
                cwd=root,
                capture_output=True,
                text=True,
            )
            if r.returncode == 0 or "nothing to commit" in r.stdout + r.stderr:
                break
            time.sleep(0.05)  # the daemon holds the index lock: try again
        edits += 1
        time.sleep(0.1)
    t.join()
    wait_for(lambda: not any(inbox.glob("*.txt")), 30, "the stream to land")
    cid = cluster_file.stem
    with daemon.client() as c:
        wait_for(
            lambda: any(
                x["id"] == cid and x["description"] == "Edited by hand, round 4."
                for x in c.clusters()["clusters"]
            ),
            20,
            "the daemon to load the hand edit",
        )
        assert c.status()["outside_edit_error"] == ""
    contents = Counter(head_contents(root))
    assert set(contents.values()) == {1}
    assert set(stream) | set(TEXTS) == set(contents)
    assert "Edited by hand, round 4." in git(root, "show", f"HEAD:clusters/{cid}.yaml")
    assert subprocess.run(["git", "fsck"], cwd=root, capture_output=True).returncode == 0


# -- the inbox watcher without inotify ----------------------------------------------------


def _ingest_20(store: Path, short_tmp: Path, before_start: bool) -> InProcessDaemon:
    inbox = store / "inbox"
    if before_start:
        for i in range(10):
            (inbox / f"pre{i}.txt").write_text(f"there before the daemon started {i}")
    d = InProcessDaemon(store, short_tmp / "s.sock")
    for i in range(10):
        _drop(inbox, f"post{i}.json", f'{{"content": "dropped while watching {i}"}}')
    (inbox / "inplace.md").write_text("written in place, no rename")
    wait_for(lambda: not any(p.is_file() for p in inbox.iterdir()), 30, "the inbox to drain")
    want = {f"dropped while watching {i}" for i in range(10)} | {"written in place, no rename"}
    if before_start:
        want |= {f"there before the daemon started {i}" for i in range(10)}
    assert set(head_contents(store)) == want
    return d


def test_polling_observer_by_config(tmp_path: Path, short_tmp: Path) -> None:
    store = make_store(tmp_path / "memory", {"inbox": {"observer": "polling"}})
    d = _ingest_20(store, short_tmp, before_start=True)
    try:
        assert d.daemon.watcher.observer_kind == "polling"
    finally:
        d.stop()


class _NoInotify:
    """An observer that fails like inotify at its watch limit."""

    def __init__(self, *a: object, **k: object) -> None:
        pass

    def schedule(self, *a: object, **k: object) -> None:
        raise OSError(28, "inotify watch limit reached")

    def start(self) -> None:  # pragma: no cover - schedule fails first
        pass


def test_inotify_unavailable_falls_back_to_polling(
    tmp_path: Path, short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(watcher_mod, "InotifyObserver", _NoInotify)
    store = make_store(tmp_path / "memory")
    d = _ingest_20(store, short_tmp, before_start=True)
    try:
        assert d.daemon.watcher.observer_kind == "polling"
    finally:
        d.stop()


def test_no_observer_at_all_the_rescan_still_ingests(
    tmp_path: Path, short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every event missed (no observer works): the periodic rescan finds every file."""
    monkeypatch.setattr(watcher_mod, "InotifyObserver", _NoInotify)
    monkeypatch.setattr(watcher_mod, "PollingObserver", lambda timeout=1.0: _NoInotify())
    store = make_store(tmp_path / "memory")
    d = _ingest_20(store, short_tmp, before_start=True)
    try:
        assert d.daemon.watcher.observer_kind == "rescan-only"
    finally:
        d.stop()
