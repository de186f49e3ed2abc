"""Normal work logs no warnings: when a periodic job is still running at its next run time
(the writer is busy), APScheduler skips that run; clagd logs it at DEBUG, not as a WARNING."""

from __future__ import annotations

import logging
import threading

import pytest
from helpers import wait_for

from clagd.serve.scheduler import Scheduler


def test_runs_skipped_by_a_busy_job_are_debug(caplog: pytest.LogCaptureFixture) -> None:
    busy, release = threading.Event(), threading.Event()
    runs = []

    def housekeeping() -> None:  # the first run blocks, like a job behind a busy writer
        runs.append(1)
        busy.set()
        release.wait(30)

    caplog.set_level(logging.DEBUG)
    sched = Scheduler(
        session=lambda trigger: None,
        archive=lambda: None,
        housekeeping=housekeeping,
        recheck_backend=lambda: None,
        session_minutes=0,
        archive_hours=0,
        housekeeping_seconds=0.05,
        backend_seconds=0,
    )
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
    Scheduler(
        session=lambda trigger: None,
        archive=lambda: None,
        housekeeping=lambda: None,
        recheck_backend=lambda: None,
        session_minutes=0,
        archive_hours=0,
        housekeeping_seconds=60,
        backend_seconds=0,
    )
    logging.getLogger("apscheduler.scheduler").warning("Error getting due jobs from job store")
    mine = [r for r in caplog.records if "Error getting due jobs" in r.message]
    assert [r.levelno for r in mine] == [logging.WARNING]
