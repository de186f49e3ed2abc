"""Route-pass bookkeeping: which unsorted shards of large ingest batches still wait for the
pass that moves their memories into clusters, and when that pass is due.

A large batch is committed unsorted at once (so nothing waits for routing) and its shard is
listed here; the pass runs when the inbox has been quiet for `ingest.route_delay_seconds`,
or at the latest ROUTE_MAX_WAIT after the first waiting batch, so a steady stream of files
still gets its memories into their clusters. One pass runs at a time.

Scoring (which cluster each waiting memory goes to: a pass over every cluster slot, ~1 ms a
memory at 11k clusters) never runs on the writer beyond ROUTE_SCORE_INLINE memories. Right
after a large batch is committed, its shard is scored on the index that commit published,
by a thread of its own (`Scorer`), while the pass waits for its quiet; the answers are kept
with that index's `route_key`. When the pass starts, it uses the answers whose key is still
the served index's (no cluster changed since: they are the answers it would compute); the
rest are scored on the served index by the same thread, off the writer (`NeedScores`), and
the pass goes on when they are in. Those are the pass's answers (`RouteQueue.keep_pass`):
its later slices use them whatever clusters the writes between slices change, as one pass
over the whole burst would have.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from clagd.model import Memory
from clagd.store.holds import WriterIdle, giving_way, pausing

if TYPE_CHECKING:
    from clagd.retrieval.index import Index

log = logging.getLogger(__name__)

# a route pass waits for the inbox to be quiet, but not longer than this after the first
# deferred batch
ROUTE_MAX_WAIT = 30.0
# waiting memories a route op scores itself, on the writer (~1 ms each at 11k clusters);
# more are scored off the writer first
ROUTE_SCORE_INLINE = 48
# memories the scoring thread scores between two pauses for the writer's work
SCORE_STEP = 32


@dataclass(frozen=True)
class NeedScores:
    """What a route op answers instead of routing when more than ROUTE_SCORE_INLINE waiting
    memories have no answer: score these on this index, off the writer, then go on."""

    memories: list[Memory]
    index: Index


class RouteQueue:
    """Thread-safe: ingest (writer thread), housekeeping and shutdown all touch it."""

    def __init__(self, quiet_seconds: float) -> None:
        self.quiet_seconds = quiet_seconds
        self._pending: dict[str, float] = {}  # shard name -> when its batch was committed
        self._lock = threading.Lock()
        self._running = False
        self._last_ingest = 0.0
        self._last_source = ""  # where the last batch came from ("inbox", "socket", ...)
        # shard -> (the index's route_key, {memory id: its cluster or None})
        self._scored: dict[str, tuple[object, dict[str, str | None]]] = {}
        # the pass in progress's own answers (memory id -> its cluster or None), made on the
        # index it started from: its slices use them until it has finished
        self._pass: dict[str, str | None] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._pending)

    def ingested(self, deferred_shard: str | None, source: str = "") -> None:
        """An ingest batch from `source` was committed; `deferred_shard` names its shard
        when the batch's routing was left to a pass."""
        now = time.monotonic()
        self._last_ingest = now
        self._last_source = source
        if deferred_shard:
            with self._lock:
                self._pending[deferred_shard] = now

    def due(self, now: float | None = None, inbox_quiet: bool = False) -> bool:
        """A pass is waiting and no batch has been committed for `quiet_seconds` (or one
        waited too long). `inbox_quiet`: the inbox is drained and has had no file arrive
        for as long (the watcher knows), which is enough when the last batch came from it:
        the burst is over, even if its commit ended only now."""
        with self._lock:
            if not self._pending:
                return False
            oldest = min(self._pending.values())
        now = time.monotonic() if now is None else now
        quiet = now - self._last_ingest >= self.quiet_seconds
        settled = inbox_quiet and self._last_source == "inbox"
        return quiet or settled or now - oldest >= ROUTE_MAX_WAIT

    def claim(self, force: bool, inbox_quiet: bool = False) -> bool:
        """Mark a pass as running when one should start now (any waiting shard, with
        `force`); False when none is waiting, one is running, or it is not due yet."""
        with self._lock:
            if self._running or not self._pending:
                return False
        if not (force or self.due(inbox_quiet=inbox_quiet)):
            return False
        with self._lock:
            self._running = True
        return True

    def waiting(self) -> list[str]:
        """The shards a pass should take now."""
        with self._lock:
            return list(self._pending)

    def finished(self, taken: list[str]) -> None:
        """The pass over `taken` has committed: they no longer wait. (A failed pass leaves
        them listed, to be tried again at the next due time.)"""
        with self._lock:
            for name in taken:
                self._pending.pop(name, None)
                self._scored.pop(name, None)
            if not self._pending:
                self._pass.clear()

    def keep_pass(self, targets: dict[str, str | None]) -> None:
        """Answers for the pass in progress (by memory id), used by its later slices."""
        with self._lock:
            self._pass.update(targets)

    def drop_pass(self) -> None:
        """The pass failed: the next one starts from the index it will serve."""
        with self._lock:
            self._pass.clear()

    def is_waiting(self, shard: str) -> bool:
        with self._lock:
            return shard in self._pending

    def keep_scores(self, shard: str, key: object, targets: dict[str, str | None]) -> None:
        """The route answers for a waiting shard's memories, made on an index with `key`."""
        with self._lock:
            if shard in self._pending:
                self._scored[shard] = (key, targets)

    def scores(self, shards: list[str], key: object) -> dict[str, str | None]:
        """The pass's own answers, and the kept answers for these shards that were made on
        an index with `key` (by memory id); those made on another are dropped (a cluster
        changed since)."""
        out: dict[str, str | None] = {}
        with self._lock:
            out.update(self._pass)
            for name in shards:
                got = self._scored.get(name)
                if got is None:
                    continue
                if got[0] is key:
                    out.update(got[1])
                else:
                    del self._scored[name]
        return out

    def release(self, _fut: Future | None = None) -> None:
        """The pass is over, done or not (also when it never ran: the writer was stopping)."""
        with self._lock:
            self._running = False


class KeptRoutes:
    """A route pass's router: the answers kept for its memories (`RouteQueue.scores`), and
    `route_many` on the served index for those without one. Every answer it gives is in
    `made`, which the pass's later slices keep (`RouteQueue.keep_scores`)."""

    def __init__(
        self,
        known: dict[str, str | None],
        route_many: Callable[[list[Memory]], list[str | None]],
    ) -> None:
        self.known, self.route_many = known, route_many
        self.made: dict[str, str | None] = {}

    def __call__(self, mems: list[Memory]) -> list[str | None]:
        todo = [m for m in mems if m.id not in self.known]
        fresh = dict(zip((m.id for m in todo), self.route_many(todo) if todo else []))
        self.made.update(self.known)
        self.made.update(fresh)
        return [self.known[m.id] if m.id in self.known else fresh[m.id] for m in mems]


class Scorer:
    """Scores a waiting shard's memories for the route pass, on a thread of its own, off
    the writer: `route_many` only reads an index snapshot, as a query does (a pass over
    every cluster slot: ~1 ms a memory at 11k clusters, which held the writer as an
    operation of its own). The answers are kept under that snapshot's `route_key`."""

    def __init__(
        self,
        routes: RouteQueue,
        on_thread_start: Callable[[], None] | None,
        writer: WriterIdle | None = None,
    ) -> None:
        self.routes = routes
        self._on_start = on_thread_start
        self.writer = writer  # given: the scoring gives way to its writes (`store/holds.py`)
        self._pool: ThreadPoolExecutor | None = None
        self._last: Future | None = None

    def soon(self, shard: str, mems: list[Memory], index: Index) -> None:
        """Score `mems` (the shard's memories) on `index` (the snapshot the batch's commit
        published)."""
        self._submit(self._score, shard, mems, index)  # closing: the pass scores them itself

    def _score(self, shard: str, mems: list[Memory], index: Index) -> None:
        if not mems or not self.routes.is_waiting(shard):
            return
        try:
            targets = self._route(index, mems)
        except Exception as exc:  # noqa: BLE001 - the pass scores them itself
            log.warning("scoring a waiting batch failed (the pass scores it): %s", exc)
            return
        self.routes.keep_scores(shard, index.route_key, dict(zip((m.id for m in mems), targets)))

    def for_pass(self, need: NeedScores, then: Callable[[bool], None]) -> bool:
        """Score `need` for the pass in progress on this thread, then `then(scored)` (which
        queues the pass's next op; `scored` False: the scoring failed, the op scores them
        itself). False when closing: nothing was queued."""
        return self._submit(self._for_pass, need, then)

    def _submit(self, fn: Callable[..., None], *args: object) -> bool:
        """Run `fn(*args)` on the scoring thread; False when closing (nothing runs)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                1, thread_name_prefix="clagd-route-score", initializer=self._on_start
            )
        try:
            self._last = self._pool.submit(fn, *args)
        except RuntimeError:
            return False
        return True

    def _for_pass(self, need: NeedScores, then: Callable[[bool], None]) -> None:
        try:
            self.score_pass(need)
        except Exception as exc:  # noqa: BLE001 - the op scores what is still missing
            log.warning("scoring for the route pass failed (the pass scores them): %s", exc)
            then(False)
            return
        then(True)

    def score_pass(self, need: NeedScores) -> None:
        """Score `need` here (the calling thread, not the writer) for the pass: those of
        its memories that the scoring ahead has not answered on the same index since the
        op asked (a pass that starts while its burst is still being scored ahead asks for
        all of it, and this thread takes the request after that scoring: scoring the burst
        twice was 40% of a 2,000-memory pass's wait at 11k clusters)."""
        key = need.index.route_key
        known = self.routes.scores(self.routes.waiting(), key)
        todo = [m for m in need.memories if m.id not in known]
        # not giving way: the pass waits for these answers, and the writer for the pass
        targets = need.index.route_many(todo) if todo else []
        made = {m.id: known[m.id] for m in need.memories if m.id in known}
        made.update(zip((m.id for m in todo), targets))
        self.routes.keep_pass(made)

    def _route(self, index: Index, mems: list[Memory]) -> list[str | None]:
        """`index.route_many(mems)`, `SCORE_STEP` memories a step, pausing between steps
        while the writer works (`store/holds.py`): scoring ahead of the pass, while the
        burst's batches are still being committed."""
        if self.writer is None:
            return index.route_many(mems)
        out: list[str | None] = []
        with giving_way(self.writer):
            for part in pausing(index.route_steps(mems, SCORE_STEP)):
                out += part
        return out

    def wait(self, timeout: float | None = None) -> None:
        """Until the scoring asked for so far is done (tests, benchmarks)."""
        fut = self._last
        if fut is not None:
            fut.exception(timeout)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
