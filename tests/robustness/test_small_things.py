"""The smaller findings of issue 12, each with its clear behaviour: slow in-place writers,
files from the future, a symlinked rejected folder, forged log lines, a person's commit
sweeping up the daemon's files, a trickling client, a stale index.lock, NaN in a hand
edit, and a store the CLI's user may not read."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import InProcessDaemon, git, head_contents, make_store, wait_for

from clagd.engine.core import Engine
from clagd.ingest.inbox import Item
from clagd.store.gitrepo import GitStore


def test_a_slow_in_place_writer_is_read_only_after_it_closes(daemon: InProcessDaemon) -> None:
    """settle_seconds is 0.3 here; the writer pauses 1 s between parts (inotify)."""
    assert daemon.daemon.watcher.observer_kind == "inotify"
    path = daemon.root / "inbox" / "slow.txt"
    parts = ["Memory slow 1: the user ", "prefers the long version ", "of every story."]
    with open(path, "w", encoding="utf-8") as fh:
        for part in parts:
            fh.write(part)
            fh.flush()
            time.sleep(1.0)
            assert path.exists()  # not taken while still open
    wait_for(lambda: not path.exists(), 15, "the closed file")
    assert head_contents(daemon.root) == ["".join(parts).strip()]


def test_a_file_held_open_too_long_is_read_and_reported(tmp_path: Path, short_tmp: Path) -> None:
    store = make_store(tmp_path / "memory", {"inbox": {"open_max_seconds": 1.0}})
    d = InProcessDaemon(store, short_tmp / "s.sock")
    try:
        path = store / "inbox" / "held.txt"
        with open(path, "w", encoding="utf-8") as fh:
            fh.write("a memory whose writer never closes")
            fh.flush()
            wait_for(lambda: not path.exists(), 15, "the held file to be read")
        with d.client() as c:
            assert c.status()["inbox"]["held_open_total"] == 1
    finally:
        d.stop()


def test_a_file_from_the_future_does_not_wait_for_the_clock(daemon: InProcessDaemon) -> None:
    path = daemon.root / "inbox" / "future.txt"
    path.write_text("a memory written with a skewed clock")
    later = time.time() + 86400
    os.utime(path, (later, later))
    wait_for(lambda: not path.exists(), 10, "the file from the future")
    assert head_contents(daemon.root) == ["a memory written with a skewed clock"]


def test_a_symlinked_rejected_folder_keeps_files_in_the_store(
    daemon: InProcessDaemon, tmp_path: Path
) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    rejected = daemon.root / "inbox" / "rejected"
    os.rmdir(rejected)
    rejected.symlink_to(outside)
    (daemon.root / "inbox" / "bad.json").write_text("{broken")
    wait_for(lambda: (rejected / "bad.json.error").exists(), 15, "the rejection")
    assert not rejected.is_symlink() and list(outside.iterdir()) == []


def test_a_newline_in_a_file_name_cannot_forge_a_log_line(
    daemon: InProcessDaemon, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="clagd.inbox")
    name = "x.json\nERROR clagd: forged line"
    (daemon.root / "inbox" / name).write_text("{broken")
    wait_for(lambda: (daemon.root / "inbox" / "rejected" / f"{name}.error").exists(), 15)
    msgs = [r.getMessage() for r in caplog.records if "rejected inbox file" in r.getMessage()]
    assert msgs and all("\n" not in m for m in msgs)


def test_a_person_sweeping_the_daemons_files_into_their_commit(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`git commit -a` by the person between the daemon's `git add` and its commit: the
    memory is stored (in the person's commit) and the add is answered, not `internal`."""
    eng = Engine(store)
    try:
        real = GitStore.build_tree
        swept: list[bool] = []

        def person_commits_everything(
            self: GitStore, parent: str | None, paths: list[str], fsync: bool = True
        ) -> str:
            if not swept:
                git(store, "commit", "-qam", "the person's commit -a")
                swept.append(True)
            return real(self, parent, paths, fsync)

        monkeypatch.setattr(GitStore, "build_tree", person_commits_everything)
        res = eng.ingest([Item("swept into the person's commit", None, {})], "test")
        assert swept and not res.added and len(res.duplicates) == 1
        assert head_contents(store) == ["swept into the person's commit"]
        assert "the person's commit -a" in git(store, "log", "--format=%s")
    finally:
        eng.close()


def test_a_trickling_client_does_not_hold_a_slot(tmp_path: Path, short_tmp: Path) -> None:
    store = make_store(tmp_path / "memory", {"server": {"read_timeout": 1.0}})
    d = InProcessDaemon(store, short_tmp / "s.sock")
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(d.socket))
            t0 = time.monotonic()
            closed = False
            for ch in b'{"id": 1, "op": "ping"':
                try:
                    s.sendall(bytes([ch]))
                except OSError:
                    closed = True
                    break
                time.sleep(0.3)
                if time.monotonic() - t0 > 4:
                    break
            s.settimeout(5)
            try:
                closed = closed or s.recv(100) == b""
            except OSError:
                closed = True
            assert closed and time.monotonic() - t0 < 6
    finally:
        d.stop()


def test_a_stale_index_lock_gives_a_clear_error_in_time(daemon: InProcessDaemon) -> None:
    (daemon.root / ".git" / "index.lock").write_text("")
    with daemon.client(timeout=20) as c:
        t0 = time.monotonic()
        with pytest.raises(Exception) as err:
            c.add("behind a stale lock")
        assert time.monotonic() - t0 < 15
        # writes wait for the person's git (3 s), then say what holds them and what to do
        assert getattr(err.value, "code", "") == "paused" and "index.lock" in str(err.value)
        assert "remove it" in str(err.value)
        assert "git -c" not in str(err.value)  # no command line
        (daemon.root / ".git" / "index.lock").unlink()
        wait_for(lambda: _adds(c, "after the lock went"), 15, "writes to work again")


def _adds(c, text: str) -> bool:
    try:
        return c.add(text)["added"] == 1
    except Exception:
        return False


def test_nan_in_a_hand_edit_keeps_replies_strict_json(daemon: InProcessDaemon) -> None:
    shard = daemon.root / "unsorted" / "u-20260101T000000-abcdef.yaml"
    shard.write_text(
        "memories:\n- id: m-00000000000000aa\n  content: a hand written memory about nan\n"
        "  created_at: '2026-01-01T00:00:00Z'\n  metadata: {score: .nan}\n"
    )
    with daemon.client() as c:
        wait_for(lambda: c.status()["counts"]["memories"] == 1, 15, "the hand edit")
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(daemon.socket))
        s.sendall(b'{"id": 1, "op": "query", "text": "hand written memory nan"}\n')
        line = s.makefile("rb").readline()

    def refuse(name: str) -> None:
        raise AssertionError(name)

    reply = json.loads(line, parse_constant=refuse)
    assert reply["ok"] and reply["result"]["memories"][0]["metadata"]["score"] is None


def test_the_cli_on_a_store_it_may_not_read_says_so_in_one_line(tmp_path: Path) -> None:
    store = make_store(tmp_path / "memory")
    os.chmod(store, 0o700)
    os.chmod(tmp_path, 0o755)
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable]
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", ""), "HOME": "/tmp"}
    # the other user must be able to run clagd at all: a checkout (and its .venv) under a
    # folder only its owner may enter, as `mktemp -d` makes, is closed to it
    probe = subprocess.run(
        [*nobody, "-c", "import clagd"], capture_output=True, text=True, timeout=60, env=env
    )
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or ["?"])[-1]
        pytest.skip(f"uid 65534 cannot import clagd from this checkout ({why})")
    r = subprocess.run(
        [*nobody, "-m", "clagd", "--store", str(store), "query", "x"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode != 0
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("clagd:")


def test_a_clean_removing_a_file_mid_write_is_not_acknowledged(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`git clean -fdx` removes the new unsorted file between the daemon's write and its
    `git add`: the commit fails (nothing is acknowledged), and the next try stores it."""
    eng = Engine(store)
    try:
        real = GitStore._stage
        cleaned: list[bool] = []

        def person_cleans_first(self: GitStore, paths: list[str], fsync: bool) -> None:
            if not cleaned:
                git(store, "clean", "-fdxq", "--", "unsorted")
                cleaned.append(True)
            real(self, paths, fsync)

        monkeypatch.setattr(GitStore, "_stage", person_cleans_first)
        with pytest.raises(Exception, match=r"removed while clagd committed it \(git clean\?\)"):
            eng.ingest([Item("written while the person cleans", None, {})], "test")
        assert head_contents(store) == []
        res = eng.ingest([Item("written while the person cleans", None, {})], "test")
        assert res.added and head_contents(store) == ["written while the person cleans"]
    finally:
        eng.close()
