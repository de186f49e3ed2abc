"""Scheduled work (APScheduler 3.x): clustering sessions, the archive job, backend re-checks
and housekeeping (outside edits, access statistics).

Sessions run on a one-thread executor, so there is one at a time; triggers coalesce (a
burst of "20 new memories" triggers becomes one session) and no misfire is dropped, however
busy the daemon is.

While the writer is busy (a bulk import, a long session) a periodic job can still be running
when its next run is due; APScheduler then skips that run and logs a WARNING. That is the
intended behaviour (one instance at a time, the next run comes soon), not a fault, so those
records are logged again at DEBUG on `clagd.scheduler` instead: normal work logs no warnings.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler

log = logging.getLogger("clagd.scheduler")

# APScheduler's messages for runs it skipped or found late (a job still running, a busy
# process): expected here, and logged at DEBUG instead of WARNING.
_EXPECTED = ("skipped: maximum number of running instances reached", "was missed by")
_APSCHEDULER_LOGGERS = ("apscheduler.scheduler", "apscheduler.executors")


class _ExpectedSkips(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING and any(s in str(record.msg) for s in _EXPECTED):
            log.debug("%s", record.getMessage())
            return False
        return True


_EXPECTED_SKIPS = _ExpectedSkips()


def _quiet_expected_skips(executor_aliases: tuple[str, ...]) -> None:
    """Filters sit on a logger, not its children: one on each logger APScheduler uses."""
    names = [_APSCHEDULER_LOGGERS[0]] + [f"{_APSCHEDULER_LOGGERS[1]}.{a}" for a in executor_aliases]
    for name in names:
        logger = logging.getLogger(name)
        if _EXPECTED_SKIPS not in logger.filters:
            logger.addFilter(_EXPECTED_SKIPS)


@dataclass(frozen=True)
class Activity:
    """The `activity` section of `status`: a triggered session waits; one runs."""

    session_queued: bool
    session_running: bool


def _pool_kwargs(on_thread_start: Callable[[], None] | None) -> dict[str, object]:
    return {} if on_thread_start is None else {"initializer": on_thread_start}


class Scheduler:
    def __init__(
        self,
        session: Callable[[str], object],
        archive: Callable[[], object],
        housekeeping: Callable[[], object],
        recheck_backend: Callable[[], object],
        session_minutes: float,
        archive_hours: float,
        housekeeping_seconds: float,
        backend_seconds: float,
        on_thread_start: Callable[[], None] | None = None,
    ) -> None:
        self._session = session
        _quiet_expected_skips(("default", "session"))
        # what `activity()` reports: a session asked for and not yet started, one running
        self._lock = threading.Lock()
        self._queued = False
        self._running = 0
        self.sched = BackgroundScheduler(
            # the jobs' threads (sessions, archive, housekeeping) call `on_thread_start` first
            executors={
                "default": ThreadPoolExecutor(2, pool_kwargs=_pool_kwargs(on_thread_start)),
                "session": ThreadPoolExecutor(1, pool_kwargs=_pool_kwargs(on_thread_start)),
            },
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
            timezone=timezone.utc,
        )
        if session_minutes > 0:
            self.sched.add_job(
                self._run_session,
                "interval",
                minutes=session_minutes,
                args=["interval"],
                id="session-interval",
                executor="session",
            )
        if archive_hours > 0:
            self.sched.add_job(
                self._safe(archive, "archive"), "interval", hours=archive_hours, id="archive"
            )
        self.sched.add_job(
            self._safe(housekeeping, "housekeeping"),
            "interval",
            seconds=housekeeping_seconds,
            id="housekeeping",
        )
        if backend_seconds > 0:
            self.sched.add_job(
                self._safe(recheck_backend, "backend check"),
                "interval",
                seconds=backend_seconds,
                id="backend",
            )

    def _safe(self, fn: Callable[[], object], what: str) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - a job failure is logged, never fatal
                log.error("%s failed: %s", what, exc)

        return run

    def _run_triggered(self, trigger: str) -> None:
        with self._lock:
            self._queued = False
            self._running += 1  # taken over by _run_session (no gap between the two)
        self._run_session(trigger, counted=True)

    def _run_session(
        self, trigger: str, counted: bool = False, call: Callable[[], object] | None = None
    ) -> None:
        """Run one session (`call`, else the daemon's session with `trigger`), counted in
        `activity` while it runs; a failure is logged."""
        if not counted:
            with self._lock:
                self._running += 1
        try:
            call() if call is not None else self._session(trigger)
        except Exception as exc:  # noqa: BLE001
            log.error("clustering session (%s) failed: %s", trigger, exc)
        finally:
            with self._lock:
                self._running -= 1

    def activity(self) -> Activity:
        """Whether a triggered session waits or a session runs: a client that wants the
        store organized (the eval, a script) polls this in `status` until both are false.
        `queued` is set before `trigger_session` returns and cleared only when the session
        starts, so there is no moment in between when both read false."""
        with self._lock:
            return Activity(self._queued, self._running > 0)

    def trigger_session(self, why: str) -> None:
        """Ask for a session soon; while one is queued, further asks coalesce into it."""
        with self._lock:
            if self._queued:
                return
            self._queued = True
        # max_instances 2: the one asked for now may be due while the last triggered one
        # still runs (same job id). With 1, APScheduler would skip this run, and a skipped
        # date job is gone: `_queued` would stay set and no triggered session would ever run
        # again. The session executor has one thread, so the second simply waits its turn.
        self.sched.add_job(
            self._run_triggered,
            "date",
            run_date=datetime.now(timezone.utc) + timedelta(milliseconds=50),
            args=[why],
            id="session-now",
            executor="session",
            replace_existing=True,
            max_instances=2,
        )

    def trigger_scoped(self, why: str, scope: str, session: Callable[[str, str], object]) -> None:
        """A session of one scope soon (`recluster --scope` with `wait: false`), on the
        session executor after any queued or running one; asks for the same scope while it
        waits coalesce into it (one job id per scope)."""
        self.sched.add_job(
            self._run_session,
            "date",
            run_date=datetime.now(timezone.utc) + timedelta(milliseconds=50),
            args=[f"{why}, scope {scope}"],
            kwargs={"call": lambda: session(why, scope)},
            id=f"session-now:{scope}",
            executor="session",
            replace_existing=True,
            max_instances=2,
        )

    def start(self) -> None:
        self.sched.start()

    def alive(self) -> bool:
        return bool(self.sched.running)

    def stop(self) -> None:
        if self.sched.running:
            self.sched.shutdown(wait=False)
