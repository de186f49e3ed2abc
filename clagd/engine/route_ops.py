"""The engine's route pass (`Engine` takes it as a base class): the memories of large ingest
batches, committed unsorted, moved into their clusters in slices of at most
ROUTE_SLICE_CLUSTERS cluster files, one commit each, with writes running between slices.
What a pass knows and when it is due is in engine/routing.py; the commit is
`ingest.batch.route_shards`.

A slice holds the writer for its commit and nothing more: the answers it routes by are made
off the writer (`Scorer`), so a route op that finds more than ROUTE_SCORE_INLINE waiting
memories without one answers `NeedScores` instead of routing, the scorer thread scores them
on the served index, and the pass goes on from there (issue 26: a slice that re-scored
2,000 memories against 11k clusters held the writer for 5 s)."""

from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from clagd.engine.requests import ROUTE_SLICE_CLUSTERS
from clagd.engine.routing import ROUTE_SCORE_INLINE, KeptRoutes, NeedScores, RouteQueue, Scorer
from clagd.ingest.batch import RouteResult, route_shards
from clagd.store.writer import WriteContext

if TYPE_CHECKING:
    from clagd.config import Config
    from clagd.engine.outside import OutsideChange, OutsideEdits
    from clagd.retrieval.index import Index
    from clagd.store.writer import Writer

log = logging.getLogger(__name__)


class RouteOps:
    """`maybe_route` and what it needs of the engine (set by `Engine.__init__`)."""

    config: Config
    writer: Writer[Any]
    index: Index
    routes: RouteQueue
    scorer: Scorer
    outside: OutsideEdits
    counters: dict[str, int]

    def _outside_op(self, ctx: WriteContext) -> OutsideChange | None:
        raise NotImplementedError  # Engine's: a hand edit is taken in before routing

    def route_due(self, now: float | None = None) -> bool:
        return self.routes.due(now)

    def maybe_route(
        self, force: bool = False, wait: bool = True, inbox_quiet: bool = False
    ) -> RouteResult | None:
        """Run the route pass when it is due (or waiting at all, with `force`; see
        `RouteQueue.due` for `inbox_quiet`). With `wait=False` (housekeeping) it is queued
        on the writer and this returns at once; with `wait` this thread scores what the
        pass needs scored (not the writer) and this returns the first slice's result (the
        next slices are queued)."""
        if not self.routes.claim(force, inbox_quiet):
            return None
        if not wait:
            self._queue_route(inline=False)
            return None
        try:
            got = self.writer.call(self._route_op, False)
            if isinstance(got, NeedScores):
                self.scorer.score_pass(got)
                got = self.writer.call(self._route_op, True)
        finally:
            self.routes.release()
        assert isinstance(got, RouteResult)  # an op asked to score inline always routes
        if got.more and not self.writer.closing:
            self.maybe_route(force=True, wait=False)
        return got

    def _queue_route(self, inline: bool) -> None:
        """The pass's next op, queued on the writer behind the writes waiting, and giving
        way to those that come (`store/writequeue.py`; the pass is claimed: `_route_done`
        releases it or hands it to the scorer)."""
        fut = self.writer.submit(self._route_op, inline, background=True)
        fut.add_done_callback(self._route_done)

    def _route_done(self, fut: Future[RouteResult | NeedScores]) -> None:
        exc = None if fut.cancelled() else fut.exception()
        if exc is not None or fut.cancelled():
            self.routes.release()
            log.warning("route pass failed (tried again later): %s", exc or "cancelled")
            return
        got = fut.result()
        if isinstance(got, NeedScores):
            if self.writer.closing or not self.scorer.for_pass(got, self._scored_for_pass):
                self.routes.release()  # closing: `close` runs the last pass itself
            return
        self.routes.release()
        if got.more and not self.writer.closing:
            # the next slice, behind the writes queued meanwhile
            self.maybe_route(force=True, wait=False)

    def _scored_for_pass(self, scored: bool) -> None:
        """On the scorer thread: the pass's answers are in (or scoring them failed: the op
        scores them itself, on the writer, rather than asking again)."""
        if self.writer.closing:
            self.routes.release()
            return
        self._queue_route(inline=not scored)

    def _route_op(self, ctx: WriteContext, inline: bool) -> RouteResult | NeedScores:
        # as for ingest: take in a hand edit first, routing rewrites cluster files
        self._outside_op(ctx)
        taken = self.routes.waiting()
        index = self.index
        known = self.routes.scores(taken, index.route_key)
        unscored = [
            m for name in taken for m in ctx.state.unsorted.get(name, ()) if m.id not in known
        ]
        if len(unscored) > ROUTE_SCORE_INLINE and not inline:
            return NeedScores(unscored, index)
        route = KeptRoutes(known, index.route_many)
        try:
            res = route_shards(
                ctx,
                taken,
                route,
                self.outside.blocked,
                self.config.session.max_cluster_size,
                ROUTE_SLICE_CLUSTERS,
            )
        except BaseException:
            self.counters["route_failures"] += 1
            self.routes.drop_pass()
            raise
        if not res.more:  # else the shards stay waiting: the next slice is queued
            self.routes.finished(taken)
        else:
            # the next slices take this pass's answers (made on the index it started
            # from, as one pass over the whole burst would), not `route_many` again
            self.routes.keep_pass(route.made)
        self.counters["route_passes"] += 1
        self.counters["routed"] += res.routed
        if res.commit:
            log.info(
                "route pass: %d memories into %d clusters (%s)",
                res.routed,
                res.clusters,
                res.commit[:10],
            )
        return res
