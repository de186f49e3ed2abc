"""A follower: a read-only daemon serving a store from its primary's git remote.

One thread (`clagd-follow`) fetches the primary's branch every `replication.follow_seconds`
and whenever `sync` asks; when it moved, the writer moves the working copy to the fetched
commit and takes the move in as it takes in any outside commit (only the changed files are
re-read; the index is changed incrementally). A rewrite of the primary's history (a
`git push --force`, a purge) is followed exactly: the follower resets to it, prunes every
object the rewrite left unreachable and saves its warm start again, so that nothing the
rewrite removed stays in its files, objects or caches. A remote that is down never stops
queries: the last good state serves on, and `status.follow` shows the lag growing.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from clagd.engine.core import Engine
from clagd.errors import ClagdError
from clagd.store.follow import Fetched, FollowError, RemoteBranch, following
from clagd.store.writer import StoreChange, WriteContext

log = logging.getLogger("clagd.follow")

# the ops that change memories: a follower answers them `read_only`
WRITE_OPS = ("add", "forget", "update", "revert", "recluster", "archive")


def read_only_message(remote: str) -> str:
    return (
        f"this daemon is a read-only follower of {remote}: send writes to the primary "
        "(the daemon that pushes there)"
    )


def follow_prepare(store: Path, remote: str) -> None:
    """Before a follower's engine loads: the store follows `remote` (not another one, and it
    is not a primary), and its working copy is exactly HEAD (a hand edit there is dropped:
    a follower serves the primary's history)."""
    recorded = following(store)
    if recorded is None:
        raise FollowError(
            f"{store} is not a follower's store (it was not made by clagd follow); a primary "
            "is served with clagd run, a follower needs a new, empty folder"
        )
    if recorded != remote:
        raise FollowError(f"{store} follows {recorded}, not {remote}")
    RemoteBranch.discard_local(store)


@dataclass
class FollowStatus:
    """`status.follow`: where the follower is against its primary."""

    remote: str
    branch: str
    head: str | None = None  # the commit served
    remote_head: str | None = None  # the primary's, at the last successful fetch
    behind: int = 0  # commits of the primary not served yet, at that fetch
    last_fetch_at: float | None = None  # epoch seconds of the last successful fetch
    seconds_since_fetch: float | None = None
    fetches: int = 0
    failures: int = 0
    moves: int = 0  # times the working copy moved to a fetched commit
    rewrites: int = 0  # moves onto a history that does not contain the one served before
    last_error: str = ""
    # a follower does not watch its inbox: files dropped there stay, and are named here
    inbox_waiting: int = 0
    inbox_files: tuple[str, ...] = ()


class Follower:
    """Fetch, move, prune; the engine's writer does every change of the working tree."""

    def __init__(self, engine: Engine, remote: RemoteBranch, interval: float) -> None:
        self.engine = engine
        self.remote = remote
        self.interval = max(0.1, interval)
        self._lock = threading.Lock()  # one sync at a time (the loop's or a client's)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="clagd-follow", daemon=True)
        self.state = FollowStatus(remote.remote, remote.branch)

    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except Exception as exc:  # noqa: BLE001 - reported in status, tried again
                log.error("follow: %s", exc)
            self._wake.wait(self.interval)
            self._wake.clear()

    def sync(self) -> FollowStatus:
        """Fetch now and serve what was fetched (the `sync` op; the loop's every interval).
        A failure is kept in `last_error` and raised: the last good state serves on."""
        with self._lock:
            try:
                fetched = self.remote.fetch()
                self.remote.check_store(fetched.commit)
            except ClagdError as exc:
                self.state.failures += 1
                self.state.last_error = str(exc)
                raise
            self._fetched(fetched)
            if fetched.commit != self.engine.head:
                self._move(fetched)
            self.state.behind = 0
            self.state.last_error = ""
            return self.status()

    def _fetched(self, fetched: Fetched) -> None:
        s = self.state
        s.fetches += 1
        s.last_fetch_at = time.time()
        s.remote_head = fetched.commit
        s.behind = fetched.behind

    def _move(self, fetched: Fetched) -> None:
        rewrite = not fetched.contains_ours
        self.engine.writer.call(self._move_op, fetched)
        self.state.moves += 1
        if rewrite:
            # what the rewrite removed must not stay in objects, reflogs or the warm start
            self.state.rewrites += 1
            self.remote.prune()
            self.engine.save_warmstart()
            log.info("followed a rewrite of %s to %s", self.remote.remote, fetched.commit[:10])

    def _move_op(self, ctx: WriteContext, fetched: Fetched) -> None:
        rewrite = not fetched.contains_ours
        self.remote.move_to(fetched.commit)
        ctx.w.sync()  # the move, taken in as any outside commit (and published)
        if rewrite:
            # a whole new index: an incremental one keeps the removed memories' slots and
            # terms until its segments merge, and a rewrite's removals must leave no trace
            ctx.w.fragments.clear()  # the cached file texts of the removed memories too
            ctx.w.publish(StoreChange.whole(ctx.state, ctx.git.base))

    def status(self) -> FollowStatus:
        s = self.state
        ago = None if s.last_fetch_at is None else round(time.time() - s.last_fetch_at, 3)
        try:
            inbox = self.engine.paths.inbox
            names = sorted(p.name for p in inbox.iterdir() if p.is_file() or p.is_symlink())
        except OSError:
            names = []
        return replace(
            s,
            head=self.engine.head,
            seconds_since_fetch=ago,
            inbox_waiting=len(names),
            inbox_files=tuple(names[:20]),
        )
