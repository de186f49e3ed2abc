"""clagd.client against a real JSON-lines Unix socket server running in a thread."""

from __future__ import annotations

import json
import os
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from clagd import errors
from clagd.client import (
    MAX_SOCKET_PATH,
    Added,
    Client,
    ClientError,
    ClusterInfo,
    ClusterScore,
    Counts,
    DaemonNotRunning,
    DaemonTimeout,
    LogEntry,
    MemoryHit,
    Pong,
    ProtocolError,
    QueryResult,
    Rounds,
    Session,
    Status,
    default_socket_path,
    find_socket_path,
    prepare_socket_dir,
    socket_path_candidates,
)
from clagd.errors import StoreError
from clagd.protocol import private_runtime_dir, resolve_socket

QUERY_RESULT = {
    "memories": [
        {
            "id": "m-0123456789abcdef",
            "content": "The user prefers metric units",
            "cluster_id": "c-00aa11bb",
            "cluster_name": "user preferences",
            "score": 3.5,
            "created_at": "2026-01-02T03:04:05Z",
            "metadata": {"source": "chat"},
        }
    ],
    "clusters": [{"id": "c-00aa11bb", "name": "user preferences", "score": 7.25}],
    "context": "## user preferences\n- The user prefers metric units",
    "tokens": 12,
}


PONG = {"pong": True, "pid": 4242, "store": "/home/u/memory"}
STATUS = {"store": "/home/u/memory", "head": None, "counts": {"memories": 1, "clusters": 1}}
# a result of the shape docs/protocol.md gives, per op
REPLIES: dict[str, Any] = {
    "add": {"batch": "b-1", "added": 1, "ids": ["m-0123456789abcdef"], "duplicates": 0},
    "clusters": {"clusters": [{"id": "c-00aa11bb", "name": "units", "size": 2}], "unsorted": 0},
    "log": {"entries": [{"commit": "ab" * 20, "date": "2026", "subject": "s", "kind": "ingest"}]},
    "revert": {"reverted": ["ab" * 20], "commits": ["cd" * 20], "head": "cd" * 20},
    "recluster": {"status": "accepted", "session_id": "s-1", "commits": ["ef" * 20]},
    "archive": {"dry_run": True, "clusters": [], "names": [], "commit": None},
    "round": {"rounds_since_session": 3},
}


class FakeDaemon:
    """A small JSON-lines server speaking the clagd protocol, with canned handlers.

    `handlers[op](request) -> result` (raise `ClagdError` for an error reply). Special
    behaviours for tests: `close_after_reply` closes each connection after one reply (an idle
    timeout), `raw_reply` sends that line instead of a proper reply.
    """

    def __init__(self, path: Path, handlers: dict[str, Callable[[dict], Any]] | None = None):
        self.path = path
        self.handlers: dict[str, Callable[[dict], Any]] = {
            "ping": lambda req: PONG,
            "status": lambda req: STATUS,
            "query": lambda req: QUERY_RESULT,
        }
        self.handlers.update(handlers or {})
        self.requests: list[dict] = []
        self.connections = 0
        self.close_after_reply = False
        self.drop_ops: set[str] = set()
        self.raw_reply: bytes | None = None
        self._lock = threading.Lock()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        self._listener.listen(16)
        self._conns: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._stopping = False
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if self._stopping:
                    conn.close()
                    return
                self.connections += 1
                self._conns.append(conn)
                t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
                self._threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as rfile:
            for line in rfile:
                req = json.loads(line)
                with self._lock:
                    self.requests.append(req)
                if req.get("op") in self.drop_ops:
                    return
                reply = self._reply(req)
                try:
                    conn.sendall(reply)
                except OSError:
                    return
                if self.close_after_reply:
                    return

    def _reply(self, req: dict) -> bytes:
        if self.raw_reply is not None:
            return self.raw_reply
        handler = self.handlers.get(req.get("op"))
        if handler is None:
            msg = {
                "id": req.get("id"),
                "ok": False,
                "error": {"code": "bad_request", "message": f"unknown op {req.get('op')!r}"},
            }
        else:
            try:
                msg = {"id": req.get("id"), "ok": True, "result": handler(req)}
            except errors.ClagdError as exc:
                msg = {
                    "id": req.get("id"),
                    "ok": False,
                    "error": {"code": exc.code, "message": str(exc)},
                }
        return (json.dumps(msg) + "\n").encode()

    def ops(self) -> list[str]:
        with self._lock:
            return [r["op"] for r in self.requests]

    def close(self) -> None:
        with self._lock:
            self._stopping = True
            conns = list(self._conns)
        self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._acceptor.join(5)
        for t in self._threads:
            t.join(5)


def short_dir(tmp_path: Path) -> Path:
    """tmp_path, or a short directory when tmp_path is too long for an AF_UNIX address."""
    if len(str(tmp_path)) < 80:
        return tmp_path
    return Path(tempfile.mkdtemp(prefix="clagd-t-"))


@pytest.fixture
def sock_dir(tmp_path: Path) -> Iterator[Path]:
    d = short_dir(tmp_path)
    yield d
    if d != tmp_path:
        for p in d.iterdir():
            p.unlink()
        d.rmdir()


@pytest.fixture
def daemon(sock_dir: Path) -> Iterator[FakeDaemon]:
    d = FakeDaemon(sock_dir / "clagd.sock")
    yield d
    d.close()


def test_ping_and_status_round_trip(daemon: FakeDaemon) -> None:
    with Client(daemon.path) as c:
        assert not c.connected
        assert c.ping() == Pong(True, 4242, "/home/u/memory")
        assert c.connected
        assert c.status().raw == STATUS
    assert not c.connected
    assert [r["id"] for r in daemon.requests] == [1, 2]
    assert daemon.connections == 1


def test_query_returns_typed_result(daemon: FakeDaemon) -> None:
    with Client(daemon.path) as c:
        res = c.query("which units?", max_memories=3)
    assert isinstance(res, QueryResult)
    assert res.tokens == 12
    assert res.context.startswith("## user preferences")
    assert res.memories == [
        MemoryHit(
            id="m-0123456789abcdef",
            content="The user prefers metric units",
            cluster_id="c-00aa11bb",
            cluster_name="user preferences",
            score=3.5,
            created_at="2026-01-02T03:04:05Z",
            metadata={"source": "chat"},
        )
    ]
    assert res.clusters == [ClusterScore(id="c-00aa11bb", name="user preferences", score=7.25)]
    assert res.to_dict()["memories"][0]["cluster_name"] == "user preferences"
    # None parameters are left out of the request
    assert daemon.requests[-1] == {
        "id": 1,
        "op": "query",
        "text": "which units?",
        "max_memories": 3,
    }


def test_request_shapes_of_every_op(daemon: FakeDaemon) -> None:
    for op, result in REPLIES.items():
        daemon.handlers[op] = lambda req, result=result: result
    daemon.handlers["custom"] = lambda req: {"echo": req}
    with Client(daemon.path) as c:
        c.add("one", metadata={"importance": 0.3}, created_at="2026-01-01T00:00:00Z")
        c.add("two")
        c.add_many([{"content": "three"}, {"content": "four", "metadata": {"a": 1}}])
        c.query("q", token_budget=50, include_archive=True)
        c.clusters()
        c.clusters(include_archive=True)
        c.log(5)
        c.revert("abc123")
        c.recluster()
        c.recluster(wait=False)
        c.archive(dry_run=True)
        c.round(3)
        assert c.call("custom", x=1, y=None) == {"echo": {"id": 13, "op": "custom", "x": 1}}
    strip = [{k: v for k, v in r.items() if k != "id"} for r in daemon.requests]
    assert strip == [
        {
            "op": "add",
            "items": [
                {
                    "content": "one",
                    "metadata": {"importance": 0.3},
                    "created_at": "2026-01-01T00:00:00Z",
                }
            ],
        },
        {"op": "add", "items": [{"content": "two"}]},
        {"op": "add", "items": [{"content": "three"}, {"content": "four", "metadata": {"a": 1}}]},
        {"op": "query", "text": "q", "token_budget": 50, "include_archive": True},
        {"op": "clusters"},
        {"op": "clusters", "include_archive": True},
        {"op": "log", "n": 5},
        {"op": "revert", "ref": "abc123"},
        {"op": "recluster", "wait": True},
        {"op": "recluster", "wait": False},
        {"op": "archive", "dry_run": True},
        {"op": "round", "n": 3},
        {"op": "custom", "x": 1},
    ]


def test_error_reply_becomes_client_error(daemon: FakeDaemon) -> None:
    def not_found(req: dict) -> Any:
        raise errors.NotFound(f"no commit {req['ref']}")

    daemon.handlers["revert"] = not_found
    with Client(daemon.path) as c:
        with pytest.raises(ClientError) as info:
            c.revert("deadbeef")
        assert info.value.code == "not_found"
        assert info.value.message == "no commit deadbeef"
        # the connection stays usable after an error reply
        assert c.ping().pong is True
        with pytest.raises(ClientError, match="unknown op"):
            c.call("nope")
    assert daemon.connections == 1


def test_missing_socket_is_daemon_not_running(sock_dir: Path) -> None:
    with Client(sock_dir / "absent.sock") as c, pytest.raises(DaemonNotRunning) as info:
        c.status()
    err = info.value
    assert isinstance(err, errors.DaemonNotRunning) and isinstance(err, ClientError)
    assert err.code == "not_running"
    assert "clagd run <store>" in str(err)
    assert "no socket file" in str(err)


def test_stale_socket_file_is_daemon_not_running(sock_dir: Path) -> None:
    path = sock_dir / "stale.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()  # the file stays, nobody listens: ECONNREFUSED
    assert path.exists()
    with Client(path) as c, pytest.raises(DaemonNotRunning, match="connection refused"):
        c.ping()


def test_reconnects_after_idle_close(daemon: FakeDaemon) -> None:
    daemon.close_after_reply = True
    with Client(daemon.path) as c:
        assert c.ping().pid == 4242
        assert c.status().counts.memories == 1
        assert c.query("x").tokens == 12
    assert daemon.ops() == ["ping", "status", "query"]
    assert daemon.connections == 3


def test_write_op_is_not_resent_when_connection_drops_mid_request(daemon: FakeDaemon) -> None:
    daemon.handlers["revert"] = lambda req: REPLIES["revert"]
    daemon.drop_ops = {"revert"}
    with Client(daemon.path) as c:
        c.ping()
        with pytest.raises(ClientError) as info:
            c.revert("abc")
        assert info.value.code == "closed"
        assert not c.connected
        daemon.drop_ops = set()
        assert c.ping().pong is True  # a fresh connection
    assert daemon.ops() == ["ping", "revert", "ping"]


def test_bad_json_reply_is_protocol_error(daemon: FakeDaemon) -> None:
    daemon.raw_reply = b"this is not json\n"
    with Client(daemon.path) as c, pytest.raises(ProtocolError, match="not JSON"):
        c.ping()


def test_mismatched_id_is_protocol_error(daemon: FakeDaemon) -> None:
    daemon.raw_reply = b'{"id": 999, "ok": true, "result": {}}\n'
    with Client(daemon.path) as c, pytest.raises(ProtocolError, match="does not match"):
        c.ping()
    assert not c.connected


def test_connection_level_refusal_is_client_error(daemon: FakeDaemon) -> None:
    daemon.raw_reply = (
        b'{"id": null, "ok": false, "error": {"code": "forbidden", "message": "uid 7 may not"}}\n'
    )
    with Client(daemon.path) as c:
        with pytest.raises(ClientError) as info:
            c.ping()
        assert info.value.code == "forbidden"
        assert not c.connected


def test_reply_without_ok_is_protocol_error(daemon: FakeDaemon) -> None:
    daemon.raw_reply = b'{"id": 1, "result": {}}\n'
    with Client(daemon.path) as c, pytest.raises(ProtocolError):
        c.ping()


def test_malformed_query_result_is_protocol_error(daemon: FakeDaemon) -> None:
    daemon.handlers["query"] = lambda req: {"memories": [{"content": "no id"}]}
    with Client(daemon.path) as c, pytest.raises(ProtocolError, match="malformed"):
        c.query("x")


def test_timeout_drops_connection_and_recovers(daemon: FakeDaemon) -> None:
    release = threading.Event()
    daemon.handlers["recluster"] = lambda req: release.wait(10) and REPLIES["recluster"]
    with Client(daemon.path, timeout=0.2) as c:
        with pytest.raises(DaemonTimeout, match="did not answer"):
            c.recluster(timeout=0.2)
        assert not c.connected
        release.set()
        assert c.ping().pong is True  # never reads the late reply of the old request
    assert daemon.connections == 2


def test_archive_waits_longer_than_the_clients_timeout(daemon: FakeDaemon) -> None:
    """The archive job's slices give way to writes, so under a client writing back to back
    it takes minutes: `archive` waits as long as a session may, not the client's
    timeout (a `log` as slow times out)."""

    def slow(req: dict, result: Any) -> Any:
        time.sleep(0.6)
        return result

    daemon.handlers["archive"] = lambda req: slow(req, REPLIES["archive"])
    daemon.handlers["log"] = lambda req: slow(req, REPLIES["log"])
    with Client(daemon.path, timeout=0.2) as c:
        assert c.archive(dry_run=True).dry_run is True
        with pytest.raises(DaemonTimeout, match="did not answer"):
            c.log(5)


def test_client_is_safe_to_share_between_threads(daemon: FakeDaemon) -> None:
    daemon.handlers["echo"] = lambda req: {"n": req["n"]}
    results: dict[int, Any] = {}
    with Client(daemon.path) as c:

        def work(k: int) -> None:
            for i in range(20):
                n = k * 100 + i
                results[n] = c.call("echo", n=n)

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    assert results == {n: {"n": n} for n in results} and len(results) == 80


def test_default_socket_path_in_store(tmp_path: Path) -> None:
    store = tmp_path / "mem"
    assert default_socket_path(store) == store.resolve() / ".clagd" / "clagd.sock"
    assert socket_path_candidates(store) == [default_socket_path(store)]


def test_long_store_path_falls_back_to_a_private_runtime_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / ("x" * 60) / ("deep-store-name-" * 4)
    path = default_socket_path(store)
    assert path.parent == private_runtime_dir() and not path.is_relative_to("/tmp")
    assert path.name.startswith("deep-store-name-") and path.suffix == ".sock"
    assert len(os.fsencode(str(path))) <= MAX_SOCKET_PATH
    assert default_socket_path(Path(os.path.relpath(store))) == path
    assert default_socket_path(store.with_name("other")) != path
    # the same in every environment: a cron job or sudo without XDG_RUNTIME_DIR finds it
    for runtime in (str(tmp_path), "/run/user/1234", None):
        if runtime is None:
            monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
        else:
            monkeypatch.setenv("XDG_RUNTIME_DIR", runtime)
        assert socket_path_candidates(store) == [path] == [find_socket_path(store)]
        assert resolve_socket(store) == path == resolve_socket(store, binding=True)


def test_runtime_directory_is_used_only_when_private(tmp_path: Path) -> None:
    uid = os.getuid()
    runtime = tmp_path / "user" / str(uid)
    runtime.mkdir(parents=True, mode=0o700)
    assert private_runtime_dir(uid, tmp_path / "user") == runtime / "clagd"
    runtime.chmod(0o777)  # anyone could plant a socket there: the home directory instead
    assert private_runtime_dir(uid, tmp_path / "user") != runtime / "clagd"
    runtime.chmod(0o700)
    if uid == 0:
        os.chown(runtime, 65534, -1)  # another user's
        assert private_runtime_dir(uid, tmp_path / "user") != runtime / "clagd"
    assert private_runtime_dir(uid, tmp_path / "missing") != runtime / "clagd"


def test_prepare_socket_dir_makes_private_directory(tmp_path: Path) -> None:
    target = tmp_path / "run" / "clagd" / "s.sock"
    prepare_socket_dir(target)
    mode = stat.S_IMODE(target.parent.stat().st_mode)
    assert mode == 0o700
    store_sock = tmp_path / "store" / ".clagd" / "clagd.sock"
    prepare_socket_dir(store_sock)
    assert store_sock.parent.is_dir()


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777])
def test_prepare_socket_dir_refuses_a_directory_others_may_write(tmp_path: Path, mode: int) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    with pytest.raises(StoreError, match="other users may write there"):
        prepare_socket_dir(shared / "s.sock")
    with pytest.raises(StoreError, match="^/tmp: other users may write there"):
        prepare_socket_dir(Path("/tmp/clagd-test.sock"))  # the sticky /tmp itself
    assert not Path("/tmp/clagd-test.sock").exists()


def test_prepare_socket_dir_refuses_another_users_directory(tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to give a directory to another uid")
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(StoreError, match="owned by uid 65534.*not by us"):
        prepare_socket_dir(theirs / "s.sock")


def test_for_store_uses_default_socket(tmp_path: Path) -> None:
    store = tmp_path / "s"
    c = Client.for_store(store, timeout=1.0)
    assert c.socket_path == default_socket_path(store)
    assert c.timeout == 1.0


def test_every_op_returns_its_typed_result(daemon: FakeDaemon) -> None:
    """Each op's result is its dataclass (clagd.replies), the JSON object kept in `raw` and
    readable as before (`result["ids"]`); a result without a field its op always sends is
    a ProtocolError naming the op."""
    for op, result in REPLIES.items():
        daemon.handlers[op] = lambda req, result=result: {**result, "newer_field": 1}
    with Client(daemon.path) as c:
        added = c.add("one")
        assert isinstance(added, Added) and added.ids == ["m-0123456789abcdef"]
        assert added.skipped == 0 and added["ids"] == added.ids and "newer_field" in added
        assert added.raw["newer_field"] == 1 and added.get("commit") is None
        assert c.clusters().clusters[0] == ClusterInfo("c-00aa11bb", "units", size=2)
        entry = c.log(1).entries[0]
        assert isinstance(entry, LogEntry) and entry.kind == "ingest" and entry.session is None
        assert c.revert("x").head == "cd" * 20
        session = c.recluster()
        assert isinstance(session, Session) and session.status == "accepted"
        assert c.archive(dry_run=True).dry_run is True
        assert isinstance(c.round(3), Rounds) and c.round(3).rounds_since_session == 3
        status = c.status()
        assert isinstance(status, Status) and isinstance(status.counts, Counts)
        assert status.counts.archived_clusters == 0 and status.backend is None
        assert isinstance(c.ping(), Pong)
        daemon.handlers["add"] = lambda req: {"batch": "b-2", "added": 1}
        with pytest.raises(ProtocolError, match="malformed add result.*ids"):
            c.add("two")
