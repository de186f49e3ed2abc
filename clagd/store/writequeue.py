"""The writer's queue: writes first, organizing's slices when writes give them room
(issue 26).

A route pass and the archive job run as slices, one writer operation each, queued as
*background* operations; every other operation (an `add`, a forget, an inbox batch, a
session's steps) is a *write*. Writes run first, in order. A background operation waits
until the writer has had no write for `GRACE` seconds, so an agent sending writes one after
another (the next arrives a millisecond or so after the last answer) is not made to wait
behind a slice at every write, as it was when the job queued its next slice the moment one
ended: at 100k memories a route slice holds the writer ~75-115 ms, and an `add` behind one
took 147-169 ms (p99) against ~40 alone.

So that organizing still gets done under writes that never pause, a background operation
waiting also runs after `WRITES_PER_SLICE` writes have run while it waited: at most one
write in that many meets a slice. Under a client writing back to back (~45 ms an `add` at
100k), a route pass of ~20 slices then takes ~20 x 200 x 45 ms = 3 minutes instead of ~3 s;
without such a client, a slice waits at most `GRACE` after the last write.

While the daemon stops, what is queued runs without waiting, writes first.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from clagd.store.writer import WriteContext

T = TypeVar("T")
NO_ARG: Any = object()  # an operation submitted without an argument

GRACE = 0.05  # seconds without a write before a background operation runs
WRITES_PER_SLICE = 200  # writes run while one waits, after which it runs anyway


class WriteQueue(Generic[T]):
    """Thread-safe; one thread takes (`get`), any thread puts."""

    def __init__(self) -> None:
        self.grace, self.writes_per_slice = GRACE, WRITES_PER_SLICE  # (tests change them)
        self._cv = threading.Condition()
        self._writes: deque[T] = deque()
        self._background: deque[T] = deque()
        self._last_write = float("-inf")  # when the last write taken was finished
        self._writing = False  # a write is running
        self._gave_way = 0  # writes taken while a background operation waited
        self._closing = False

    def __len__(self) -> int:
        with self._cv:
            return len(self._writes) + len(self._background)

    def put(self, item: T, background: bool = False) -> None:
        with self._cv:
            (self._background if background else self._writes).append(item)
            self._cv.notify()

    def close(self) -> None:
        """`get` answers None once everything queued has been taken."""
        with self._cv:
            self._closing = True
            self._cv.notify()

    def get(self) -> T | None:
        """The next operation to run: a write when one waits, else a background one when
        writes give it room (see the module's docstring); None once closed and empty.
        The caller calls `done` when what it took has run."""
        with self._cv:
            while True:
                if self._background and self._gave_way >= self.writes_per_slice:
                    self._gave_way = 0  # its turn, even with writes waiting
                    return self._background.popleft()
                if self._writes:
                    if self._background:
                        self._gave_way += 1
                    self._writing = True
                    return self._writes.popleft()
                if self._background:
                    wait = self._room()
                    if wait <= 0:
                        self._gave_way = 0
                        return self._background.popleft()
                    self._cv.wait(wait)
                    continue
                if self._closing:
                    return None
                self._cv.wait()

    def _room(self) -> float:
        """0 when a background operation may run now, else how long to wait at most."""
        if self._closing:
            return 0.0
        return max(self._last_write + self.grace - time.monotonic(), 0.0)

    def done(self) -> None:
        """What `get` last gave has run."""
        with self._cv:
            if self._writing:
                self._writing = False
                self._last_write = time.monotonic()


@dataclass(frozen=True)
class Queued:
    """An operation waiting for the writer thread, with its one argument (or none)."""

    op: Callable[..., Any]
    arg: Any  # NO_ARG: the operation takes none
    future: Future[Any]

    def run(self, ctx: WriteContext) -> Any:
        return self.op(ctx) if self.arg is NO_ARG else self.op(ctx, self.arg)

    @property
    def name(self) -> str:
        return str(getattr(self.op, "__name__", self.op))
