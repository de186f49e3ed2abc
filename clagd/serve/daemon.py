"""`clagd run`: the composition root. It owns the store lock and wires the engine, the
inbox watcher, the scheduler, the socket server and systemd notification together.

Shutdown (SIGTERM/SIGINT): stop accepting, ingest what is complete in the inbox, let the
writer finish and commit, remove the socket, release the lock, exit 0.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from clagd.config import Config, load_config
from clagd.engine.core import Engine
from clagd.engine.hooks import EngineHooks
from clagd.engine.loader import gc_paused
from clagd.engine.results import Scheduled, Status
from clagd.errors import BadRequest, ClagdError, ReadOnly
from clagd.ingest.watcher import InboxStatus, InboxWatcher
from clagd.libc import malloc_trim
from clagd.organize.session import SessionOutcome, engine_session_runner
from clagd.protocol import flag, resolve_socket
from clagd.scopes import check_scope
from clagd.serve import sdnotify
from clagd.serve.follow import (
    WRITE_OPS,
    Follower,
    FollowStatus,
    follow_prepare,
    read_only_message,
)
from clagd.serve.priority import OrganizingThreads
from clagd.serve.queryproc import (
    CountingDispatcher,
    QueryProcesses,
    QueryProcessesStatus,
    ToQueryProcesses,
)
from clagd.serve.reconfig import ConfigReloader
from clagd.serve.replicate import Replicator
from clagd.serve.scheduler import Activity, Scheduler
from clagd.serve.server import Dispatcher, Handler, SocketServer, build_dispatcher, internal_server
from clagd.slm.base import Backend
from clagd.slm.manager import BackendManager, BackendStatus
from clagd.store.create import PRIVATE_UMASK, PrivacyStatus, init_store
from clagd.store.files import Paths
from clagd.store.follow import RemoteBranch
from clagd.store.gitrepo import GitStore
from clagd.store.lock import StoreLock

log = logging.getLogger("clagd")


def release_free_memory() -> bool:
    """Give the heap left free by loading the store back to the system (glibc's
    malloc_trim): parsing and indexing 100k memories leaves ~200 MB of freed but mapped
    memory that would otherwise stay in the daemon's RSS for good. False where there is no
    glibc."""
    return malloc_trim()


SWITCH_INTERVAL = 0.0005  # seconds; CPython's default is 0.005
FULL_GC_EVERY = 100  # collections of the middle generation between two full ones (10)
# after SIGTERM/SIGINT the process is gone within this many seconds, whatever is running
STOP_SECONDS = 4.5


class Daemon:
    def __init__(
        self,
        store: Path,
        socket_path: Path | None = None,
        config: Config | None = None,
        follow: str | None = None,
    ) -> None:
        os.umask(PRIVATE_UMASK)  # every file the daemon (and its git) writes is private
        # a follower (serve/follow.py): the primary's remote it serves, read-only
        self.follow = follow
        self.follower: Follower | None = None
        self.store, created = init_store(Path(store))
        if created:
            log.info("created a new store in %s", self.store)
        self.paths = Paths(self.store)
        self.config = config or load_config(self.store)
        self.socket_path = resolve_socket(
            self.store, socket_path, configured=self.config.server.socket, binding=True
        )
        self.lock = StoreLock(self.store)
        self.reloader = ConfigReloader(self.store, self.config)
        self.stop_event = threading.Event()
        self.engine: Engine | None = None
        self.server: SocketServer | None = None
        self.watcher: InboxWatcher | None = None
        self.scheduler: Scheduler | None = None
        self.backends = BackendManager(self.config)
        self.replicator: Replicator | None = None
        self._server_thread: threading.Thread | None = None
        self._socket_ino: int | None = None
        self._socket_lock = threading.Lock()
        self._route_timer: threading.Timer | None = None
        self._route_timer_lock = threading.Lock()
        self.watchdog: sdnotify.Watchdog | None = None
        self.queryprocs: QueryProcesses | None = None
        self.organizing = OrganizingThreads()  # the threads `server.background_nice` nices
        self._internal: SocketServer | None = None

    # -- the competence gate ------------------------------------------------------------
    def _backend_status(self) -> BackendStatus:
        """The manager's status plus every model's measured competence (`clagd status`)."""
        from clagd.organize.gate import all_results

        gate = tuple(all_results(self.paths.runtime / "gate"))
        return replace(self.backends.status(), gate=gate)

    def _router(self) -> Backend | None:
        """The backend for retrieval refinement, only when the gate measured (and cached)
        that it routes better than the lexical router; it is never measured on a query."""
        from clagd.config import gate_tasks as task_list
        from clagd.organize.gate import cached

        backend = self.backends.get()
        if backend is None or not self.config.backend.gate.enabled:
            return backend
        gate_dir, tasks = self.paths.runtime / "gate", task_list(self.config.backend.gate.tasks)
        verdict = cached(gate_dir, backend, self.paths.prompts, tasks)
        return backend if verdict is not None and verdict.allows("route") else None

    # -- start -----------------------------------------------------------------------
    def start(self) -> None:
        self.lock.acquire()
        try:
            self._start()
        except BaseException:
            self.shutdown()
            raise

    def _start(self) -> None:
        sdnotify.status("loading the store")
        # No cyclic GC pass until the loaded heap is frozen (`_settle_heap`): the first one
        # after the engine's load would scan every object it made (~0.2 s at 100k, before
        # the first answer), and all of them are kept.
        with gc_paused():
            if not self._load_and_serve():
                return
        eng = self.engine
        assert eng is not None
        sdnotify.ready(f"serving {len(eng.index)} memories")
        if not self.stop_event.is_set():
            self._start_query_processes(eng)

    def _load_and_serve(self) -> bool:
        """The engine loaded, its jobs started and the socket served (False: a stop came
        meanwhile, nothing is served)."""
        cfg = self.config
        if self.follow:
            follow_prepare(self.store, self.follow)  # the working copy is HEAD, no hand edit
        eng = self.engine = Engine(self.store, cfg, start=False, hooks=self._hooks())
        eng.start(prime=False)  # primed once serving, below
        eng.git.make_private()
        if self.follow:
            self._start_follower(eng)
        else:
            self._start_primary(eng)
        if self.stop_event.is_set():  # a SIGTERM while loading: stop now, serve nothing
            return False
        assert self.scheduler is not None
        self.scheduler.start()
        # Queries share the GIL with the writer's pure-Python work (ingest, route pass,
        # sessions): a thread that wants the GIL waits up to one switch interval for it, at
        # each wake-up. 0.5 ms instead of 5 halves query p99 while the daemon organizes
        # (docs/retrieval.md, "Scale").
        sys.setswitchinterval(SWITCH_INTERVAL)
        assert self.server is not None
        self._serve(self.server)
        self.watchdog = sdnotify.Watchdog(self.healthy).start()
        self._settle_heap()
        eng.prime()
        if not self.follow:
            # once serving: the backends' imports and probe take the GIL for ~0.3 s (a
            # request that needs a backend first checks for one itself)
            self.scheduler.sched.add_job(self.backends.recheck, id="backend-first")
        log.info("serving %s on %s (%d memories)", self.store, self.socket_path, len(eng.index))
        return True

    def _start_primary(self, eng: Engine) -> None:
        """The writer's jobs: outside edits, replication, the inbox, sessions, archive."""
        cfg = self.config
        # a store edited by hand while no daemon ran: validate and commit it now (whatever
        # goes wrong there is reported and retried by housekeeping, never stops the start)
        try:
            eng.check_outside()
        except Exception as exc:  # noqa: BLE001
            log.error("checking the store for outside changes failed (retried): %s", exc)
        if self.replicator is not None:
            self.replicator.start()
        self.server = self._server(eng)
        self.watcher = InboxWatcher(
            self.paths.inbox,
            cfg.inbox,
            lambda items, files: eng.ingest(items, "inbox", files),
            on_thread_start=self.organizing.enter,
        )
        # a burst's route pass starts once the inbox is empty, if no file came meanwhile
        self.watcher.on_drained = self._route_if_due
        self.scheduler = Scheduler(
            session=lambda trigger: eng.recluster(trigger),
            archive=lambda: eng.archive(),
            housekeeping=self._housekeeping,
            recheck_backend=self.backends.recheck,
            session_minutes=cfg.session.interval_minutes,
            archive_hours=cfg.archive.interval_hours,
            housekeeping_seconds=max(0.5, cfg.inbox.rescan_seconds),
            backend_seconds=cfg.backend.recheck_seconds,
            on_thread_start=self.organizing.enter,
        )
        # the start-up scan happens in the watcher's first pass, before READY=1
        self.watcher.start()
        deadline = time.monotonic() + 60
        while not self.watcher.wait_backlog(0.2) and time.monotonic() < deadline:
            if self.stop_event.is_set():
                return

    def _start_follower(self, eng: Engine) -> None:
        """A follower's jobs: fetch and follow the primary; no inbox, sessions or archive."""
        assert self.follow is not None
        cfg = self.config
        eng.writer.read_only = read_only_message(self.follow)
        remote = RemoteBranch(eng.git, self.follow, eng.git.branch)
        self.follower = Follower(eng, remote, cfg.replication.follow_seconds)
        try:
            self.follower.sync()  # serve the primary's newest from the first answer on
        except ClagdError as exc:
            log.error("follow: %s (serving the last good state)", exc)
        self.server = self._server(eng)
        self.scheduler = Scheduler(
            session=lambda _trigger: None,
            archive=lambda: None,
            housekeeping=self._follower_housekeeping,
            recheck_backend=lambda: None,
            session_minutes=0,
            archive_hours=0,
            housekeeping_seconds=max(0.5, cfg.inbox.rescan_seconds),
            backend_seconds=0,
        )
        self.follower.start()

    def _hooks(self) -> EngineHooks:
        """Everything the engine calls out to, built before it (the scheduler, which starts
        later, is reached through `_on_threshold`)."""
        cfg = self.config
        if self.follow:
            return self._follower_hooks()
        hooks = EngineHooks(
            on_threshold=self._on_threshold,
            on_route_waiting=self._route_soon,
            session_runner=engine_session_runner(self.backends),
            backend_status=self._backend_status,
            index_publisher=ToQueryProcesses(lambda: self.queryprocs),
            on_thread_start=self.organizing.enter,
            status={
                "inbox": self._inbox_status,
                "query_processes": self._query_status,
                "activity": self._activity,
                "privacy": lambda: PrivacyStatus.of(self.store),
                "config": self.reloader.status,
            },
        )
        if cfg.retrieval.slm_refine:
            from clagd.retrieval.refine import Refiner

            hooks.refiner = Refiner(self._router, cfg.retrieval)
            hooks.status["refine"] = hooks.refiner.status
        if cfg.replication.remote:
            self.replicator = Replicator(
                GitStore(self.store),
                cfg.replication.remote,
                cfg.replication.branch,
                cfg.replication.retry_seconds,
            )
            hooks.on_commit = self.replicator.notify
            hooks.status["replication"] = self.replicator.status
        return hooks

    def _follower_hooks(self) -> EngineHooks:
        """A follower's engine: it serves and reports, it never organizes or pushes."""
        return EngineHooks(
            index_publisher=ToQueryProcesses(lambda: self.queryprocs),
            status={
                "follow": self._follow_status,
                "query_processes": self._query_status,
                "privacy": lambda: PrivacyStatus.of(self.store),
                "config": self.reloader.status,
            },
        )

    def _follow_status(self) -> FollowStatus | None:
        return None if self.follower is None else self.follower.status()

    # -- query processes (serve/queryproc.py) -----------------------------------------
    def _start_query_processes(self, eng: Engine) -> None:
        """Queries go to processes of their own once the daemon serves (it answers them
        itself until one is ready, and again whenever none is)."""
        cfg = self.config.server
        if cfg.query_processes <= 0 or self.server is None:
            return
        if self.config.retrieval.slm_refine:
            log.info("query processes off: retrieval.slm_refine asks the model at query time")
            return
        internal = self._internal = internal_server(
            CountingDispatcher(self.server.dispatcher, lambda: self.queryprocs),
            cfg.max_request_bytes,
            cfg.read_timeout,
        )
        threading.Thread(
            target=internal.serve_forever,
            kwargs={"poll_interval": 0.5},
            name="clagd-internal",
            daemon=True,
        ).start()
        self.queryprocs = QueryProcesses(
            cfg.query_processes,
            eng,
            self.server.socket,
            internal.socket.getsockname(),
            cfg,
            self._on_query_serving,
            logging.getLevelName(logging.getLogger().getEffectiveLevel()),
        )
        self.queryprocs.start()
        # organizing is background work once queries have processes of their own: on a busy
        # CPU the scheduler gives a query the core before the writer, a session or git
        n = self.organizing.lower(cfg.background_nice)
        if n:
            log.info("organizing runs at nice +%d (%d threads)", cfg.background_nice, n)

    def _query_status(self) -> QueryProcessesStatus:
        if self.queryprocs is None:
            return QueryProcessesStatus(self.config.server.query_processes, 0)
        return self.queryprocs.status()

    def _main_serving(self) -> bool:
        return self._server_thread is not None and self._server_thread.is_alive()

    def _on_query_serving(self, n: int) -> None:
        """The daemon stops accepting on the socket while a query process serves (the
        processes accept every connection and hand it what is not a query), and takes it
        back when none does."""
        with self._socket_lock:
            srv = self.server
            if srv is None or self.stop_event.is_set():
                return
            qp = self.queryprocs
            srv.hand_off = qp.hand_off if n > 0 and qp is not None else None
            if n > 0 and self._main_serving():
                srv.shutdown()
                log.info("%d query process(es) serve the socket", n)
            elif n == 0 and not self._main_serving():
                log.warning("no query process serves: the daemon serves the socket itself")
                self._serve(srv)

    def _caught_up(self, fn: Handler) -> Handler:
        """`fn`, answered only once every query process serves what it changed: the next
        query finds a memory that `add` (or `status`, seeing it ingested) reported."""

        def run(params: dict[str, Any]) -> Any:
            out = fn(params)
            if self.queryprocs is not None:
                self.queryprocs.wait_caught_up()
                if isinstance(out, Status):  # `status`: the processes as they are now
                    out = replace(out, query_processes=self._query_status())
            return out

        return run

    def _activity(self) -> Activity | None:
        """Queued and running sessions (`Scheduler.activity`): what a client waits out
        when it wants the store organized (the eval's stream protocol)."""
        return self.scheduler.activity() if self.scheduler is not None else None

    def _route_soon(self, quiet_seconds: float) -> None:
        """Queue the route pass as soon as it is due, not at the next housekeeping tick
        (up to `inbox.rescan_seconds` later): one timer, re-armed by every ingest batch
        while shards wait (an ingest in between makes the pass not due yet; the next
        batch's timer takes over)."""
        with self._route_timer_lock:
            if self._route_timer is not None:
                self._route_timer.cancel()
            timer = threading.Timer(quiet_seconds + 0.01, self._route_if_due)
            timer.daemon = True
            self._route_timer = timer
            timer.start()

    def _route_if_due(self) -> None:
        eng = self.engine
        if eng is None or self.stop_event.is_set() or not eng.routes:
            return
        # files still arriving (or being ingested): wait for the burst to end, so it is
        # routed in one pass that does not hold the writer up in the middle of it
        quiet = eng.routes.quiet_seconds
        left = quiet - (self.watcher.quiet_for() if self.watcher is not None else quiet)
        if left > 0:
            self._route_soon(left)
            return
        # a failure is logged and retried by housekeeping
        eng.maybe_route(wait=False, inbox_quiet=self.watcher is not None)

    def _on_threshold(self, why: str) -> None:
        if self.scheduler is not None:
            self.scheduler.trigger_session(why)

    def _server(self, eng: Engine) -> SocketServer:
        cfg = self.config.server
        inherited = sdnotify.listen_fds()
        server = SocketServer(
            None if inherited else self.socket_path,
            self._dispatcher(eng),
            max_request_bytes=cfg.max_request_bytes,
            read_timeout=cfg.read_timeout,
            max_clients=cfg.max_clients,
            inherited=inherited[0] if inherited else None,
        )
        if inherited and server.path is not None:
            self.socket_path = server.path
        return server

    def _dispatcher(self, eng: Engine) -> Dispatcher:
        d = build_dispatcher(eng, {"recluster": self._recluster, "sync": self._sync})
        for op in ("add", "update", "forget", "revert", "recluster", "archive", "status", "sync"):
            d.op(op, self._caught_up(d.ops[op]))
        if self.follow:
            for op in WRITE_OPS:
                d.op(op, self._refuse_write)
        return d

    def _refuse_write(self, _params: dict[str, Any]) -> Any:
        raise ReadOnly(read_only_message(self.follow or ""))

    def _sync(self, _params: dict[str, Any]) -> FollowStatus:
        if self.follower is None:
            raise BadRequest("this daemon is a primary: 'sync' is a follower's (clagd follow)")
        return self.follower.sync()

    @staticmethod
    def _settle_heap() -> None:
        # The loaded store is a large, long-lived heap: keep the cyclic GC from rescanning it
        # (a full collection over 100k memories is a query-latency spike). No collection
        # first: loading leaves no cyclic garbage (0 objects from the YAML files, 23 from
        # the warm start at 100k), and one costs 0.1 s before the first answer.
        gc.freeze()
        # A full collection is a stop-the-world pass over every object made since (30-90
        # ms once the daemon has organized a while at 100k): CPython's default, one after 10
        # collections of the middle generation, ran ~10 times over 3 sessions and was the
        # tail of `add` latency while they ran (p99 193 ms, 102 with one after 100).
        gen0, gen1, _gen2 = gc.get_threshold()
        gc.set_threshold(gen0, gen1, FULL_GC_EVERY)
        release_free_memory()

    def _inbox_status(self) -> InboxStatus | None:
        return self.watcher.status() if self.watcher is not None else None

    def healthy(self) -> bool:
        return bool(
            self.engine is not None
            and self.engine.writer.alive()
            and (
                (self.watcher is not None and self.watcher.alive())
                or (self.follower is not None and self.follower.alive())
            )
            and self.scheduler is not None
            and self.scheduler.alive()
            and (
                self._main_serving()
                or (self.queryprocs is not None and self.queryprocs.serving() > 0)
            )
        )

    def _housekeeping(self) -> None:
        eng = self.engine
        if eng is None:
            return
        self.paths.runtime.mkdir(mode=0o700, exist_ok=True)  # `rm -rf .clagd` / `git clean`
        self._check_socket()
        if self.watcher is not None:
            self.watcher.ensure_inbox()
        self.reload_config()  # clagd.yaml changed: validated, applied or reported
        eng.check_outside()
        eng.special.maybe_refresh()  # symlinks, FIFOs, hard links: reported (every 30 s)
        eng.maybe_route(wait=False)  # queued on the writer; a failure is logged and retried
        eng.stats.save()
        eng.maybe_save_warmstart()
        eng.maybe_pack()
        sdnotify.status(
            f"{len(eng.index)} memories, {eng.counters['queries']} queries, "
            f"{eng.counters['sessions']} sessions"
        )

    def _follower_housekeeping(self) -> None:
        eng = self.engine
        if eng is None:
            return
        self.paths.runtime.mkdir(mode=0o700, exist_ok=True)
        self._check_socket()
        self.reload_config()
        eng.stats.save()
        eng.maybe_save_warmstart()
        sdnotify.status(f"{len(eng.index)} memories, following {self.follow}")

    def reload_config(self, force: bool = False) -> None:
        """Take in a changed clagd.yaml (any clagd.yaml when `force`: a SIGHUP), as the
        config watcher does: applied where live, otherwise reported."""
        if self.reloader.check(force) and self.watcher is not None:
            self.watcher.tracker.settle_seconds = self.config.inbox.settle_seconds

    def _on_sighup(self, _signum: int = 0, _frame: FrameType | None = None) -> None:
        """SIGHUP reloads clagd.yaml (in a thread of its own: a handler must not wait for
        housekeeping's reload) instead of killing the daemon."""
        log.info("SIGHUP: reloading %s", self.reloader.path)
        threading.Thread(
            target=self.reload_config, args=(True,), name="clagd-sighup", daemon=True
        ).start()

    def _check_socket(self) -> None:
        """A deleted (or replaced) socket file is re-created: the daemon must never run on,
        unreachable, while the CLI says it is not running."""
        with self._socket_lock:  # housekeeping and the main loop both check
            self._recreate_socket()

    def _recreate_socket(self) -> None:
        srv = self.server
        if srv is None or not srv.owns_path or srv.path is None or self._socket_ino is None:
            return
        if self.stop_event.is_set():
            return
        try:
            if os.lstat(srv.path).st_ino == self._socket_ino:
                return
        except FileNotFoundError:
            pass
        log.warning("the socket %s was removed: re-creating it", srv.path)
        if self._main_serving():
            srv.shutdown()
        srv.socket.close()
        new = SocketServer(
            srv.path,
            srv.dispatcher,
            max_request_bytes=srv.max_request_bytes,
            read_timeout=srv.read_timeout,
            max_clients=srv.max_clients,
        )
        self.server = new
        self._serve(new)
        if self.queryprocs is not None:  # they accept on the old socket: start them again
            self.queryprocs.restart_all(new.socket)

    def _serve(self, srv: SocketServer) -> None:
        self._socket_ino = os.lstat(srv.path).st_ino if srv.owns_path and srv.path else None
        self._server_thread = threading.Thread(
            target=srv.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="clagd-server",
            daemon=True,
        )
        self._server_thread.start()

    def _recluster(self, params: dict[str, Any]) -> SessionOutcome | Scheduled:
        assert self.engine is not None and self.scheduler is not None
        eng, scope = self.engine, params.get("scope")
        scope = None if scope is None else check_scope(scope)
        if flag(params, "wait", True):
            return eng.recluster("manual", backend=params.get("backend"), scope=scope)
        if scope is None:
            self.scheduler.trigger_session("manual")
        else:
            self.scheduler.trigger_scoped("manual", scope, lambda t, s: eng.recluster(t, scope=s))
        return Scheduled()

    # -- run / stop -------------------------------------------------------------------
    def request_stop(self, _signum: int = 0, _frame: FrameType | None = None) -> None:
        """The SIGTERM/SIGINT handler: `run` notices and shuts down in order. Whatever is
        running, the process is gone within `STOP_SECONDS` (`_stop_overdue`)."""
        if not self.stop_event.is_set():
            timer = threading.Timer(STOP_SECONDS, self._stop_overdue)
            timer.daemon = True
            timer.start()
        self.stop_event.set()

    @staticmethod
    def _stop_overdue() -> None:
        """The orderly stop took too long (a write the writer cannot cut short): exit now,
        as a kill would. Nothing acknowledged is lost: what was half-written is undone at
        the next start from the transaction marker (docs/robustness.md), and a session's
        slices not yet run are the next session's."""
        log.error("stopping took more than %.0f s: exiting now, as a kill would", STOP_SECONDS)
        logging.shutdown()
        os._exit(0)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        signal.signal(signal.SIGHUP, self._on_sighup)
        self.start()
        try:
            while not self.stop_event.wait(1.0):
                try:
                    self._check_socket()  # a deleted socket is back within a second
                except Exception as exc:  # noqa: BLE001 - tried again in a second
                    log.error("cannot re-create the socket: %s", exc)
        finally:
            self.shutdown()
        return 0

    @staticmethod
    def exit(code: int) -> NoReturn:
        """End the process once `run` returned. Everything is saved by then; the threads
        left are background checks with nothing to save (an Ollama probe on the scheduler's
        pool, its imports), which the interpreter would otherwise wait for, past the stop
        deadline."""
        logging.shutdown()
        os._exit(code)

    def shutdown(self) -> None:
        self.stop_event.set()  # nothing may serve or re-create the socket from here on
        if self.engine is not None:
            self.engine.writer.closing = True  # a session in progress stops at its next step
        sdnotify.stopping("shutting down")
        log.info("shutting down")
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.follower is not None:
            self.follower.stop()
        if self.queryprocs is not None:
            self.queryprocs.stop()
        if self.server is not None:
            self.server.shutdown() if self._main_serving() else None
            self.server.server_close()
        if self._internal is not None:
            self._internal.shutdown()
            self._internal.server_close()
        if self.scheduler is not None:
            self.scheduler.stop()
        if self.watcher is not None:
            self.watcher.stop()  # ingests what is complete, then stops
        with self._route_timer_lock:
            if self._route_timer is not None:
                self._route_timer.cancel()  # the engine's close runs the pass itself
        if self.engine is not None:
            self.engine.close()  # the writer drains its queue and commits
        if self.replicator is not None:
            self.replicator.stop()
        self.backends.close()
        log.info("stopped")
        self.lock.release()
