"""Normal work logs no warnings: when a periodic job is still running at its next run time
(the writer is busy), APScheduler skips that run; clagd logs it at DEBUG, not as a WARNING."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from helpers import wait_for

from clagd.serve.scheduler import Activity, Scheduler


def _scheduler(**jobs: Any) -> Scheduler:
    """A scheduler whose jobs do nothing but those given; periodic sessions, archive and
    backend checks off, housekeeping every minute unless given."""
    kw: dict[str, Any] = {
        "session": lambda trigger: None,
        "archive": lambda: None,
        "housekeeping": lambda: None,
        "recheck_backend": lambda: None,
        "session_minutes": 0,
        "archive_hours": 0,
        "housekeeping_seconds": 60,
        "backend_seconds": 0,
    }
    return Scheduler(**{**kw, **jobs})


def test_runs_skipped_by_a_busy_job_are_debug(caplog: pytest.LogCaptureFixture) -> None:
    busy, release = threading.Event(), threading.Event()
    runs = []

    def housekeeping() -> None:  # the first run blocks, like a job behind a busy writer
        runs.append(1)
        busy.set()
        release.wait(30)

    caplog.set_level(logging.DEBUG)
    sched = _scheduler(housekeeping=housekeeping, housekeeping_seconds=0.05)
    sched.start()
    try:
        assert busy.wait(30)

        def skipped() -> bool:
            return any(
                r.name == "clagd.scheduler" and "maximum number of running instances" in r.message
                for r in caplog.records
            )

        wait_for(skipped, 30, "APScheduler to skip a run of the busy job")
    finally:
        release.set()
        sched.stop()
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    debug = [r for r in caplog.records if r.name == "clagd.scheduler"]
    assert debug and all(r.levelno == logging.DEBUG for r in debug)
    assert "housekeeping" in debug[0].message or "run" in debug[0].message


def test_other_apscheduler_warnings_still_pass(caplog: pytest.LogCaptureFixture) -> None:
    _scheduler()
    logging.getLogger("apscheduler.scheduler").warning("Error getting due jobs from job store")
    mine = [r for r in caplog.records if "Error getting due jobs" in r.message]
    assert [r.levelno for r in mine] == [logging.WARNING]


def test_a_session_triggered_while_one_runs_runs_after_it() -> None:
    """A trigger that arrives while the last triggered session still runs is not lost (it
    once was: APScheduler skipped the run as a second instance of the same job, and the
    queued flag then blocked every later trigger for the daemon's lifetime)."""
    first_running, release = threading.Event(), threading.Event()
    runs: list[str] = []

    def session(trigger: str) -> None:
        runs.append(trigger)
        if len(runs) == 1:
            first_running.set()
            release.wait(30)

    sched = _scheduler(session=session)
    sched.start()
    try:
        sched.trigger_session("memories")
        assert first_running.wait(30)
        sched.trigger_session("rounds")
        assert sched.activity() == Activity(session_queued=True, session_running=True)
        # the second run comes due while the first still runs; then the first ends
        wait_for(lambda: sched.sched.get_job("session-now") is None, 30, "the run to come due")
        release.set()
        wait_for(lambda: len(runs) == 2, 30, "the second triggered session")
        wait_for(lambda: sched.activity() == Activity(False, False), 30, "the scheduler to be idle")
        sched.trigger_session("rounds")
        wait_for(lambda: len(runs) == 3, 30, "a later trigger")
    finally:
        release.set()
        sched.stop()
    assert runs == ["memories", "rounds", "rounds"]
