"""A query process (`server.query_processes`): it answers queries from its own copy of the
index, outside the daemon's GIL, and hands every other request to the daemon.

The daemon starts it with `python -m clagd.serve.query_worker`, passing the listening
socket, one end of a control socket pair and the daemon's internal address. Over the
control channel the daemon sends the index once (`init`) and then every change its writer
makes (`apply`, the same `IndexChange` its `Index.apply` took), each with a version;
this process applies them in order and answers `applied` with the version, which is what
lets the daemon answer a write only once every query process serves it. A change the
writer is still committing comes first as `prepare`: this process makes its snapshot while
the files are written and git commits them, and serves it when `commit` comes with the
version (a failed commit sends no `commit`; the next change replaces what was prepared).
For each query it answers it reports the memories and clusters it returned (`queried`):
the daemon keeps the access statistics and counts the rounds that trigger sessions.

It accepts connections on the same listening socket as the daemon, checks the peer's uid
and applies the same limits (`serve/server.py`). A request it does not answer itself (any
op but `query`, and a query of the archive) goes to the daemon's internal socket as it
came, on a connection of its own, and the reply comes back as the daemon gave it.

It dies with the daemon: the kernel sends it SIGKILL when the daemon's thread that started
it ends (PR_SET_PDEATHSIG), and it exits when the control channel closes.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import pickle
import signal
import socket
import sys
import threading
import time
from collections import deque
from multiprocessing.connection import Connection
from typing import Any

from clagd.change import IndexChange
from clagd.engine.answer import answer
from clagd.engine.results import QueryResult
from clagd.errors import ClagdError
from clagd.libc import libc
from clagd.protocol import QueryParams, error_reply
from clagd.retrieval.index import Index
from clagd.serve.control import (
    Applied,
    Apply,
    Commit,
    Init,
    Prepare,
    Queried,
    Serve,
    Stop,
    ToDaemon,
    ToProcess,
)
from clagd.serve.logs import setup_logging
from clagd.serve.queryproc import COUNTED_KEY
from clagd.serve.server import Dispatcher, SocketServer, encode_reply

log = logging.getLogger("clagd.query")

PR_SET_PDEATHSIG = 1


class Replica:
    """This process's copy of the daemon's index, kept in step by the control channel."""

    def __init__(self, conn: Connection, index: Index, version: int) -> None:
        self.conn = conn
        self.index = index
        self.version = version
        self.reported = 0  # `queried` messages sent
        # the snapshot `prepare` made, served by `commit` (see there)
        self.pending: Index | None = None
        self._send_lock = threading.Lock()

    def send(self, msg: ToDaemon) -> None:
        data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        with self._send_lock:
            self.conn.send_bytes(data)
            if isinstance(msg, Queried):
                self.reported += 1

    def prepare(self, change: IndexChange) -> None:
        """Make the snapshot `change` gives, beside the one served (the daemon is committing
        it); `commit` serves it."""
        self.pending = self.index.apply(change)

    def commit(self, version: int) -> None:
        """The change last prepared was committed: serve its snapshot. It was made from the
        served one: only `prepare`, `commit` and `apply` change either, and each of them
        drops what was prepared before."""
        if self.pending is None:
            raise ClagdError(f"told to serve version {version}, which was never prepared")
        self.index, self.pending = self.pending, None
        self.version = version
        self.send(Applied(version))

    def apply(self, version: int, change: IndexChange) -> None:
        self.pending = None  # a change prepared but not committed (its commit failed)
        self.index = self.index.apply(change)
        self.version = version
        self.send(Applied(version))

    def query(self, params: dict[str, Any]) -> QueryResult:
        t0 = time.perf_counter()
        out, memory_ids, cluster_ids = answer(
            self.index, QueryParams.from_request(params), started=t0
        )
        self.send(Queried(memory_ids, cluster_ids))
        return out


class FairLock:
    """A lock taken in the order it was asked for: the next waiter is handed ownership on
    release, so no connection thread can lose the race for it again and again (a plain
    lock's waiters are woken in no order, and a thread that just arrived can take it
    first: the 16-client tail)."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._busy = False
        self._waiters: deque[threading.Lock] = deque()

    def __enter__(self) -> None:
        with self._mutex:
            if not self._busy:
                self._busy = True
                return
            turn = threading.Lock()
            turn.acquire()
            self._waiters.append(turn)
        turn.acquire()  # released by the holder before us: the lock is ours

    def __exit__(self, *_exc: object) -> None:
        with self._mutex:
            if self._waiters:
                self._waiters.popleft().release()  # still busy: handed over
            else:
                self._busy = False


class ForwardingDispatcher(Dispatcher):
    """Answers `query` from the replica; hands everything else to the daemon."""

    def __init__(self, replica: Replica, daemon_address: bytes) -> None:
        super().__init__()
        self.replica = replica
        self.daemon_address = daemon_address
        self.op("query", replica.query)
        # one query at a time, from its parameters to its encoded reply: connection threads
        # searching at once hold the GIL by turns (their numpy calls release it) and the
        # hand-overs cost more than the searches (16 concurrent clients: 3.2 ms of CPU per
        # query instead of 0.7). Requests for the daemon wait on it outside this lock.
        self._compute = FairLock()

    def reply(self, req: Any) -> dict[str, Any] | bytes:
        if self._local(req):
            with self._compute:
                return encode_reply(super().handle(req))
        return self.forward(req)

    def handle(self, req: Any) -> dict[str, Any]:
        return super().handle(req) if self._local(req) else self.forward(req)

    @staticmethod
    def _local(req: Any) -> bool:
        return isinstance(req, dict) and req.get("op") == "query" and not req.get("include_archive")

    def forward(self, req: Any) -> dict[str, Any]:
        """The daemon's reply to `req`, on a connection of its own (a request can take long:
        a `recluster` waits for its session; others on this client's connection wait as they
        would on the daemon itself)."""
        rid = req.get("id") if isinstance(req, dict) else None
        if isinstance(req, dict):  # what the daemon must have counted before it answers
            req = {**req, COUNTED_KEY: [os.getpid(), self.replica.reported]}
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(self.daemon_address)
                s.sendall(json.dumps(req, ensure_ascii=False).encode() + b"\n")
                with s.makefile("rb") as f:
                    line = f.readline()
        except OSError as exc:
            return error_reply(rid, "unavailable", f"the daemon did not answer: {exc}")
        if not line:
            return error_reply(rid, "unavailable", "the daemon closed the connection")
        reply: dict[str, Any] = json.loads(line)
        return reply


def _die_with_parent(parent: int) -> None:
    fn = getattr(libc(), "prctl", None)
    if fn is not None:
        fn(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the daemon died before the line above
        os._exit(0)


def take_connections(handoff: socket.socket, server: SocketServer) -> None:
    """Serve the connections the daemon passes on (those it accepted before this process
    served), each with what the daemon had read of it."""
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(handoff, 1 << 16, 1)
        except OSError:
            return
        if not msg:
            return  # the daemon closed the channel
        for fd in fds:
            conn = socket.socket(fileno=fd)
            server.prefixes[conn] = msg[1:]
            server.process_request(conn, "")


def serve(
    conn: Connection,
    listener: socket.socket,
    handoff: socket.socket,
    daemon_address: bytes,
    limits: dict[str, Any],
) -> int:
    """Receive the index, serve on `listener`, apply changes until the channel closes."""
    first = pickle.loads(conn.recv_bytes())
    if isinstance(first, Stop):  # the daemon stopped while this process started
        return 0
    if not isinstance(first, Init):
        raise ClagdError(f"expected the index first, got {type(first).__name__}")
    replica = Replica(conn, first.index, first.version)
    server = SocketServer(
        None,
        ForwardingDispatcher(replica, daemon_address),
        max_request_bytes=limits["max_request_bytes"],
        read_timeout=limits["read_timeout"],
        max_clients=limits["max_clients"],
        inherited=listener,
    )
    server.owns_path = False  # the daemon's socket file: never removed here
    # several processes accept on this socket: one woken for a connection another took must
    # not block in accept() (it could not stop); the socketserver loop takes EAGAIN in stride
    listener.setblocking(False)
    # the index came over the channel: keep the cyclic GC from rescanning it (unpickling
    # leaves no cyclic garbage to collect first)
    gc.freeze()
    sys.setswitchinterval(0.0005)  # the control thread's applies yield to queries sooner
    threading.Thread(target=take_connections, args=(handoff, server), daemon=True).start()
    replica.send(Applied(first.version))
    accepting = False
    try:
        while True:
            try:
                msg: ToProcess = pickle.loads(conn.recv_bytes())
            except (EOFError, OSError):
                return 0  # the daemon is gone or stopping
            match msg:
                case Stop():
                    return 0
                case Serve() if not accepting:
                    # the daemon saw this copy catch up with its writer: from now on a query
                    # that reaches this process finds every change the daemon answered for
                    accepting = True
                    threading.Thread(
                        target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True
                    ).start()
                    log.info(
                        "query process %d serving %d memories", os.getpid(), len(replica.index)
                    )
                case Apply(version, change):
                    replica.apply(version, change)
                case Prepare(change):
                    replica.prepare(change)
                case Commit(version):
                    replica.commit(version)
    finally:
        if accepting:
            server.shutdown()


def main(argv: list[str]) -> int:
    """argv: control fd, listening fd, hand-off fd, daemon pid, internal address (hex),
    limits (JSON), log level."""
    ctl_fd, listen_fd, handoff_fd, parent = (int(a) for a in argv[:4])
    daemon_address = bytes.fromhex(argv[4])
    limits = json.loads(argv[5])
    setup_logging(argv[6] if len(argv) > 6 else "INFO")
    _die_with_parent(parent)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the daemon, which stops us
    listener = socket.socket(fileno=listen_fd)
    try:
        handoff = socket.socket(fileno=handoff_fd)
        return serve(Connection(ctl_fd), listener, handoff, daemon_address, limits)
    except Exception:
        log.exception("query process %d failed", os.getpid())
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
