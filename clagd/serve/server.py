"""The Unix socket server: JSON lines, one request per line, one reply per line.

Each connection gets a thread. The peer's uid is checked with SO_PEERCRED; requests are
limited in size; an idle or too slow client is dropped after the read timeout. A bad
request gets an error reply; nothing a client sends can stop the server.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clagd.engine.core import Engine
from clagd.errors import BadRequest, ClagdError, GitFailed, StoreError
from clagd.protocol import (
    ListParams,
    QueryParams,
    error_reply,
    fits_af_unix,
    flag,
    ok_reply,
    peer_uid,
    prepare_socket_dir,
    request_scopes,
)

log = logging.getLogger("clagd.server")

Handler = Callable[[dict[str, Any]], Any]
# what clients written for mem0 or LangGraph send for "whose memory": refused, never ignored
OWNER_KEYS = frozenset({"user_id", "agent_id", "run_id", "namespace"})


class Dispatcher:
    """Maps ops to callables taking the request's parameters."""

    def __init__(self) -> None:
        self.ops: dict[str, Handler] = {}

    def op(self, name: str, fn: Handler) -> None:
        self.ops[name] = fn

    def reply(self, req: Any) -> dict[str, Any] | bytes:
        """The reply to send: `handle`'s, or one already encoded (`encode_reply`)."""
        return self.handle(req)

    def handle(self, req: Any) -> dict[str, Any]:
        rid = req.get("id") if isinstance(req, dict) else None
        try:
            if not isinstance(req, dict):
                raise BadRequest("a request must be a JSON object")
            op = req.get("op")
            if not isinstance(op, str):
                raise BadRequest("a request needs 'op' (a string)")
            fn = self.ops.get(op)
            if fn is None:
                raise ClagdError(
                    f"unknown op {op!r}; known: {', '.join(sorted(self.ops))}", "unknown_op"
                )
            params = {k: v for k, v in req.items() if k not in ("id", "op") and v is not None}
            owner = sorted(OWNER_KEYS & params.keys())
            if owner:  # ignored, it would put the memory in the default scope
                raise BadRequest(
                    f"unknown parameter '{owner[0]}': whose memory it is goes in 'scope' "
                    "(a scope name: a user, agent or run)"
                )
            if "scope" in params or "scopes" in params:
                # a bad scope name is refused on every op, also on the store-wide ones
                # (ping, round, sync) that do not read it
                request_scopes(params)
            return ok_reply(rid, fn(params))
        except GitFailed as exc:  # the store's git failed: logged whole, answered in a line
            log.error("op %r: %s\n%s", req.get("op"), exc, exc.stderr.strip())
            return error_reply(rid, exc.code, str(exc))
        except ClagdError as exc:
            return error_reply(rid, exc.code, str(exc))
        except TypeError as exc:  # wrong parameter names or types
            return error_reply(rid, "bad_request", str(exc))
        except Exception as exc:  # noqa: BLE001 - a bug must not kill the connection thread
            log.exception("op %r failed", req.get("op"))
            return error_reply(rid, "internal", f"{type(exc).__name__}: {exc}")


def encode_reply(obj: dict[str, Any]) -> bytes:
    """One reply line: strict JSON (NaN and infinities as null), UTF-8, newline."""
    try:
        text = json.dumps(obj, ensure_ascii=False, default=str, allow_nan=False)
    except ValueError:
        text = json.dumps(_strict(obj), ensure_ascii=False, default=str)
    return text.encode(errors="replace") + b"\n"


class _LineReader:
    """Request lines from the connection, each read bounded by what is left of the time
    allowed for the whole line: a client sending one byte every few seconds cannot hold a
    slot forever (a per-read timeout would restart with each byte). What it has read past
    the last line can be taken: a connection handed to a query process takes it along."""

    def __init__(self, sock: socket.socket, prefix: bytes = b"") -> None:
        self.sock = sock
        self.buf = bytearray(prefix)
        self.deadline: float | None = None

    def _recv(self) -> bytes:
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the request did not arrive in time")
            self.sock.settimeout(left)
        return self.sock.recv(65536)

    def readline(self, size: int) -> bytes:
        """Up to and including the next newline, or `size` bytes, or what is left at EOF."""
        scan = 0
        while True:
            i = self.buf.find(b"\n", scan, size)
            if i >= 0:
                n = i + 1
                break
            if len(self.buf) >= size:
                n = size
                break
            scan = len(self.buf)
            chunk = self._recv()
            if not chunk:
                n = len(self.buf)
                break
            self.buf += chunk
        line = bytes(self.buf[:n])
        del self.buf[:n]
        return line


def _strict(obj: Any) -> Any:
    """NaN and infinities (from a hand-edited file) as null: replies are strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_strict(v) for v in obj]
    return obj


class _ConnHandler(socketserver.StreamRequestHandler):
    server: SocketServer

    def setup(self) -> None:
        super().setup()
        self.request.settimeout(self.server.read_timeout)
        self._reader = _LineReader(self.request, self.server.prefixes.pop(self.request, b""))

    def _send(self, obj: dict[str, Any] | bytes) -> bool:
        data = obj if isinstance(obj, bytes) else encode_reply(obj)
        try:
            self.wfile.write(data)
            self.wfile.flush()
            return True
        except OSError:
            return False

    def _linger(self) -> None:
        """Close so that a reply just sent is read: closing a Unix socket with the client's
        request still unread resets the connection, and the client sees ECONNRESET instead
        of the reply. Half-close, then discard what the client sent (briefly, bounded)."""
        try:
            self.wfile.flush()
            self.request.shutdown(socket.SHUT_WR)
            self.request.settimeout(0.5)
            budget = 8 << 20
            while budget > 0:
                chunk = self.request.recv(65536)
                if not chunk:
                    break
                budget -= len(chunk)
        except OSError:
            pass

    def handle(self) -> None:
        srv = self.server
        uid = peer_uid(self.request)
        if uid is not None and uid not in srv.allowed_uids:
            log.warning("refused a client of uid %s", uid)
            self._send(error_reply(None, "forbidden", f"uid {uid} may not use this daemon"))
            self._linger()
            return
        with srv.count_lock:
            srv.active += 1
            over = srv.active > srv.max_clients
        try:
            if over:
                self._send(error_reply(None, "busy", "too many clients; try again"))
                self._linger()
                return
            self._serve()
        finally:
            with srv.count_lock:
                srv.active -= 1

    def _serve(self) -> None:
        limit = self.server.max_request_bytes
        srv = self.server
        while not srv.closing:
            hand_off = srv.hand_off
            if hand_off is not None and hand_off(self.request, bytes(self._reader.buf)):
                srv.handed_off.add(self.request)  # a query process serves it from here on
                return
            # the next request line must be complete within read_timeout, however it trickles
            self._reader.deadline = time.monotonic() + srv.read_timeout
            try:
                line = self._reader.readline(limit + 1)
            except TimeoutError:
                return
            except OSError:
                return
            if not line:
                return
            if len(line) > limit and not line.endswith(b"\n"):
                self._send(error_reply(None, "too_large", too_large_message(limit)))
                self._linger()
                return  # the rest of the line cannot be resynchronised
            if not line.strip():
                continue
            try:
                req = json.loads(line)
            except (ValueError, RecursionError) as exc:
                if not self._send(error_reply(None, "bad_json", f"not JSON: {exc}")):
                    return
                continue
            if not self._send(self.server.dispatcher.reply(req)):
                return


class SocketServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    allow_reuse_address = False
    request_queue_size = 512  # connect() fails with EAGAIN when the backlog is full

    def __init__(
        self,
        path: Path | None,
        dispatcher: Dispatcher,
        max_request_bytes: int = 1_048_576,
        read_timeout: float = 30.0,
        max_clients: int = 256,
        inherited: socket.socket | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.max_request_bytes = max_request_bytes
        self.read_timeout = read_timeout
        self.max_clients = max_clients
        self.allowed_uids = {os.getuid()}
        self.active = 0
        self.count_lock = threading.Lock()
        self.closing = False
        # a connection to pass on between requests (to a query process; True: passed)
        self.hand_off: Callable[[socket.socket, bytes], bool] | None = None
        self.handed_off: set[socket.socket] = set()
        # what the previous holder of a passed connection had read of it already
        self.prefixes: dict[socket.socket, bytes] = {}
        self.owns_path = inherited is None
        if inherited is not None:
            socketserver.BaseServer.__init__(self, "", _ConnHandler)
            self.socket = inherited
            self.server_address = inherited.getsockname()
            self.path = (
                Path(self.server_address)
                if isinstance(self.server_address, str) and self.server_address
                else None
            )
            return
        assert path is not None
        self.path = Path(path)
        if not fits_af_unix(self.path):
            raise StoreError(
                f"socket path too long for AF_UNIX ({len(os.fsencode(str(self.path)))} bytes): "
                f"{self.path}"
            )
        prepare_socket_dir(self.path)
        _remove_stale(self.path)
        old = os.umask(0o177)
        try:
            super().__init__(str(self.path), _ConnHandler)
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)

    def shutdown_request(self, request: Any) -> None:
        """A connection passed on is only closed here (a shutdown would end it for the
        process that serves it now)."""
        if request in self.handed_off:
            self.handed_off.discard(request)
            self.close_request(request)
            return
        super().shutdown_request(request)

    def server_close(self) -> None:
        self.closing = True
        super().server_close()
        if self.owns_path and self.path is not None:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass


def internal_server(
    dispatcher: Dispatcher, max_request_bytes: int, read_timeout: float
) -> SocketServer:
    """A server on a fresh Linux abstract socket (no file: nothing in the store or the
    runtime folder to clean up or to be deleted by a person's `git clean`), for the query
    processes to hand the daemon every request they do not answer themselves. Only the
    daemon's own uid may use it, like the public socket."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(f"\0clagd-{os.getpid()}-{os.urandom(6).hex()}")
    sock.listen(128)
    return SocketServer(
        None,
        dispatcher,
        max_request_bytes=max_request_bytes,
        read_timeout=read_timeout,
        max_clients=4096,
        inherited=sock,
    )


def too_large_message(limit: int) -> str:
    return (
        f"request over {limit} bytes, the limit (server.max_request_bytes in clagd.yaml): "
        "send fewer or smaller memories per request (clagd import --batch N), or raise "
        "server.max_request_bytes"
    )


def _remove_stale(path: Path) -> None:
    """A socket file left by a killed daemon is removed; a live one is an error."""
    if not os.path.lexists(path):
        return
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1.0)
    try:
        s.connect(str(path))
    except OSError:
        os.unlink(path)
        log.info("removed a stale socket %s", path)
        return
    finally:
        s.close()
    raise StoreError(f"another daemon is serving on {path}")


def build_dispatcher(engine: Engine, extra: dict[str, Handler] | None = None) -> Dispatcher:
    """The ops every daemon serves, on `engine`; `extra` adds or replaces ops (the daemon's
    `recluster`, which can return before the session ends)."""
    d = Dispatcher()
    d.op("ping", lambda p: {"pong": True, "pid": os.getpid(), "store": str(engine.root)})
    d.op("status", lambda p: engine.status(p.get("scope")))
    d.op("add", lambda p: _add(engine, p))
    d.op("query", lambda p: engine.run_query(QueryParams.from_request(p)))
    d.op("get", lambda p: engine.get(p.get("memory_id"), request_scopes(p)))
    d.op("list", lambda p: engine.list_memories(ListParams.from_request(p)))
    d.op(
        "update",
        lambda p: engine.update(p.get("memory_id"), _update_item(p), scope=p.get("scope")),
    )
    d.op(
        "clusters",
        lambda p: engine.clusters(include_archive=flag(p, "include_archive"), scopes=_seen(p)),
    )
    d.op("log", lambda p: engine.log(p.get("n", 20), p.get("scope")))
    d.op("revert", lambda p: engine.revert(_str(p, "ref"), p.get("scope")))
    d.op(
        "archive",
        lambda p: engine.archive(dry_run=flag(p, "dry_run"), scope=p.get("scope")),
    )
    d.op(
        "forget",
        lambda p: engine.forget(
            _ids(p),
            _opt_str(p, "match"),
            _opt_str(p, "scope"),
            purge=flag(p, "purge"),
            force_remote=flag(p, "force_remote"),
        ),
    )
    d.op("round", lambda p: engine.round(p.get("n", 1)))
    for name, fn in (extra or {}).items():
        d.op(name, fn)
    return d


def _seen(p: dict[str, Any]) -> frozenset[str] | None:
    """The scopes an op that lists (clusters) sees: those the request names, or every
    scope when it names none (the store's owner looking at the whole store)."""
    if p.get("scope") is None and not p.get("scopes"):
        return None
    return request_scopes(p)


def _str(p: dict[str, Any], key: str) -> str:
    v = p.get(key)
    if not isinstance(v, str):
        raise BadRequest(f"'{key}' must be a string")
    return v


def _opt_str(p: dict[str, Any], key: str) -> str | None:
    v = p.get(key)
    if v is not None and not isinstance(v, str):
        raise BadRequest(f"'{key}' must be a string")
    return v


def _ids(p: dict[str, Any]) -> list[str] | None:
    v = p.get("ids")
    if v is None:
        return None
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise BadRequest("'ids' must be a list of memory ids (strings)")
    return list(v)


ADD_SOURCES = ("socket", "import")  # what a client may name as where its memories came from


def _source(p: dict[str, Any]) -> str:
    source = p.get("source", "socket")
    if source not in ADD_SOURCES:
        raise BadRequest(f"'source' must be one of {', '.join(ADD_SOURCES)}")
    return str(source)


def _add(engine: Engine, p: dict[str, Any]) -> object:
    """`add`: one memory (`content`), several (`items`), or chat messages (`messages`, one
    memory per turn of the roles configured; `metadata` is then every turn's)."""
    scope = p.get("scope")
    if "messages" in p:
        return engine.add_messages(p["messages"], p.get("metadata"), _source(p), scope)
    return engine.add(_items(p), source=_source(p), scope=scope)


def _update_item(p: dict[str, Any]) -> dict[str, Any]:
    if "content" not in p:
        raise BadRequest("'update' needs 'memory_id' and 'content' (the new text)")
    return {k: v for k, v in p.items() if k in ("content", "metadata", "created_at")}


def _items(p: dict[str, Any]) -> list[Any]:
    if "items" in p:
        return p["items"] if isinstance(p["items"], list) else [p["items"]]
    if "content" in p:
        return [{k: v for k, v in p.items() if k in ("content", "metadata", "created_at")}]
    raise BadRequest("'add' needs 'content', 'items' or 'messages'")
