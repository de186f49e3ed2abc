"""The writer's queue: writes first, organizing's slices when writes give them room."""

from __future__ import annotations

import threading
import time

from clagd.store.writequeue import WriteQueue


def _queue(grace: float, per_slice: int) -> WriteQueue[str]:
    q: WriteQueue[str] = WriteQueue()
    q.grace, q.writes_per_slice = grace, per_slice
    return q


def test_writes_run_before_organizing_queued_earlier() -> None:
    q = _queue(0.0, 100)
    q.put("slice 1", background=True)
    q.put("add 1")
    q.put("slice 2", background=True)
    q.put("add 2")
    got = []
    for _ in range(4):
        got.append(q.get())
        q.done()
    assert got == ["add 1", "add 2", "slice 1", "slice 2"]


def test_a_slice_waits_for_a_pause_in_the_writes() -> None:
    """Right after a write, a slice waits `grace` for the next one; a write that comes
    meanwhile runs first. With no write for `grace`, the slice runs."""
    q = _queue(0.4, 100)
    q.put("add 1")
    assert q.get() == "add 1"
    q.done()
    q.put("slice", background=True)
    threading.Timer(0.1, q.put, ("add 2",)).start()
    t = time.monotonic()
    assert q.get() == "add 2"  # the slice waited for it
    assert time.monotonic() - t < 0.35
    q.done()
    t = time.monotonic()
    assert q.get() == "slice"
    assert time.monotonic() - t >= 0.35  # a full grace after the last write


def test_under_writes_that_never_pause_a_slice_runs_after_so_many() -> None:
    q = _queue(60.0, 3)  # a grace no test waits for: only the count lets slices run
    for i in range(8):
        q.put(f"add {i}")
    q.put("slice 1", background=True)
    q.put("slice 2", background=True)
    got = []
    for _ in range(10):
        got.append(q.get())
        q.done()
    assert got == [
        *("add 0", "add 1", "add 2", "slice 1"),
        *("add 3", "add 4", "add 5", "slice 2"),
        *("add 6", "add 7"),
    ]


def test_writes_before_a_slice_was_queued_do_not_count_for_it() -> None:
    q = _queue(60.0, 2)
    for i in range(5):
        q.put(f"add {i}")
        assert q.get() == f"add {i}"
        q.done()
    q.put("slice", background=True)
    q.put("add 5")
    q.put("add 6")
    q.put("add 7")
    got = [q.get() for _ in range(4)]
    assert got == ["add 5", "add 6", "slice", "add 7"]


def test_closing_runs_what_is_queued_without_waiting_then_ends() -> None:
    q = _queue(60.0, 100)
    q.put("add")
    assert q.get() == "add"
    q.done()
    q.put("slice", background=True)
    q.close()
    t = time.monotonic()
    assert q.get() == "slice"
    assert time.monotonic() - t < 5
    assert q.get() is None
    assert len(q) == 0
