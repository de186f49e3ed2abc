"""How long the writer thread is held, whether it has work, and long work off the writer
giving way to writes (issue 26).

`Holds` records the longest operation the writer ran (of each kind: `status.writer`,
`WriterStatus`); `WriterIdle` counts the operations queued and not yet finished.

A session's snapshot, plan and size-policy slices and the route pass's scoring ahead run
on threads of their own, off the writer, on snapshots. They are pure Python, so
they share the interpreter's lock with the writer thread: while one runs, every `add` gets
about half of the CPU time its Python steps need (an `add` at 100k memories took ~100 ms
during a session instead of ~40). Such work calls `pause()` at its steps; inside
`giving_way(idle)` that waits while the writer has operations queued or running, so the
writer runs alone, and outside it (tests, tools, the writer thread itself) it does nothing.

The wait is bounded so that organizing still gets done under a stream of writes: at most
`PAUSE_MAX` at a time, and never more waiting in all than `SHARE` times the time the work
has run (under writes that never stop, the work keeps a quarter of the time).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar


@dataclass(frozen=True)
class WriterStatus:
    """The writer thread: alive, operations queued, commits made, operations failed, and
    the longest single operation it ran (the longest a write waited behind another)."""

    alive: bool
    pending: int
    commits: int
    failures: int
    last_error: str
    longest_op_ms: float
    longest_op: str
    longest_by_op: dict[str, float]


@dataclass
class Holds:
    """How long the writer thread was held by one operation: the longest since start (or
    since `reset`), its name, and the longest of each kind (a benchmark reads the session's
    own: `_snapshot_op`, `_apply_op`, `_size_policy_op`)."""

    longest_ms: float = 0.0
    longest: str = ""
    ops: int = 0
    by_op: dict[str, float] = field(default_factory=dict)

    def note(self, name: str, ms: float) -> None:
        self.ops += 1
        if ms > self.longest_ms:
            self.longest_ms, self.longest = ms, name
        if ms > self.by_op.get(name, 0.0):
            self.by_op[name] = ms

    def reset(self) -> None:
        self.longest_ms, self.longest, self.ops, self.by_op = 0.0, "", 0, {}


T = TypeVar("T")

PAUSE_MAX = 0.05  # seconds one pause waits at most
SHARE = 3.0  # a piece of work waits at most this many times as long as it has run


class WriterIdle:
    """Whether the writer has nothing to do: operations queued and not yet finished are
    counted (`queued` when one is submitted, `finished` when it ran or was cancelled)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._idle = threading.Event()
        self._idle.set()

    def queued(self) -> None:
        with self._lock:
            self._count += 1
            self._idle.clear()

    def finished(self) -> None:
        with self._lock:
            self._count -= 1
            if self._count <= 0:
                self._count = 0
                self._idle.set()

    def idle(self) -> bool:
        return self._idle.is_set()

    def wait(self, timeout: float) -> bool:
        return self._idle.wait(timeout)


class Courtesy:
    """The pauses of one piece of work (see the module's docstring)."""

    def __init__(self, writer: WriterIdle) -> None:
        self.writer = writer
        self.start = time.monotonic()
        self.waited = 0.0
        self.pauses = 0

    def pause(self) -> None:
        if self.writer.idle():
            return
        now = time.monotonic()
        ran = now - self.start - self.waited
        if self.waited > SHARE * ran:
            return  # the work's own share of the time
        self.writer.wait(PAUSE_MAX)
        self.waited += time.monotonic() - now
        self.pauses += 1


_here = threading.local()


def pause() -> None:
    """A step of long work off the writer: wait while the writer works (bounded), inside
    `giving_way`; nothing elsewhere."""
    c: Courtesy | None = getattr(_here, "courtesy", None)
    if c is not None:
        c.pause()


def pausing(items: Iterable[T], every: int = 1) -> Iterator[T]:
    """`items`, with a `pause()` before every `every`-th one (from the first)."""
    for i, item in enumerate(items):
        if not i % every:
            pause()
        yield item


@contextmanager
def giving_way(writer: WriterIdle) -> Iterator[Courtesy]:
    """This thread's long work pauses for `writer` at each `pause()` until the block ends."""
    before = getattr(_here, "courtesy", None)
    c = _here.courtesy = Courtesy(writer)
    try:
        yield c
    finally:
        _here.courtesy = before
