"""Python client of the clagd socket protocol: all a Python agent needs to talk to the daemon.

The protocol is one JSON object per line, each way. A request is
``{"id": n, "op": "...", ...params}``; the reply carries the same id and either
``{"ok": true, "result": {...}}`` or ``{"ok": false, "error": {"code": "...", "message": "..."}}``.

A five-line agent loop::

    from clagd.client import Client

    with Client.for_store("./memory") as mem:
        mem.add("The user prefers metric units", metadata={"source": "chat"})
        hits = mem.query("which units does the user like?")
        prompt = hits.context + "\\n\\n" + question

`Client` connects lazily on the first call and reconnects after the daemon closed an idle
connection, so one instance can live as long as the agent. It is safe to share between threads
(calls are serialized). `Client.for_store` finds the socket the way the daemon chose it
(`clagd.protocol.resolve_socket`: $CLAGD_SOCKET, `server.socket` in clagd.yaml, the default).
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import socket
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from clagd import errors
from clagd.protocol import (
    DEFAULT_LIST_LIMIT,
    IDEMPOTENT_OPS,
    MAX_REPLY_BYTES,
    MAX_SOCKET_PATH,
    QueryParams,
    default_socket_path,
    find_socket_path,
    peer_uid,
    prepare_socket_dir,
    resolve_socket,
    socket_path_candidates,
    store_owner,
    user_name,
)
from clagd.replies import (
    Added,
    Archived,
    ClusterInfo,
    ClusterList,
    Counts,
    FollowStatus,
    Forgotten,
    Log,
    LogEntry,
    MemoryList,
    MemoryRecord,
    Pong,
    Reply,
    Reverted,
    Rounds,
    Session,
    Status,
    Updated,
)
from clagd.scopes import DEFAULT_SCOPE, check_scope

__all__ = [
    "Client",
    "ClientError",
    "ClusterScore",
    "DaemonNotRunning",
    "DaemonTimeout",
    "MAX_SOCKET_PATH",
    "Added",
    "Archived",
    "ClusterInfo",
    "ClusterList",
    "Counts",
    "FollowStatus",
    "Forgotten",
    "Log",
    "LogEntry",
    "MemoryHit",
    "MemoryList",
    "MemoryRecord",
    "Pong",
    "ProtocolError",
    "QueryResult",
    "Reply",
    "Reverted",
    "Rounds",
    "Session",
    "Status",
    "Updated",
    "default_socket_path",
    "find_socket_path",
    "prepare_socket_dir",
    "resolve_socket",
    "socket_path_candidates",
]

RECLUSTER_TIMEOUT = 900.0


# --------------------------------------------------------------------------- errors


class ClientError(errors.ClagdError):
    """The daemon answered with an error, or could not be reached; `.code` says which."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message, code)


class DaemonNotRunning(errors.DaemonNotRunning, ClientError):
    """No daemon listens on the socket (file missing, or a stale file: connection refused)."""

    code = "not_running"


class DaemonTimeout(ClientError):
    """The daemon accepted the request but did not answer in time."""

    code = "timeout"


class ProtocolError(ClientError):
    """The reply was not a well-formed protocol message (bad JSON, wrong id, no result)."""

    code = "protocol"


# --------------------------------------------------------------------------- results


@dataclass
class MemoryHit:
    id: str
    content: str
    cluster_id: str | None
    cluster_name: str
    score: float
    created_at: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    scope: str = DEFAULT_SCOPE
    archived: bool = False  # found in the archive (`include_archive`)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MemoryHit:
        return cls(
            id=str(d["id"]),
            content=str(d.get("content", "")),
            cluster_id=d.get("cluster_id"),
            cluster_name=str(d.get("cluster_name") or ""),
            score=float(d.get("score") or 0.0),
            created_at=d.get("created_at"),
            metadata=dict(d.get("metadata") or {}),
            scope=str(d.get("scope") or DEFAULT_SCOPE),
            archived=d.get("archived") is True,
        )


@dataclass
class ClusterScore:
    id: str
    name: str
    score: float

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ClusterScore:
        return cls(id=str(d["id"]), name=str(d.get("name") or ""), score=float(d.get("score") or 0))


@dataclass
class QueryResult:
    """What `query` returns: the memories, the clusters they came from, and the context block
    to paste into a prompt (`tokens` is its estimated size)."""

    memories: list[MemoryHit]
    clusters: list[ClusterScore]
    context: str
    tokens: int
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    # archived clusters the query hit, on their way back to clusters/ (`thaw_on_hit`)
    thawing: list[str] = field(default_factory=list)
    took_ms: float = 0.0

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> QueryResult:
        try:
            return cls(
                memories=[MemoryHit.from_dict(m) for m in d.get("memories") or []],
                clusters=[ClusterScore.from_dict(c) for c in d.get("clusters") or []],
                context=str(d.get("context") or ""),
                tokens=int(d.get("tokens") or 0),
                raw=dict(d),
                thawing=[str(c) for c in d.get("thawing") or []],
                took_ms=float(d.get("took_ms") or 0.0),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed query result: {exc!r}") from None

    def to_dict(self) -> dict[str, Any]:
        return {
            "memories": [vars(m).copy() for m in self.memories],
            "clusters": [vars(c).copy() for c in self.clusters],
            "context": self.context,
            "tokens": self.tokens,
            "thawing": list(self.thawing),
            "took_ms": self.took_ms,
        }


# --------------------------------------------------------------------------- client


class Client:
    """A connection to one clagd daemon.

    Every method sends one request and waits for its reply; errors the daemon reports become
    `ClientError` (with the protocol `code`), an absent daemon `DaemonNotRunning`, a garbled
    reply `ProtocolError`, and a reply that does not come within `timeout` seconds
    `DaemonTimeout` (the connection is then dropped, since its reply stream is out of step).

    `scope`: the scope (`clagd.scopes`) every call that reads or writes memories works in
    unless it names one itself; None: the daemon's default scope.
    """

    def __init__(
        self,
        socket_path: str | os.PathLike[str],
        timeout: float | None = 30.0,
        owner: int | None = None,
        scope: str | None = None,
    ) -> None:
        self.scope = None if scope is None else check_scope(scope)
        self.socket_path = Path(socket_path)
        self.timeout = timeout
        # who may answer: the daemon's expected uid (the store's owner), ours, or root
        self.owner = os.getuid() if owner is None else owner
        self._sock: socket.socket | None = None
        self._buf = bytearray()
        self._ids = itertools.count(1)
        self._lock = threading.RLock()

    @classmethod
    def for_store(
        cls,
        store: str | os.PathLike[str],
        timeout: float | None = 30.0,
        scope: str | None = None,
    ) -> Client:
        """A client for the daemon that serves `store`: at $CLAGD_SOCKET when set, else at the
        `server.socket` of the store's clagd.yaml, else at its default socket (the one
        resolution the CLI and the daemon use, `protocol.resolve_socket`); only a daemon of
        the store's owner may answer. `scope`: as for `Client`."""
        return cls(resolve_socket(store), timeout=timeout, owner=store_owner(store), scope=scope)

    def _scope(self, scope: str | None) -> str | None:
        """The scope a call sends: its own, else the client's (None: the default)."""
        return self.scope if scope is None else check_scope(scope)

    # -- connection

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({str(self.socket_path)!r})"

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def connect(self) -> None:
        """Open the connection now (calls do it lazily); raises `DaemonNotRunning`."""
        with self._lock:
            if self._sock is None:
                self._sock = self._open()

    def close(self) -> None:
        with self._lock:
            sock, self._sock = self._sock, None
            self._buf.clear()
            if sock is not None:
                sock.close()

    def _open(self) -> socket.socket:
        path = str(self.socket_path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(path)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            sock.close()
            why = "no socket file" if isinstance(exc, FileNotFoundError) else "connection refused"
            raise DaemonNotRunning(
                f"clagd is not running at {path} ({why}); start it with `clagd run <store>`"
            ) from None
        except PermissionError:
            sock.close()
            raise ClientError(f"{path}: permission denied", "permission") from None
        except TimeoutError:
            sock.close()
            raise DaemonTimeout(f"{path}: connect timed out") from None
        except OSError as exc:
            sock.close()
            if exc.errno in (None, errno.ENAMETOOLONG, errno.EINVAL):
                why = exc.strerror or str(exc)
                raise ClientError(f"{path}: unusable socket path ({why})", "bad_socket") from None
            raise DaemonNotRunning(f"cannot reach clagd at {path}: {exc.strerror}") from None
        self._check_peer(sock)
        return sock

    def _check_peer(self, sock: socket.socket) -> None:
        """Before anything is sent: the process that answers must run as the store's owner
        (or as us, or root), or another user has put her socket where clagd's should be."""
        uid = peer_uid(sock)
        if uid is None or uid in (self.owner, os.getuid(), 0):
            return
        sock.close()
        raise ClientError(
            f"{self.socket_path} is answered by {user_name(uid)}, not by the store's owner "
            f"{user_name(self.owner)}: refusing to talk to it (another user's socket; remove "
            "it, or set server.socket to a path in a private directory)",
            "untrusted_peer",
        )

    # -- requests

    def call(self, op: str, /, **params: Any) -> Any:
        """Send `op` with `params` (None values are left out) and return the reply's result."""
        return self._slow_call(op, False, **params)

    def _slow_call(self, op: str, slow: bool, /, **params: Any) -> Any:
        """`call`, waiting as long as a session may (RECLUSTER_TIMEOUT) when `slow`."""
        timeout = max(self.timeout or 0.0, RECLUSTER_TIMEOUT) if slow else None
        return self.request(op, {k: v for k, v in params.items() if v is not None}, timeout)

    def request(
        self, op: str, params: Mapping[str, Any] | None = None, timeout: float | None = None
    ) -> Any:
        """Like `call`, with params as a mapping and a timeout for this request only."""
        with self._lock:
            rid = next(self._ids)
            message = {**(params or {}), "id": rid, "op": op}
            try:
                data = (json.dumps(message, ensure_ascii=False) + "\n").encode("utf-8")
            except (TypeError, ValueError) as exc:
                raise ClientError(
                    f"cannot encode request for {op!r}: {exc}", "bad_request"
                ) from None
            reused = self._sock is not None
            try:
                reply = self._exchange(data, op, timeout)
            except _Retryable:
                # The daemon closed an idle connection before our request got through (or,
                # for a read-only op, before answering): one attempt on a fresh connection.
                self.close()
                if not reused:
                    raise self._closed(op) from None
                try:
                    reply = self._exchange(data, op, timeout)
                except (_Retryable, _ClosedMidRequest):
                    self.close()
                    raise self._closed(op) from None
            except _ClosedMidRequest:
                self.close()
                raise self._closed(op) from None
            try:
                return self._result(reply, rid)
            except ClientError as exc:
                if exc.code != "too_large":
                    raise
                raise ClientError(
                    f"{exc.message} (this one: {len(data)} bytes)", exc.code
                ) from None

    def _closed(self, op: str) -> ClientError:
        return ClientError(
            f"clagd at {self.socket_path} closed the connection without answering {op!r}",
            "closed",
        )

    def _exchange(self, data: bytes, op: str, timeout: float | None) -> Any:
        if self._sock is None:
            self._sock = self._open()
        sock = self._sock
        sock.settimeout(self.timeout if timeout is None else timeout)
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            raise _Retryable from None
        except TimeoutError:
            self.close()
            raise DaemonTimeout(f"clagd at {self.socket_path} did not take the request") from None
        try:
            line = self._readline(sock)
        except TimeoutError:
            self.close()
            raise DaemonTimeout(
                f"clagd at {self.socket_path} did not answer within {sock.gettimeout()}s"
            ) from None
        except ConnectionResetError:
            line = None
        if line is None:
            raise _Retryable if op in IDEMPOTENT_OPS else _ClosedMidRequest
        try:
            return json.loads(line)
        except (UnicodeDecodeError, ValueError) as exc:
            self.close()
            raise ProtocolError(f"reply is not JSON: {exc}") from None

    def _readline(self, sock: socket.socket) -> bytes | None:
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line = bytes(self._buf[:nl])
                del self._buf[: nl + 1]
                return line
            if len(self._buf) > MAX_REPLY_BYTES:
                self.close()
                raise ProtocolError(f"reply longer than {MAX_REPLY_BYTES} bytes")
            chunk = sock.recv(65536)
            if not chunk:
                if self._buf:
                    self.close()
                    raise ProtocolError("connection closed in the middle of a reply")
                return None
            self._buf += chunk

    def _result(self, reply: Any, rid: int) -> Any:
        if not isinstance(reply, dict) or "ok" not in reply:
            self.close()
            raise ProtocolError(f"reply is not a protocol message: {str(reply)[:200]}")
        if reply.get("id") is None and reply["ok"] is False:
            # A connection-level refusal (forbidden, busy, too_large) answers no request id;
            # the daemon may close the connection after it.
            self.close()
        elif reply.get("id") != rid:
            self.close()
            raise ProtocolError(f"reply id {reply.get('id')!r} does not match request id {rid}")
        if reply["ok"] is True:
            return reply.get("result")
        err = reply.get("error")
        if not isinstance(err, dict):
            raise ProtocolError(f"error reply without an error object: {str(reply)[:200]}")
        code = str(err.get("code") or "error")
        message = str(err.get("message") or code)
        if code == DaemonNotRunning.code:
            raise DaemonNotRunning(message)
        raise ClientError(message, code)

    # -- operations

    def ping(self) -> Pong:
        return _parse(Pong, self.call("ping"), "ping")

    def status(self, scope: str | None = None) -> Status:
        return _parse(Status, self.call("status", scope=self._scope(scope)), "status")

    def add(
        self,
        content: str,
        metadata: Mapping[str, Any] | None = None,
        created_at: str | None = None,
        scope: str | None = None,
    ) -> Added:
        """Store one memory (committed before the reply); returns the daemon's add result.
        `scope`: whose memory it is (else the client's scope, else the default)."""
        item: dict[str, Any] = {"content": content}
        if metadata:
            item["metadata"] = dict(metadata)
        if created_at:
            item["created_at"] = created_at
        return self.add_many([item], scope=scope)

    def add_many(
        self,
        items: Iterable[Mapping[str, Any]],
        source: str | None = None,
        scope: str | None = None,
    ) -> Added:
        """Store several memories in one commit; each item is `{content, metadata?, created_at?}`.
        `source` names where they came from in the commit subject: "socket" (the default) or
        "import" (`clagd import`). `scope`: as for `add` (an item naming another is refused)."""
        params: dict[str, Any] = {"items": [dict(i) for i in items]}
        if source is not None:
            params["source"] = source
        chosen = self._scope(scope)
        if chosen is not None:
            params["scope"] = chosen
        return _parse(Added, self.request("add", params), "add")

    def add_messages(
        self,
        messages: Iterable[Mapping[str, Any]],
        metadata: Mapping[str, Any] | None = None,
        scope: str | None = None,
    ) -> Added:
        """Store a conversation as mem0's `add(messages)` takes it,
        `[{"role": "user", "content": ..., "created_at": ...}, ...]`: one memory per user
        turn (and per assistant turn when the store sets `ingest.assistant_turns`), each with
        `role` and `speaker` metadata (the message's `speaker` or `name`, else its role);
        `metadata` is every turn's. System and tool turns are not stored (`skipped` counts
        the turns left out). All messages are checked first; one bad message refuses all.
        `scope`: whose conversation it is (else the client's scope, else the default)."""
        params: dict[str, Any] = {"messages": [dict(m) for m in messages]}
        if metadata:
            params["metadata"] = dict(metadata)
        chosen = self._scope(scope)
        if chosen is not None:
            params["scope"] = chosen
        return _parse(Added, self.request("add", params), "add")

    def update(
        self,
        memory_id: str,
        content: str,
        metadata: Mapping[str, Any] | None = None,
        created_at: str | None = None,
        scope: str | None = None,
    ) -> Updated:
        """Store `content` as a new memory that supersedes `memory_id` (which stays in the
        store, marked superseded, left out of queries unless `superseded=True`). `scope`:
        the old memory's (else the client's, else the default); another scope's memory is
        `not_found`."""
        params: dict[str, Any] = {"memory_id": memory_id, "content": content}
        chosen = self._scope(scope)
        if chosen is not None:
            params["scope"] = chosen
        if metadata:
            params["metadata"] = dict(metadata)
        if created_at:
            params["created_at"] = created_at
        return _parse(Updated, self.request("update", params), "update")

    def query(
        self,
        text: str,
        max_memories: int | None = None,
        token_budget: int | None = None,
        include_archive: bool = False,
        where: Mapping[str, Any] | None = None,
        scope: str | None = None,
        scopes: Iterable[str] = (),
        superseded: bool = False,
    ) -> QueryResult:
        """The memories relevant to `text`. `where`: only memories whose metadata has each
        of these scalar values (exact match, ANDed), applied before the cut to
        `max_memories` and the budget. `scope`: the scope searched (else the client's,
        else the default), with the `scopes` named besides; no other scope's memory is
        ever returned. `superseded`: memories another supersedes (`update`) are searched
        too."""
        params = QueryParams(
            text,
            max_memories,
            token_budget,
            include_archive,
            scope=self._scope(scope),
            scopes=tuple(scopes),
            superseded=superseded,
        ).to_request()
        if where:
            params["where"] = dict(where)  # checked by the daemon, which names what is wrong
        return QueryResult.from_dict(_object(self.request("query", params), "query"))

    def get(
        self, memory_id: str, scope: str | None = None, scopes: Iterable[str] = ()
    ) -> MemoryRecord:
        """One memory by id (hot or archived) of `scope` (else the client's, else the
        default) or the `scopes` named besides; `ClientError` code `not_found` when the
        store holds no such memory there."""
        params = {
            "memory_id": memory_id,
            "scope": self._scope(scope),
            "scopes": list(scopes) or None,
        }
        return _parse(MemoryRecord, self.call("get", **params), "get")

    def list_memories(
        self,
        where: Mapping[str, Any] | None = None,
        since: str | None = None,
        limit: int = DEFAULT_LIST_LIMIT,
        include_archive: bool = False,
        scope: str | None = None,
        scopes: Iterable[str] = (),
        superseded: bool = False,
    ) -> MemoryList:
        """The newest memories (at most `limit`) of `scope` (else the client's, else the
        default) and the `scopes` named besides, whose metadata has each `where` value,
        made at or after `since` (an ISO 8601 time, or an age: 30m, 2h, 7d, 4w). A memory
        another supersedes (`update`) is listed only with `superseded`."""
        params = {
            "where": dict(where) if where else None,
            "since": since,
            "limit": limit,
            "include_archive": include_archive or None,
            "scope": self._scope(scope),
            "scopes": list(scopes) or None,
            "superseded": superseded or None,
        }
        return _parse(MemoryList, self.call("list", **params), "list")

    def clusters(self, include_archive: bool = False, scope: str | None = None) -> ClusterList:
        """The clusters of `scope` (else the client's; with neither, of every scope)."""
        result = self.call(
            "clusters", include_archive=include_archive or None, scope=self._scope(scope)
        )
        return _parse(ClusterList, result, "clusters")

    def log(self, n: int = 20, scope: str | None = None) -> Log:
        """The newest commits (those of `scope`, else of the client's; with neither, all)."""
        return _parse(Log, self.call("log", n=n, scope=self._scope(scope)), "log")

    def revert(self, ref: str, scope: str | None = None) -> Reverted:
        """Revert a commit or session; with `scope` (else the client's), only one that
        changed that scope's memories alone."""
        return _parse(Reverted, self.call("revert", ref=ref, scope=self._scope(scope)), "revert")

    def forget(
        self,
        ids: Iterable[str] = (),
        match: str | None = None,
        scope: str | None = None,
        purge: bool = False,
        force_remote: bool = False,
    ) -> Forgotten:
        """Remove memories (by id, or every one whose content contains `match`) from HEAD
        in one `forget` commit and from every copy the daemon keeps; no revert brings them
        back. `purge` also rewrites every commit that held their text (history changes:
        see docs/protocol.md); `force_remote` then force-pushes it to replication.remote."""
        result = self._slow_call(
            "forget",
            purge,
            ids=list(ids) or None,
            match=match,
            scope=self._scope(scope),
            purge=purge or None,
            force_remote=force_remote or None,
        )
        return _parse(Forgotten, result, "forget")

    def recluster(
        self, wait: bool = True, timeout: float | None = None, scope: str | None = None
    ) -> Session:
        """A clustering session now (of `scope`, else the client's; neither: every scope)."""
        longest = max(self.timeout or 0.0, RECLUSTER_TIMEOUT) if wait else None
        params = {"wait": wait, **({} if (s := self._scope(scope)) is None else {"scope": s})}
        result = self.request("recluster", params, timeout=longest if timeout is None else timeout)
        return _parse(Session, result, "recluster")

    def archive(self, dry_run: bool = False, scope: str | None = None) -> Archived:
        """Archive cold clusters (of `scope`, else of the client's; with neither, all). Slow
        under writes back to back (its slices give way to them): waits as a session may."""
        result = self._slow_call("archive", True, dry_run=dry_run, scope=self._scope(scope))
        return _parse(Archived, result, "archive")

    def sync(self) -> FollowStatus:
        """A follower fetches from its primary now; its `status.follow` after that."""
        return _parse(FollowStatus, self.call("sync"), "sync")

    def round(self, n: int = 1) -> Rounds:
        """Count `n` dialogue rounds (one of the clustering session triggers)."""
        return _parse(Rounds, self.call("round", n=n), "round")


R = TypeVar("R", bound=Reply)


def _object(result: Any, op: str) -> Mapping[str, Any]:
    if not isinstance(result, dict):
        raise ProtocolError(f"{op} result is not an object: {str(result)[:200]}")
    return result


def _parse(cls: type[R], result: Any, op: str) -> R:
    """`cls.from_dict` of an op's result; a malformed one is a ProtocolError."""
    try:
        return cls.from_dict(_object(result, op))
    except (KeyError, TypeError, ValueError) as exc:  # MalformedReply is a ValueError
        raise ProtocolError(f"malformed {op} result: {exc}") from None


class _Retryable(Exception):
    pass


class _ClosedMidRequest(Exception):
    pass
