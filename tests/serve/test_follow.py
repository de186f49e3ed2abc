"""Followers: read-only daemons serving a store from its primary's git remote, against a
real `git daemon` on loopback (git://) and a file:// remote, with real daemons on real
sockets."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import DaemonProcess, git, make_store, remote_head, wait_for
from test_protocol_doc import _check, _rows, _sections

from clagd.client import Client, ClientError

FOLLOW_SECONDS = 1.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class GitDaemon:
    """`git daemon` serving the bare repositories under `base` on loopback, pushes enabled."""

    def __init__(self, base: Path, port: int | None = None) -> None:
        self.base = base
        self.port = port or _free_port()
        self.proc: subprocess.Popen | None = None

    def url(self, name: str) -> str:
        return f"git://127.0.0.1:{self.port}/{name}"

    def start(self) -> GitDaemon:
        self.proc = subprocess.Popen(
            [
                "git",
                "daemon",
                "--reuseaddr",
                "--export-all",
                "--enable=receive-pack",
                f"--base-path={self.base}",
                "--listen=127.0.0.1",
                f"--port={self.port}",
                str(self.base),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(self._answers, 15, "git daemon to listen")
        return self

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None


class FollowerProcess(DaemonProcess):
    """`clagd follow REMOTE DIR` as a real subprocess."""

    def __init__(self, remote: str, root: Path, socket_path: Path) -> None:
        super().__init__(root, socket_path)
        self.remote = remote

    def command(self) -> list[str]:
        argv = [sys.executable, "-m", "clagd", "--socket", str(self.socket)]
        return [*argv, "follow", self.remote, str(self.root)]

    def start(self, wait: bool = True) -> FollowerProcess:
        super().start(wait)
        if wait:
            wait_for(self.processes_serve, 60, "the follower's query processes")
        return self

    def processes_serve(self) -> bool:
        with self.client() as c:
            qp = c.status()["query_processes"]
        return bool(qp.get("serving", 0) >= qp.get("configured", 0))


def _memories(client: Client) -> int:
    return int(client.status()["counts"]["memories"])


def _bare(path: Path) -> Path:
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(path)], check=True)
    return path


@pytest.fixture
def served(tmp_path: Path) -> Iterator[GitDaemon]:
    base = tmp_path / "srv"
    base.mkdir()
    _bare(base / "primary.git")
    d = GitDaemon(base).start()
    yield d
    d.stop()


def _primary(tmp_path: Path, sock: Path, remote: str) -> DaemonProcess:
    cfg = {"replication": {"remote": remote, "follow_seconds": FOLLOW_SECONDS, "retry_seconds": 1}}
    store = make_store(tmp_path / "primary", cfg)
    return DaemonProcess(store, sock).start()


def _pushed(bare: Path, primary: DaemonProcess) -> bool:
    with primary.client() as c:
        head = c.status()["head"]
    return remote_head(bare) == head


@pytest.fixture
def procs() -> Iterator[list[DaemonProcess]]:
    started: list[DaemonProcess] = []
    yield started
    for p in started:
        if p.proc is not None and p.proc.poll() is None:
            p.kill()


def test_two_followers_serve_a_burst_over_git_daemon(
    tmp_path: Path, short_tmp: Path, served: GitDaemon, procs: list[DaemonProcess]
) -> None:
    url = served.url("primary.git")
    primary = _primary(tmp_path, short_tmp / "p.sock", url)
    procs.append(primary)
    wait_for(lambda: _pushed(served.base / "primary.git", primary), 30, "the first push")
    followers = [
        FollowerProcess(url, tmp_path / f"f{i}", short_tmp / f"f{i}.sock").start() for i in range(2)
    ]
    procs.extend(followers)

    burst = [{"content": f"burst memory number {i} about topic {i % 37}"} for i in range(1000)]
    with primary.client(timeout=120) as c:
        c.add_many(burst)
    wait_for(lambda: _pushed(served.base / "primary.git", primary), 30, "the burst's push")
    pushed_at = time.monotonic()
    with ThreadPoolExecutor(len(followers)) as pool:  # both watched at once
        took = list(pool.map(lambda f: _serves(f, 1000) - pushed_at, followers))
    assert max(took) <= FOLLOW_SECONDS + 2, f"followers served the burst {took}s after the push"

    with followers[0].client() as c:
        hit = c.query("burst memory number 417")
        assert any(m.content.startswith("burst memory number 417 ") for m in hit.memories)
        s = c.status()
        tables = {op: _rows(lines) for op, lines in _sections().items() if op != "errors"}
        _check(s.raw, tables["status"])  # the replies as docs/protocol.md says
        _check(c.sync().raw, tables["sync"])
        f = s["follow"]
        assert f["remote"] == url and f["head"] == s["head"] and f["last_error"] == ""
        assert f["fetches"] >= 1 and f["seconds_since_fetch"] is not None
        for op, params in (
            ("add", {"content": "x"}),
            ("revert", {"ref": "HEAD"}),
            ("recluster", {}),
            ("archive", {}),
        ):
            with pytest.raises(ClientError) as err:
                c.call(op, **params)
            assert err.value.code == "read_only" and url in str(err.value)
    # a follower's inbox is not watched: the file stays there, and status names it
    (followers[1].root / "inbox" / "dropped.txt").write_text("dropped on a follower\n")
    with followers[1].client() as c:
        s = c.status()
    assert "inbox" not in s and s["follow"]["inbox_waiting"] == 1
    assert s["follow"]["inbox_files"] == ["dropped.txt"]
    assert (followers[1].root / "inbox" / "dropped.txt").exists()
    # it never committed: its history is the primary's, commit for commit
    assert git(followers[1].root, "rev-parse", "HEAD").strip() == _head(primary)
    out = subprocess.run(
        [sys.executable, "-m", "clagd", "--socket", str(followers[1].socket), "status"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0 and f"follower   follower of {url}" in out.stdout


def _serves(f: DaemonProcess, n: int) -> float:
    """When the follower first served `n` memories (polled every 20 ms)."""
    with f.client() as c:
        wait_for(lambda: _memories(c) == n, 30, "the follower to serve the burst", 0.02)
    return time.monotonic()


def _head(p: DaemonProcess) -> str:
    with p.client() as c:
        return str(c.status()["head"])


def test_file_remote_follower_killed_and_restarted_catches_up(
    tmp_path: Path, short_tmp: Path, procs: list[DaemonProcess]
) -> None:
    bare = _bare(tmp_path / "remote.git")
    url = f"file://{bare}"
    primary = _primary(tmp_path, short_tmp / "p.sock", url)
    procs.append(primary)
    with primary.client() as c:
        c.add("The user's cat is called Miso")
    wait_for(lambda: _pushed(bare, primary), 30, "the push")
    fol = FollowerProcess(url, tmp_path / "f", short_tmp / "f.sock").start()
    procs.append(fol)
    with fol.client() as c:
        wait_for(lambda: _memories(c) == 1, 20, "the follower to serve the first memory")
    fol.kill()  # SIGKILL: no clean stop, no warm start saved now
    with primary.client() as c:
        c.add("The user's dog is called Pixel")
        c.add("The user plays the cello on Sundays")
    wait_for(lambda: _pushed(bare, primary), 30, "the push")
    fol.start()
    with fol.client() as c:
        wait_for(lambda: _memories(c) == 3, 20, "the restarted follower to catch up")
        assert c.query("cello").memories[0].content == "The user plays the cello on Sundays"
        assert c.sync()["behind"] == 0
    assert git(fol.root, "rev-parse", "HEAD").strip() == _head(primary)


def test_remote_down_keeps_serving_and_catches_up_when_back(
    tmp_path: Path, short_tmp: Path, served: GitDaemon, procs: list[DaemonProcess]
) -> None:
    url = served.url("primary.git")
    primary = _primary(tmp_path, short_tmp / "p.sock", url)
    procs.append(primary)
    with primary.client() as c:
        c.add("Ana is allergic to walnuts")
    wait_for(lambda: _pushed(served.base / "primary.git", primary), 30, "the push")
    fol = FollowerProcess(url, tmp_path / "f", short_tmp / "f.sock").start()
    procs.append(fol)
    with fol.client() as c:
        wait_for(lambda: _memories(c) == 1, 20, "the follower to serve")
    served.stop()
    with primary.client() as c:
        c.add("Ana moved to Porto")
    with fol.client() as c:
        with pytest.raises(ClientError) as err:
            c.sync()
        assert "fetch from" in str(err.value)
        f = wait_for(lambda: c.status()["follow"], 5, "status")
        assert f["last_error"] and f["failures"] >= 1
        assert c.query("walnuts").memories[0].content == "Ana is allergic to walnuts"
        lag = f["seconds_since_fetch"]
        wait_for(lambda: c.status()["follow"]["seconds_since_fetch"] > lag, 10, "the lag to grow")
    served.start()  # same port, same repository
    wait_for(lambda: _pushed(served.base / "primary.git", primary), 30, "the primary's retry")
    with fol.client() as c:
        wait_for(lambda: _memories(c) == 2, 10, "the follower to catch up")
        assert c.status()["follow"]["last_error"] == ""


def test_a_rewrite_is_followed_and_leaves_no_trace(
    tmp_path: Path, short_tmp: Path, procs: list[DaemonProcess]
) -> None:
    """A force-pushed rewrite (what `forget --purge` on a primary pushes) that drops a
    secret: after the fetch that saw it, nothing of the follower holds the text."""
    bare = _bare(tmp_path / "remote.git")
    url = f"file://{bare}"
    primary = _primary(tmp_path, short_tmp / "p.sock", url)
    procs.append(primary)
    with primary.client() as c:
        c.add("The garden gate code is 1234")
        before = _head(primary)
        c.add("The user's PIN is 9731-SECRET")
        c.add("The user likes green tea")
        tea = _head(primary)
    wait_for(lambda: _pushed(bare, primary), 30, "the push")
    fol = FollowerProcess(url, tmp_path / "f", short_tmp / "f.sock").start()
    procs.append(fol)
    with fol.client() as c:
        wait_for(lambda: _memories(c) == 3, 20, "the follower to serve")
        assert "9731-SECRET" in c.query("PIN").context
    primary.terminate()
    # the rewrite, as a person (or a purge) makes it: history without the secret
    work = tmp_path / "rewrite"
    subprocess.run(["git", "clone", "-q", str(bare), str(work)], check=True)
    git(work, "reset", "-q", "--hard", before)
    git(work, "cherry-pick", tea)  # the later memory stays, the secret's commit goes
    git(work, "push", "-q", "--force", "origin", "HEAD:main")
    with fol.client() as c:
        s = c.sync()
        assert s["rewrites"] == 1 and s["head"] == git(work, "rev-parse", "HEAD").strip()
        assert "9731-SECRET" not in c.query("PIN").context
        assert _memories(c) == 2
    assert fol.terminate() == 0  # a clean stop saves the warm start again
    _assert_no_trace(fol.root, "9731-SECRET")


def _assert_no_trace(root: Path, secret: str) -> None:
    objects = subprocess.run(
        ["git", "-C", str(root), "cat-file", "--batch-all-objects", "--batch"],
        capture_output=True,
        check=True,
    ).stdout
    assert secret.encode() not in objects, "an object of the follower's holds the secret"
    revs = git(root, "rev-list", "--all").split()
    grep = subprocess.run(["git", "-C", str(root), "grep", "-q", secret, *revs])
    assert grep.returncode == 1
    log = git(root, "log", "-p", "--all", "--reflog")
    assert secret not in log
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            if path.is_symlink() or not path.is_file():
                continue
            assert secret.encode() not in path.read_bytes(), f"{path} holds the secret"


def test_a_follower_refuses_a_repository_that_is_not_a_store(tmp_path: Path) -> None:
    bare = _bare(tmp_path / "other.git")
    work = tmp_path / "other"
    subprocess.run(["git", "clone", "-q", str(bare), str(work)], check=True, capture_output=True)
    (work / "README.md").write_text("not a memory store\n")
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "readme")
    git(work, "push", "-q", "origin", "HEAD:main")
    dest = tmp_path / "f"
    out = subprocess.run(
        [sys.executable, "-m", "clagd", "follow", f"file://{bare}", str(dest)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert "is not a clagd store" in out.stderr and not dest.exists()


def test_run_refuses_a_followers_store_and_follow_refuses_a_primary(
    tmp_path: Path, procs: list[DaemonProcess], short_tmp: Path
) -> None:
    bare = _bare(tmp_path / "remote.git")
    primary = _primary(tmp_path, short_tmp / "p.sock", f"file://{bare}")
    procs.append(primary)
    wait_for(lambda: _pushed(bare, primary), 30, "the push")
    fol = FollowerProcess(f"file://{bare}", tmp_path / "f", short_tmp / "f.sock").start()
    procs.append(fol)
    fol.terminate()
    run = subprocess.run(
        [sys.executable, "-m", "clagd", "run", str(fol.root)], capture_output=True, text=True
    )
    assert run.returncode != 0 and f"clagd follow file://{bare}" in run.stderr
    primary.terminate()
    other = subprocess.run(
        [sys.executable, "-m", "clagd", "follow", f"file://{bare}", str(primary.root)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert other.returncode != 0 and "not a follower's store" in other.stderr
    with pytest.raises(ClientError) as err:  # nothing serves: a clean refusal, no daemon
        Client(short_tmp / "f.sock", timeout=2).ping()
    assert err.value.code == "not_running"


def test_sync_on_a_primary_is_a_clear_error(daemon_proc: DaemonProcess) -> None:
    daemon_proc.start()
    with daemon_proc.client() as c, pytest.raises(ClientError) as err:
        c.sync()
    assert err.value.code == "bad_request" and "primary" in str(err.value)
