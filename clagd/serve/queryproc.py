"""The daemon's side of the query processes (`server.query_processes`, see
`serve/query_worker.py`): start them, keep their copies of the index in step, take in what
their queries count, restart one that dies, and say how many serve.

Why processes: a query is ~1 ms of Python and numpy under the GIL; the writer's route pass
and sessions are seconds of it. In one process a query waits for the GIL at every switch
and behind every long C call of the writer (a YAML dump, a sort), which is what made query
p99 while the daemon organizes ten times its idle figure. A query process has a GIL of its
own; what it shares with the writer is only the CPU.

Consistency: every change of the served index reaches every query process in the writer's
order, each with a version. `wait_caught_up` blocks until every serving process applied the
newest version: the daemon calls it before it answers a write (and `status`), so a client
that added a memory, or saw it ingested, finds it in the next query wherever it is served.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import pickle
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from clagd.change import IndexChange
from clagd.config import ServerConfig
from clagd.engine.core import Engine
from clagd.protocol import OMIT_NONE
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
)
from clagd.serve.server import Dispatcher
from clagd.store.writer import WriteContext

log = logging.getLogger("clagd.query")

RESTART_MIN, RESTART_MAX = 1.0, 60.0  # seconds between restarts of a failing process
# a forwarded request's [pid, queries it had reported]: the daemon counts those first, so
# `status` after a query counts it wherever it was answered
COUNTED_KEY = "_clagd_counted"
SERVE = pickle.dumps(Serve())  # to a process that caught up: accept connections now
STOP = pickle.dumps(Stop())
STOP_GRACE = 1.0  # seconds a process has to end by itself at a stop, then it is killed
HANDOFF_MAX = 60_000  # bytes a passed connection may take along (one SEQPACKET message)


@dataclass(frozen=True)
class ProcessStatus:
    """One query process: its pid, the newest index version it applied, queries answered."""

    pid: int | None
    applied: int  # -1: it receives no changes (not started, or ending)
    queries: int
    state: str  # its `ProcState`


@dataclass(frozen=True)
class QueryProcessesStatus:
    """The `query_processes` section of `status` (only `configured` and `serving` while
    none was started: `server.query_processes` is 0, or the daemon serves queries itself)."""

    configured: int
    serving: int
    version: int | None = field(default=None, metadata=OMIT_NONE)
    processes: tuple[ProcessStatus, ...] | None = field(default=None, metadata=OMIT_NONE)
    restarts: int | None = field(default=None, metadata=OMIT_NONE)
    replaced: int | None = field(default=None, metadata=OMIT_NONE)
    last_error: str | None = field(default=None, metadata=OMIT_NONE)


class ProcState(enum.Enum):
    """A query process's life as the daemon sees it (`_Proc.change_state` checks every
    move against `TRANSITIONS`)."""

    STOPPED = "stopped"  # no process: not started yet, or the daemon stopped it
    STARTING = "starting"  # spawned; its index is not sent yet
    CATCHING_UP = "catching_up"  # its index sent, every change queued for it; not serving
    SERVING = "serving"  # it applied every change published when it caught up: queries go to it
    REPLACING = "replacing"  # killed to start again at once on a re-created socket
    BACKOFF = "backoff"  # it ended by itself: started again after a delay


S = ProcState
TRANSITIONS: dict[ProcState, frozenset[ProcState]] = {
    S.STOPPED: frozenset({S.STARTING}),
    S.STARTING: frozenset({S.CATCHING_UP, S.REPLACING, S.BACKOFF, S.STOPPED}),
    S.CATCHING_UP: frozenset({S.SERVING, S.REPLACING, S.BACKOFF, S.STOPPED}),
    S.SERVING: frozenset({S.REPLACING, S.BACKOFF, S.STOPPED}),
    S.REPLACING: frozenset({S.STOPPED}),
    S.BACKOFF: frozenset({S.STARTING, S.STOPPED}),
}
RECEIVING = frozenset({S.CATCHING_UP, S.SERVING})  # index changes are queued for it


class BadTransition(AssertionError):
    """A query process was moved to a state its present state does not lead to."""


# the query processes a change was sent to prepare: (slot, pid) of each
SentTo = frozenset[tuple[int, int | None]]


class _Proc:
    """One query process and the channel to it, as seen from the daemon."""

    def __init__(self, slot: int) -> None:
        self.slot = slot
        self.state = ProcState.STOPPED
        self.popen: subprocess.Popen[bytes] | None = None
        self.conn: Connection | None = None
        self.outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self.applied = 0  # the newest version it has applied (while RECEIVING)
        self.queries = 0
        self.counted = 0  # `Queried` messages taken in from this life of the process
        self.started = 0.0
        self.handoff: socket.socket | None = None  # connections are passed on this
        self.handoff_lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    def change_state(self, new: ProcState, *expected: ProcState) -> ProcState:
        """Move to `new` (the caller holds `QueryProcesses._cond`); `expected`, when given,
        are the only states it may come from. Returns the state it left."""
        old = self.state
        if (expected and old not in expected) or new not in TRANSITIONS[old]:
            raise BadTransition(f"query process {self.slot}: {old.name} -> {new.name}")
        self.state = new
        return old

    @property
    def receiving(self) -> bool:
        return self.state in RECEIVING

    @property
    def serving(self) -> bool:
        return self.state is ProcState.SERVING


class CountingDispatcher(Dispatcher):
    """The daemon's internal socket: a request forwarded by a query process is answered
    once the queries that process answered before it are counted."""

    def __init__(self, inner: Dispatcher, procs: Callable[[], QueryProcesses | None]) -> None:
        super().__init__()
        self.ops = inner.ops
        self.inner = inner
        self.procs = procs

    def handle(self, req: Any) -> dict[str, Any]:
        if isinstance(req, dict):
            src = req.pop(COUNTED_KEY, None)
            qp = self.procs()
            if qp is not None and isinstance(src, list) and len(src) == 2:
                qp.wait_counted(int(src[0]), int(src[1]))
        return self.inner.handle(req)


class QueryProcesses:
    def __init__(
        self,
        count: int,
        engine: Engine,
        listener: socket.socket,
        daemon_address: bytes,
        limits: ServerConfig,
        on_serving: Callable[[int], None],
        log_level: str = "INFO",
    ) -> None:
        self.count = count
        self.engine = engine
        self.listener = listener
        self.daemon_address = daemon_address
        self.limits = {
            "max_request_bytes": limits.max_request_bytes,
            "read_timeout": limits.read_timeout,
            "max_clients": limits.max_clients,
        }
        self.on_serving = on_serving
        self.log_level = log_level
        self.version = 0  # of the served index, counted by `publish` on the writer thread
        self.restarts = 0  # after a process ended by itself (or was too slow)
        self.replaced = 0  # started again on a re-created socket
        self.last_error = ""
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._procs = [_Proc(i) for i in range(count)]
        self._threads: list[threading.Thread] = []
        self._told = 0  # how many serve, as the daemon was last told (`on_serving`)
        self._next = 0

    # -- the writer's side ------------------------------------------------------------
    # (`clagd.change.Publisher`: what `prepare` returns is the processes it reached)
    def prepare(self, change: IndexChange) -> SentTo | None:
        """The writer is committing `change` (writer thread, while the git thread writes
        and commits the files): every process that receives changes makes the snapshot it
        gives now, beside the one it serves, and serves it once `publish` says so (a commit
        that failed is not published: the next `prepare` or `apply` replaces it). Returns
        the processes told, by slot and pid (None: none)."""
        targets = [p for p in self._procs if p.receiving]
        if not targets:
            return None
        data = pickle.dumps(Prepare(change), protocol=pickle.HIGHEST_PROTOCOL)
        for p in targets:
            p.outbox.put(data)
        return frozenset((p.slot, p.pid) for p in targets)

    def publish(self, change: IndexChange, prepared: SentTo | None) -> None:
        """The served index changed (writer thread): queue the change for every process
        that receives changes. A process that `prepare` told of it (`prepared`, in this
        same life of it) is only told to serve what it made; the others get the change,
        pickled here once, before the writer goes on."""
        self.version += 1
        told = prepared or frozenset()
        data = b""
        for p in self._procs:
            if not p.receiving:
                continue
            if (p.slot, p.pid) in told:
                p.outbox.put(pickle.dumps(Commit(self.version)))
            else:
                if not data:
                    data = pickle.dumps(
                        Apply(self.version, change), protocol=pickle.HIGHEST_PROTOCOL
                    )
                p.outbox.put(data)

    def _init_op(self, _ctx: WriteContext, p: _Proc) -> None:
        """On the writer thread (no change can be half-applied to the index meanwhile): the
        current index, then every change after it. A process replaced meanwhile gets none."""
        with self._cond:
            if p.state is not ProcState.STARTING:
                return
            p.applied = self.version
            data = pickle.dumps(Init(self.version, self.engine.index), pickle.HIGHEST_PROTOCOL)
            p.outbox.put(data)
            p.change_state(ProcState.CATCHING_UP)

    # -- reads ------------------------------------------------------------------------
    def serving(self) -> int:
        with self._cond:
            return self._count_serving()

    def wait_caught_up(self, timeout: float = 30.0) -> bool:
        """Block until every serving process serves the newest index (False: one did not
        within `timeout`; it is then restarted, and the caller answers anyway)."""
        with self._cond:
            target = self.version
            ok = self._cond.wait_for(
                lambda: all(p.applied >= target for p in self._procs if p.serving), timeout
            )
            late = [p for p in self._procs if p.serving and p.applied < target]
        if not ok:
            for p in late:
                log.error("query process %s is %ss behind: restarting it", p.pid, timeout)
                self._kill(p)
        return ok

    def wait_counted(self, pid: int, n: int, timeout: float = 5.0) -> None:
        """Until the daemon took in the first `n` queries process `pid` answered."""
        with self._cond:
            self._cond.wait_for(
                lambda: all(p.pid != pid or p.counted >= n for p in self._procs), timeout
            )

    def status(self) -> QueryProcessesStatus:
        with self._cond:
            return QueryProcessesStatus(
                self.count,
                self._count_serving(),
                self.version,
                tuple(
                    ProcessStatus(p.pid, p.applied if p.receiving else -1, p.queries, p.state.value)
                    for p in self._procs
                ),
                self.restarts,
                self.replaced,
                self.last_error,
            )

    # -- life ---------------------------------------------------------------------------
    def start(self) -> None:
        for p in self._procs:
            # the thread that starts a process must outlive it (PR_SET_PDEATHSIG follows
            # the starting thread): each process has one thread, for its whole life
            t = threading.Thread(target=self._run, args=(p,), name=f"clagd-query-{p.slot}")
            t.daemon = True
            t.start()
            self._threads.append(t)

    def restart_all(self, listener: socket.socket) -> None:
        """The socket was re-created: the processes start again on the new one."""
        self.listener = listener
        with self._cond:
            for p in self._procs:
                if p.state in (S.STARTING, S.CATCHING_UP, S.SERVING):
                    p.change_state(S.REPLACING)
                    self._kill(p)

    def stop(self, grace: float = STOP_GRACE) -> None:
        """Stop every process and wait for them: none may go on serving the socket after
        the daemon closed it. Each ends when its channel says so; one still starting
        (importing, or loading its first index) after `grace` seconds is killed, as it
        holds nothing to save."""
        self._stop.set()
        for p in self._procs:
            p.outbox.put(None)
        deadline = time.monotonic() + grace
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        for p in self._procs:
            if p.popen is not None and p.popen.poll() is None:
                p.popen.kill()
                p.popen.wait(5)
        for t in self._threads:
            t.join(5)  # its process is gone: its channel ends at once
        with self._cond:  # a process whose thread ended waiting out its restart delay
            for p in self._procs:
                if p.state is S.BACKOFF:
                    p.change_state(S.STOPPED)

    def _kill(self, p: _Proc) -> None:
        if p.popen is not None and p.popen.poll() is None:
            p.popen.kill()

    def _run(self, p: _Proc) -> None:
        failures = 0
        while not self._stop.is_set():
            with self._cond:
                p.change_state(S.STARTING, S.STOPPED, S.BACKOFF)
            try:
                self._one_life(p)
            except Exception as exc:  # noqa: BLE001 - reported, then started again
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.error("query process %d: %s", p.slot, self.last_error)
            replaced = self._ended(p)
            if self._stop.is_set():
                return
            if replaced:  # the socket was re-created: at once, on the new one
                self.replaced += 1
                continue
            lived = time.monotonic() - p.started
            failures = 1 if lived > RESTART_MAX else failures + 1
            delay = min(RESTART_MAX, RESTART_MIN * 2 ** (failures - 1))
            self.restarts += 1
            log.warning("query process %d ended; starting it again in %.0f s", p.slot, delay)
            if self._stop.wait(delay):
                return

    def hand_off(self, conn: socket.socket, buffered: bytes) -> bool:
        """Pass a connection the daemon accepted (before a query process served) to one
        that serves, with what the daemon read of it already; False: keep it."""
        if len(buffered) > HANDOFF_MAX:
            return False
        with self._cond:
            ready = [p for p in self._procs if p.serving and p.handoff is not None]
            if not ready:
                return False
            self._next = (self._next + 1) % len(ready)
            p = ready[self._next]
        try:
            with p.handoff_lock:
                assert p.handoff is not None
                socket.send_fds(p.handoff, [b"c" + buffered], [conn.fileno()])
        except (OSError, AssertionError):
            return False
        return True

    def _spawn(self, p: _Proc) -> None:
        ours, theirs = socket.socketpair()
        handoff, their_handoff = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            args = [
                sys.executable,
                "-m",
                "clagd.serve.query_worker",
                str(theirs.fileno()),
                str(self.listener.fileno()),
                str(their_handoff.fileno()),
                str(os.getpid()),
                self.daemon_address.hex(),
                json.dumps(self.limits),
                self.log_level,
            ]
            fds = (theirs.fileno(), self.listener.fileno(), their_handoff.fileno())
            p.popen = subprocess.Popen(args, pass_fds=fds, stdin=subprocess.DEVNULL)
        except BaseException:
            handoff.close()
            raise
        finally:
            theirs.close()
            their_handoff.close()
        p.handoff = handoff
        p.conn = Connection(ours.detach())
        p.counted = 0
        p.outbox = queue.SimpleQueue()
        p.started = time.monotonic()

    def _one_life(self, p: _Proc) -> None:
        self._spawn(p)
        assert p.conn is not None
        if self._stop.is_set():  # stopped while it started: `_ended` ends it
            return
        sender = threading.Thread(target=self._send_loop, args=(p.conn, p.outbox), daemon=True)
        sender.start()
        self.engine.writer.call(self._init_op, p)
        while True:
            try:
                msg: ToDaemon = pickle.loads(p.conn.recv_bytes())
            except (EOFError, OSError):
                return
            match msg:
                case Applied(version):
                    self._applied(p, version)
                case Queried(memory_ids, cluster_ids):
                    self.engine.note_query(memory_ids, cluster_ids, True)
                    with self._cond:
                        p.queries += 1
                        p.counted += 1
                        self._cond.notify_all()

    @staticmethod
    def _send_loop(conn: Connection, outbox: queue.SimpleQueue[bytes | None]) -> None:
        """Sends what the writer queued, in order (the writer never waits on a pipe)."""
        while True:
            data = outbox.get()
            try:
                conn.send_bytes(STOP if data is None else data)
            except OSError:
                return
            if data is None:
                return

    def _applied(self, p: _Proc, version: int) -> None:
        with self._cond:
            p.applied = version
            # it serves once it has caught up with every change published so far (a change
            # queued behind its initial index would otherwise be missing from its answers)
            first = p.state is S.CATCHING_UP and version >= self.version
            if first:
                p.change_state(S.SERVING)
            self._cond.notify_all()
            n = self._serving_changed()
        if first:
            log.info("query process %d (pid %s) serves", p.slot, p.pid)
            # the daemon stops accepting first (its accept loop must not block in accept()
            # on a connection that a process took), then the process starts accepting
            if n is not None:
                self.on_serving(n)
            p.outbox.put(SERVE)

    def _count_serving(self) -> int:
        return sum(p.serving for p in self._procs)

    def _serving_changed(self) -> int | None:
        """How many serve now, if the daemon was told another number (the caller holds
        `_cond`; it then tells the daemon, outside the lock)."""
        n = self._count_serving()
        if n == self._told:
            return None
        self._told = n
        return n

    def _ended(self, p: _Proc) -> bool:
        """This life of the process is over (it ended, or was killed): no more changes for
        it, and no more connections; True when it was replaced (started again at once)."""
        with self._cond:
            replaced = p.state is S.REPLACING
            p.change_state(S.STOPPED if replaced or self._stop.is_set() else S.BACKOFF)
            self._cond.notify_all()
            n = self._serving_changed()
        p.outbox.put(None)  # ends its sender (and asks the process to stop)
        if p.popen is not None:
            try:
                code = p.popen.wait(5 if self._stop.is_set() else 0.01)
            except subprocess.TimeoutExpired:
                p.popen.kill()
                code = p.popen.wait()
            if not self._stop.is_set():
                log.warning("query process %d (pid %s) exited with %s", p.slot, p.pid, code)
        if p.conn is not None:
            p.conn.close()
        with p.handoff_lock:
            if p.handoff is not None:
                p.handoff.close()
                p.handoff = None
        if n is not None:
            self.on_serving(n)
        return replaced


class ToQueryProcesses:
    """The engine's index publisher in a daemon (`EngineHooks.index_publisher`): the query
    processes once they run, nothing before (or when they are off)."""

    def __init__(self, procs: Callable[[], QueryProcesses | None]) -> None:
        self._procs = procs

    def prepare(self, change: IndexChange) -> SentTo | None:
        procs = self._procs()
        return None if procs is None else procs.prepare(change)

    def publish(self, change: IndexChange, prepared: SentTo | None) -> None:
        procs = self._procs()
        if procs is not None:
            procs.publish(change, prepared)
