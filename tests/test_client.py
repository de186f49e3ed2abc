"""clagd.client against a real JSON-lines Unix socket server running in a thread."""

from __future__ import annotations

import json
import os
import socket
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from clagd import errors
from clagd.client import (
    MAX_SOCKET_PATH,
    Client,
    ClientError,
    ClusterScore,
    DaemonNotRunning,
    DaemonTimeout,
    MemoryHit,
    ProtocolError,
    QueryResult,
    default_socket_path,
    find_socket_path,
    prepare_socket_dir,
    socket_path_candidates,
)

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


class FakeDaemon:
    """A small JSON-lines server speaking the clagd protocol, with canned handlers.

    `handlers[op](request) -> result` (raise `ClagdError` for an error reply). Special
    behaviours for tests: `close_after_reply` closes each connection after one reply (an idle
    timeout), `raw_reply` sends that line instead of a proper reply.
    """

    def __init__(self, path: Path, handlers: dict[str, Callable[[dict], Any]] | None = None):
        self.path = path
        self.handlers: dict[str, Callable[[dict], Any]] = {
            "ping": lambda req: {"pong": True},
            "status": lambda req: {"memories": 1, "clusters": 1},
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
        assert c.ping() == {"pong": True}
        assert c.connected
        assert c.status() == {"memories": 1, "clusters": 1}
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
    for op in ("add", "clusters", "log", "revert", "recluster", "archive", "round", "custom"):
        daemon.handlers[op] = lambda req: {"echo": req}
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
        assert c.ping() == {"pong": True}
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
        assert c.ping() == {"pong": True}
        assert c.status() == {"memories": 1, "clusters": 1}
        assert c.query("x").tokens == 12
    assert daemon.ops() == ["ping", "status", "query"]
    assert daemon.connections == 3


def test_write_op_is_not_resent_when_connection_drops_mid_request(daemon: FakeDaemon) -> None:
    daemon.handlers["revert"] = lambda req: {"ok": True}
    daemon.drop_ops = {"revert"}
    with Client(daemon.path) as c:
        c.ping()
        with pytest.raises(ClientError) as info:
            c.revert("abc")
        assert info.value.code == "closed"
        assert not c.connected
        daemon.drop_ops = set()
        assert c.ping() == {"pong": True}  # a fresh connection
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
    daemon.handlers["recluster"] = lambda req: release.wait(10) and {"done": True}
    with Client(daemon.path, timeout=0.2) as c:
        with pytest.raises(DaemonTimeout, match="did not answer"):
            c.recluster(timeout=0.2)
        assert not c.connected
        release.set()
        assert c.ping() == {"pong": True}  # never reads the late reply of the old request
    assert daemon.connections == 2


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


def test_long_store_path_falls_back_to_short_deterministic_path(tmp_path: Path) -> None:
    store = tmp_path / ("x" * 60) / ("deep-store-name-" * 4)
    env = {"XDG_RUNTIME_DIR": "/run/user/1234"}
    path = default_socket_path(store, env)
    assert path.parent == Path("/run/user/1234/clagd")
    assert path.name.startswith("deep-store-name-")
    assert path.suffix == ".sock"
    assert len(os.fsencode(str(path))) <= MAX_SOCKET_PATH
    assert default_socket_path(store, env) == path
    assert default_socket_path(Path(os.path.relpath(store)), env) == path
    other = default_socket_path(store.with_name("other"), env)
    assert other != path
    no_xdg = default_socket_path(store, {})
    assert no_xdg.parent == Path(f"/tmp/clagd-{os.getuid()}")
    assert no_xdg.name == path.name
    assert socket_path_candidates(store, env) == [path, no_xdg]


def test_find_socket_path_prefers_existing_candidate(tmp_path: Path) -> None:
    store = tmp_path / ("y" * 120)
    runtime = tmp_path / "run"
    runtime.mkdir()
    env = {"XDG_RUNTIME_DIR": str(runtime)}
    first, second = socket_path_candidates(store, env)
    assert find_socket_path(store, env) == first
    # a daemon started without XDG_RUNTIME_DIR bound the /tmp fallback: the client finds it
    prepare_socket_dir(second)
    second.touch()
    try:
        assert find_socket_path(store, env) == second
    finally:
        second.unlink()


def test_prepare_socket_dir_makes_private_directory(tmp_path: Path) -> None:
    target = tmp_path / "run" / "clagd" / "s.sock"
    prepare_socket_dir(target)
    mode = stat.S_IMODE(target.parent.stat().st_mode)
    assert mode == 0o700
    target.parent.chmod(0o777)
    prepare_socket_dir(target)
    assert stat.S_IMODE(target.parent.stat().st_mode) == 0o700
    store_sock = tmp_path / "store" / ".clagd" / "clagd.sock"
    prepare_socket_dir(store_sock)
    assert store_sock.parent.is_dir()


def test_for_store_uses_default_socket(tmp_path: Path) -> None:
    store = tmp_path / "s"
    c = Client.for_store(store, timeout=1.0)
    assert c.socket_path == default_socket_path(store)
    assert c.timeout == 1.0
