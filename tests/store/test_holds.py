"""Long work off the writer gives way to writes (`store/holds.py`): the writer says when it
has work, `pause()` waits for it only inside `giving_way`, never longer than its share, and
a session's and the route scorer's work off the writer pauses for queued writes."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from helpers import wait_for

import clagd.store.holds as holds
from clagd.engine.core import Engine
from clagd.ingest.inbox import Item


def _block(eng: Engine) -> tuple[threading.Event, threading.Event]:
    """A writer operation that runs until released: (started, release)."""
    started, release = threading.Event(), threading.Event()

    def op(_ctx: object) -> None:
        started.set()
        assert release.wait(30)

    eng.writer.submit(op)
    assert started.wait(30)
    return started, release


def test_the_writer_is_idle_only_with_nothing_queued_or_running(store: Path) -> None:
    eng = Engine(store)
    try:
        idle = eng.writer.idle
        wait_for(idle.idle, 30, "the start's own operations (the writer's copies)")
        _started, release = _block(eng)
        assert not idle.idle()  # running
        queued = eng.writer.submit(lambda _ctx: None)
        cancelled = eng.writer.submit(lambda _ctx: None)
        assert cancelled.cancel()  # a cancelled operation counts as finished
        release.set()
        queued.result(30)
        wait_for(idle.idle, 30, "the writer to be idle")
        eng.ingest([Item("a memory about pears", None, {})], "test")
        assert idle.idle()
    finally:
        eng.close()


def test_pause_waits_for_the_writer_inside_giving_way_only(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(holds, "PAUSE_MAX", 60.0)  # a pause ends only when the writer is idle
    eng = Engine(store)
    try:
        _started, release = _block(eng)
        holds.pause()  # outside giving_way: returns at once (the test would hang otherwise)
        resumed = threading.Event()

        def work() -> None:
            with holds.giving_way(eng.writer.idle) as c:
                time.sleep(0.01)  # it has run a little: its share allows a wait
                holds.pause()
                assert c.pauses == 1
            resumed.set()

        t = threading.Thread(target=work)
        t.start()
        assert not resumed.wait(0.3)  # held while the writer works
        release.set()
        assert resumed.wait(30)
        t.join()
    finally:
        eng.close()


def test_a_pause_never_takes_more_than_its_share(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under writes that never stop, the work still gets a quarter of the time."""
    monkeypatch.setattr(holds, "PAUSE_MAX", 0.02)
    eng = Engine(store)
    try:
        _started, release = _block(eng)  # busy for the whole loop
        with holds.giving_way(eng.writer.idle) as c:
            end = time.monotonic() + 1.0
            steps = 0
            while time.monotonic() < end:
                sum(range(20_000))  # a step of work
                holds.pause()
                steps += 1
            ran = time.monotonic() - c.start - c.waited
        release.set()
        assert c.pauses > 0 and steps > c.pauses
        # (plus a sleep's late wake-up on a loaded machine: without the share the work
        # waits the whole second)
        assert c.waited <= holds.SHARE * ran + holds.PAUSE_MAX + 0.05, (c.waited, ran)
    finally:
        eng.close()


def test_a_session_and_the_route_scorer_pause_for_queued_writes(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = Engine(store)
    paused: list[str] = []
    real = holds.Courtesy.pause

    def spy(self: holds.Courtesy) -> None:
        if not self.writer.idle():
            paused.append(threading.current_thread().name)
        real(self)

    monkeypatch.setattr(holds.Courtesy, "pause", spy)
    try:
        eng.ingest([Item(f"note {i} about the garden and its pears", None, {}) for i in range(30)])
        writes = threading.Event()

        def keep_writing() -> None:  # a stream of adds while the session runs
            i = 0
            while not writes.is_set():
                eng.ingest([Item(f"stream {i} about the kitchen", None, {})], "test")
                i += 1

        t = threading.Thread(target=keep_writing, name="adds")
        t.start()
        try:
            out = eng.recluster("test")
        finally:
            writes.set()
            t.join()
        assert out.status == "accepted", out
        assert paused and "adds" not in paused and "clagd-writer" not in paused
        # the route scorer, on its own thread
        paused.clear()
        idle = eng.writer.idle
        _started, release = _block(eng)
        from clagd.model import Memory

        mems = [Memory.new(f"scored {i} about the garden") for i in range(70)]
        eng.routes.ingested("u-shard", "test")
        eng.scorer.soon("u-shard", mems, eng.index)
        wait_for(lambda: bool(paused), 30, "the scorer to pause for the writer")
        assert all(n.startswith("clagd-route-score") for n in paused), paused
        assert not idle.idle()
        release.set()
        eng.scorer.wait(30)
    finally:
        eng.close()
