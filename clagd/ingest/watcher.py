"""Watching the inbox: watchdog events wake the ingest loop; a periodic rescan catches
whatever events missed. Files leave the inbox only after the commit holding them exists."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from watchdog.events import (
    FileClosedEvent,
    FileClosedNoWriteEvent,
    FileCreatedEvent,
    FileMovedEvent,
    FileOpenedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers.polling import PollingObserver

try:
    from watchdog.observers.inotify import InotifyObserver
except Exception:  # noqa: BLE001  # pragma: no cover - no inotify here (not Linux): polling
    InotifyObserver = None  # type: ignore[assignment,misc]

from clagd.config import InboxConfig
from clagd.errors import ClagdError, InboxRejected, Paused
from clagd.ingest.inbox import (
    InboxTracker,
    Item,
    ignored_name,
    name_scope,
    not_regular_file,
    read_file,
    reject,
)

log = logging.getLogger("clagd.inbox")

# ingest(items, files) commits the items; raises on failure (files then stay in the inbox)
IngestFn = Callable[[list[Item], int], object]


# The debounce adapts to how a burst arrives: the quiet a pass waits for is DEBOUNCE_GAPS
# times the longest of the last DEBOUNCE_WINDOW gaps between the burst's events, at least
# DEBOUNCE_MIN_SECONDS and at most `inbox.debounce_seconds` (which it is while there are
# fewer gaps than DEBOUNCE_MIN_GAPS: one file, or a slow writer's).
DEBOUNCE_GAPS = 4.0
DEBOUNCE_WINDOW = 16
DEBOUNCE_MIN_GAPS = 3
DEBOUNCE_MIN_SECONDS = 0.05


# While a burst still arrives (the debounce), the files already complete are read ahead;
# the pass takes a file's items from there when the file is unchanged since (same inode,
# size and mtime) and reads it again otherwise. A file modified less than this long ago is
# not read ahead: a change in the same tick of the kernel's coarse clock would keep its mtime.
READ_AHEAD_MIN_AGE = 0.02


def _identity(st: os.stat_result) -> tuple[int, int, int]:
    """What says a file is still the one that was read: inode, size, mtime."""
    return st.st_ino, st.st_size, st.st_mtime_ns


def quiet_needed(gaps: Sequence[float], debounce: float) -> float:
    """The quiet a pass waits for after the last event, given the gaps (seconds) between
    the recent events of this burst. A burst written in a tight loop (1,000 files in 0.15
    s) is complete ~0.05 s after its last file instead of `debounce` (0.3 s) after it; a
    writer with pauses between its files as long as `debounce / DEBOUNCE_GAPS` gets the
    whole `debounce`, as before."""
    if len(gaps) < DEBOUNCE_MIN_GAPS:
        return debounce
    return min(debounce, max(DEBOUNCE_MIN_SECONDS, DEBOUNCE_GAPS * max(gaps)))


# Only these events are delivered (on inotify the kernel is not even asked for the rest):
# reads, modifications and deletions, ours included, never wake or delay the ingest loop.
# Opens and closes without writing only update the tracker (a file open is not complete).
EVENTS: list[type[FileSystemEvent]] = [
    FileCreatedEvent,
    FileMovedEvent,
    FileClosedEvent,
    FileOpenedEvent,
    FileClosedNoWriteEvent,
]


class _Handler(FileSystemEventHandler):
    def __init__(self, watcher: InboxWatcher) -> None:
        self.w = watcher

    def on_any_event(self, event: FileSystemEvent) -> None:
        etype = event.event_type
        if event.is_directory or etype not in (
            "created",
            "moved",
            "closed",
            "opened",
            "closed_no_write",
        ):
            return
        path = Path(str(event.dest_path if etype == "moved" else event.src_path))
        if path.parent != self.w.inbox:  # inbox/.tmp/, inbox/rejected/: never read
            return
        if etype == "opened":
            self.w.tracker.opened(path.name)
            return
        if etype in ("closed", "closed_no_write"):
            self.w.tracker.closed(path.name)
            if etype == "closed_no_write":
                return
        # renamed in (from inbox/.tmp/ or another name in the inbox) or closed after writing
        if etype in ("moved", "closed") and not ignored_name(path.name):
            self.w.tracker.mark_complete(path.name)
        self.w.poke()


@dataclass(frozen=True)
class InboxStatus:
    """The `inbox` section of `status`: files taken in, read ahead during a burst's
    debounce, rejected; failed passes and why ingestion waits; files held open."""

    observer: str
    files_ingested: int
    files_read_ahead: int
    files_rejected: int
    rejected_refused: str  # why inbox/rejected/ was not used (another account's folder)
    failures: int
    last_error: str
    paused: str
    loop_errors: int
    held_open: tuple[str, ...]
    held_open_total: int


class InboxWatcher:
    def __init__(
        self,
        inbox: Path,
        cfg: InboxConfig,
        ingest: IngestFn,
        on_thread_start: Callable[[], None] | None = None,
    ) -> None:
        self.inbox = Path(inbox).resolve()
        self.on_thread_start = on_thread_start  # called first on the watcher's thread
        self.cfg = cfg
        self.ingest = ingest
        self.tracker = InboxTracker(self.inbox, cfg.settle_seconds, cfg.open_max_seconds)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._backlog: set[str] = set()  # files present at start
        self._backlog_done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="clagd-inbox", daemon=True)
        self._observer: Any = None  # a watchdog Observer or PollingObserver
        self._inbox_ino: int | None = None
        self._last_event = 0.0
        self._gaps: deque[float] = deque(maxlen=DEBOUNCE_WINDOW)  # of this burst's events
        # name -> (inode, size, mtime_ns, items): read during the debounce (`_read_ahead`)
        self._ahead: dict[str, tuple[int, int, int, list[Item]]] = {}
        self._ahead_items = 0
        self.read_ahead = 0  # files whose items a pass took from the read-ahead
        # called when a pass finds the inbox empty right after one that handled files
        self.on_drained: Callable[[], None] | None = None
        self._passing = False  # a pass runs, or one that handled files just ended
        self.files_ingested = 0
        self.files_rejected = 0
        self.rejected_refused = ""  # why inbox/rejected/ was not used (another's folder)
        self.failures = 0
        self.consecutive_failures = 0
        self.last_error = ""
        self._unmovable: set[str] = set()  # inbox files that could not be rejected (logged)
        self.paused_until = 0.0
        self.paused = ""  # why ingestion waits for the person (see errors.Paused)
        self.loop_errors = 0  # unexpected errors of the loop itself (it goes on)
        self.observer_kind = ""

    def _inode(self) -> int | None:
        try:
            return self.inbox.stat().st_ino
        except FileNotFoundError:
            return None

    def ensure_inbox(self) -> bool:
        """Re-create an inbox folder that was removed (`git clean -fdx`, `rm -rf inbox`) and
        watch the new one. True when it had to."""
        if self._inbox_ino is not None and self._inode() == self._inbox_ino:
            return False
        for d in (self.inbox, self.inbox / "rejected", self.inbox / ".tmp"):
            d.mkdir(parents=True, exist_ok=True)
        self._inbox_ino = self._inode()
        if self._observer is not None:
            self._observer.stop()
            self._observer = None
            self._start_observer()
        log.warning("the inbox folder was removed: re-created it and watch it again")
        self.poke()
        return True

    def start(self) -> None:
        self.inbox.mkdir(parents=True, exist_ok=True)
        self._inbox_ino = self._inode()
        self._backlog = set(self.tracker.candidates())
        if not self._backlog:
            self._backlog_done.set()
        self._start_observer()
        self._thread.start()
        # the first pass starts at once (no debounce): the files present at start are not a
        # burst still arriving, and the daemon serves only after they are taken in
        self._wake.set()

    def _start_observer(self) -> None:
        kinds = ["inotify", "polling"] if self.cfg.observer == "auto" else [self.cfg.observer]
        for kind in kinds:
            if kind == "inotify" and InotifyObserver is None:  # pragma: no cover - not Linux
                log.warning("inbox watcher inotify unavailable on this system")
                continue
            try:
                # inotify watches the inbox alone, with "full" events: a rename into it from
                # anywhere (inbox/.tmp/, another folder) arrives as a move (complete at once)
                # even though its other half is not watched. Watching the subfolders too
                # made every file written in .tmp/ five events, and watchdog pairs each
                # move's two halves by scanning its queue of pending events: a burst of
                # 1,000 renames cost it O(n^2), ~0.5 s of the daemon's GIL.
                obs = (
                    InotifyObserver(generate_full_events=True)
                    if kind == "inotify"
                    else PollingObserver(timeout=1.0)
                )
                obs.schedule(_Handler(self), str(self.inbox), recursive=False, event_filter=EVENTS)
                obs.start()
            except OSError as exc:  # e.g. the inotify watch limit
                log.warning("inbox watcher %s unavailable (%s)", kind, exc)
                continue
            self._observer = obs
            self.observer_kind = kind
            log.info(
                "watching %s (%s); rescanning every %ss", self.inbox, kind, self.cfg.rescan_seconds
            )
            return
        self.observer_kind = "rescan-only"
        log.warning("no inbox watcher: relying on the periodic rescan")

    def status(self) -> InboxStatus:
        return InboxStatus(
            self.observer_kind,
            self.files_ingested,
            self.read_ahead,
            self.files_rejected,
            self.rejected_refused,
            self.failures,
            self.last_error,
            self.paused,
            self.loop_errors,
            tuple(self.tracker.held_open),
            self.tracker.held_open_total,
        )

    def alive(self) -> bool:
        obs_ok = self._observer is None or self._observer.is_alive()
        return self._thread.is_alive() and obs_ok

    def poke(self) -> None:
        now = time.monotonic()
        gap = now - self._last_event
        if gap > self.cfg.debounce_seconds:
            self._gaps.clear()  # the first event of a new burst
        else:
            self._gaps.append(gap)
        self._last_event = now
        self._wake.set()

    def quiet_for(self) -> float:
        """Seconds since the inbox last saw a file arrive (0 while a pass runs, and until
        the pass after one that handled files has found the inbox empty): the route pass
        waits for a burst to end, not for a pause inside it. Once the inbox is drained the
        quiet counts from the burst's last file, not from the end of its commit."""
        return 0.0 if self._passing else max(0.0, time.monotonic() - self._last_event)

    def stop(self) -> None:
        """Stop watching, then ingest what is complete one last time."""
        self._stop.set()
        self._wake.set()
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(5)
        if self._thread.is_alive():
            self._thread.join(60)

    def wait_backlog(self, timeout: float) -> bool:
        """Wait until every file that was in the inbox at start has been ingested or
        rejected (or ingestion is paused by a failure). It ends even while new files keep
        arriving, so a restart under a steady stream still starts serving."""
        return self._backlog_done.wait(timeout)

    def _check_backlog(self) -> None:
        if self._backlog_done.is_set():
            return
        self._backlog = {n for n in self._backlog if (self.inbox / n).exists()}
        if not self._backlog or time.monotonic() < self.paused_until:
            self._backlog_done.set()

    def _run(self) -> None:
        if self.on_thread_start is not None:
            self.on_thread_start()
        busy = False
        while not self._stop.is_set():
            if not busy:
                self._wake.wait(self.cfg.rescan_seconds)
                if self._stop.is_set():
                    break
                self._debounce()
            # After a pass that handled files, the next one starts at once: what arrived
            # meanwhile is ready now, and the deletions of the last batch are no reason to
            # wait. Only a pass that found nothing waits for an event, a timer or the rescan.
            self._wake.clear()
            # quiet_for is 0 while a pass runs and until the pass after one that handled
            # files (it runs at once) finds nothing; a pass that handled nothing (that
            # check, a settle timer, the rescan) leaves the quiet since the last file
            was_busy, self._passing = self._passing, True
            try:
                busy = self.process() > 0
            except Exception as exc:  # noqa: BLE001 - the inbox loop never stops
                self.loop_errors += 1
                self._fail(exc)
                busy = False
            self._passing = busy
            if was_busy and not busy and self.on_drained is not None:
                self.on_drained()
            self._check_backlog()
        try:
            self.process()
        except Exception as exc:  # noqa: BLE001
            log.error("final inbox pass failed: %s", exc)

    def _debounce(self) -> None:
        """Let a burst of files finish arriving (one commit, not many), but never wait long:
        until the inbox has been quiet for `quiet_needed`, re-checked at least every
        DEBOUNCE_MIN_SECONDS (the events that come meanwhile shorten or lengthen it)."""
        started = time.monotonic()
        longest = 5 * self.cfg.debounce_seconds + 1
        while not self._stop.is_set():
            now = time.monotonic()
            need = quiet_needed(tuple(self._gaps), self.cfg.debounce_seconds)
            left = min(need - (now - self._last_event), longest - (now - started))
            if left <= 0:
                return
            until = now + min(left, DEBOUNCE_MIN_SECONDS)
            self._read_ahead(until)
            time.sleep(max(0.0, until - time.monotonic()) + 0.001)

    def _read_ahead(self, until: float) -> None:
        """Read the files that are complete already, until `until` (monotonic) or until a
        batch's worth of items is waiting. Only what reads cleanly is kept: a file that
        fails is read again (and rejected, with its reason) by the pass."""
        if time.monotonic() < self.paused_until:
            return
        try:
            ready, _waiting = self.tracker.ready()
        except OSError:
            return
        for name in ready:
            if time.monotonic() >= until or self._ahead_items >= self.cfg.max_batch:
                return
            if name in self._ahead:
                continue
            path = self.inbox / name
            try:
                st = os.stat(path)
                if time.time() - st.st_mtime < READ_AHEAD_MIN_AGE:
                    continue
                items = read_file(
                    path,
                    self.cfg.max_file_bytes,
                    self.cfg.max_items_per_file,
                    scope=name_scope(name),
                    follow=False,
                )
                again = os.stat(path)
            except Exception:  # noqa: BLE001 - the pass reads it again and says what is wrong
                continue
            key = _identity(st)
            if key == _identity(again):
                self._ahead[name] = (*key, items)
                self._ahead_items += len(items)

    def _take_ahead(self, path: Path, name: str) -> list[Item] | None:
        """The items read ahead for this file, if it is still exactly the file they were
        read from."""
        got = self._ahead.pop(name, None)
        if got is None:
            return None
        self._ahead_items -= len(got[3])
        try:
            st = os.stat(path)
        except OSError:
            return None  # read again, which says why
        if _identity(st) != got[:3]:
            return None
        self.read_ahead += 1
        return got[3]

    def process(self) -> int:
        """One pass: ingest every complete file, reject the malformed. Returns files handled."""
        try:
            return self._process()
        finally:
            self._ahead.clear()  # what the pass did not take (it paused): read again later
            self._ahead_items = 0

    def _process(self) -> int:
        if time.monotonic() < self.paused_until:
            return 0
        handled = self._reject_specials()
        while True:
            ready, waiting = self.tracker.ready()
            batch: list[tuple[str, list[Item]]] = []
            n_items = 0
            for name in ready:
                items, outcome = self._read(name)
                if outcome == "wait":
                    waiting += 1
                elif outcome == "rejected":
                    handled += 1
                elif items:
                    batch.append((name, items))
                    n_items += len(items)
                    if n_items >= self.cfg.max_batch:
                        break
            if batch:
                done = self._ingest_batch(batch)
                if done is None:
                    return handled
                handled += done
            if not (len(ready) > len(batch) and batch):
                break
        if waiting:
            threading.Timer(self.cfg.settle_seconds / 2 + 0.05, self._wake.set).start()
        return handled

    def _reject_specials(self) -> int:
        """Move every inbox entry that is not a regular file (a FIFO, a symlink, a socket,
        a device, a folder, a hard-linked file) to rejected/ with what it is: never read
        (a FIFO would block the watcher), never left in the inbox unreported."""
        specials = self.tracker.specials()
        for name, kind in specials:
            self._reject(name, not_regular_file(name, kind))
        return len(specials)

    def _read(self, name: str) -> tuple[list[Item], str]:
        """One file's items, or why not: ("", "wait") still being written, "rejected" moved
        to rejected/ with its reason, "gone". Any error from a file's content rejects it."""
        path = self.inbox / name
        ahead = self._take_ahead(path, name)
        if ahead is not None:
            return ahead, "ok"
        try:
            cfg = self.cfg
            scope = name_scope(name)
            items = read_file(
                path, cfg.max_file_bytes, cfg.max_items_per_file, scope=scope, follow=False
            )
            return items, "ok"
        except FileNotFoundError:
            self.tracker.forget(name)
            return [], "gone"
        except InboxRejected as exc:
            if self._maybe_incomplete(path, name):
                return [], "wait"
            self._reject(name, str(exc))
        except OSError as exc:
            self._reject(name, f"cannot read: {exc}")
        except Exception as exc:  # noqa: BLE001 - whatever a file holds, it cannot stop us
            self._reject(name, f"cannot be read as memories: {type(exc).__name__}: {exc}")
        return [], "rejected"

    def _ingest_batch(self, batch: list[tuple[str, list[Item]]]) -> int | None:
        """Commit the files' items together; when that fails because of what one of them
        holds (not the store's state), one file at a time, rejecting the culprits. Returns
        the files handled, or None when ingestion must wait (paused, environment)."""
        try:
            self.ingest([it for _n, items in batch for it in items], len(batch))
        except Exception as exc:  # noqa: BLE001 - sorted below
            if _environmental(exc) or len(batch) == 1:
                if _environmental(exc):
                    self._fail(exc)
                    return None
                self._reject(batch[0][0], f"cannot be stored: {type(exc).__name__}: {exc}")
                return 1
            log.warning("a batch of %d files failed (%s); one file at a time", len(batch), exc)
            handled = 0
            for one in batch:
                done = self._ingest_batch([one])
                if done is None:
                    return handled or None
                handled += done
            return handled
        for name, _items in batch:
            try:
                (self.inbox / name).unlink()
            except FileNotFoundError:
                pass
            self.tracker.forget(name)
        self.files_ingested += len(batch)
        self.consecutive_failures = 0
        self.last_error = ""
        self.paused = ""
        return len(batch)

    def _maybe_incomplete(self, path: Path, name: str) -> bool:
        """A young file that fails to parse may still be being written in place: wait."""
        try:
            age = time.time() - path.stat().st_mtime
        except FileNotFoundError:
            return False
        return age < max(3.0, 3 * self.cfg.settle_seconds) and name not in self.tracker._complete

    def _reject(self, name: str, reason: str) -> None:
        try:
            self.rejected_refused = reject(self.inbox, name, reason).refused
            self.files_rejected += 1
        except OSError as exc:
            # %r: a newline in a name cannot forge a log line; logged once per name, and
            # shown in status until a pass goes through
            self.last_error = f"cannot move {name!r} to rejected/: {exc}"
            if name not in self._unmovable:
                self._unmovable.add(name)
                log.error("%s", self.last_error)
        self.tracker.forget(name)

    def _fail(self, exc: Exception) -> None:
        """Ingestion failed for a reason outside the files (git lock, read-only or full
        disk, the person's merge): the files stay, the pass is retried with back-off."""
        if isinstance(exc, Paused):
            # the person's git holds the store: check again soon, count it once
            if not self.paused:
                self.failures += 1
            self.paused = self.last_error = str(exc)
            self.paused_until = time.monotonic() + 1.0
            threading.Timer(1.05, self._wake.set).start()
            return
        self.failures += 1
        self.consecutive_failures += 1
        self.last_error = (
            f"{type(exc).__name__}: {exc}" if not isinstance(exc, ClagdError) else str(exc)
        )
        backoff = min(30.0, 0.25 * 2 ** min(self.consecutive_failures, 7))
        self.paused_until = time.monotonic() + backoff
        log.error("ingest failed, files stay in the inbox; retrying in %.1fs: %s", backoff, exc)
        threading.Timer(backoff + 0.05, self._wake.set).start()


def _environmental(exc: BaseException) -> bool:
    """A failure of the store or the system (retry later), not of a file's content."""
    if isinstance(exc, InboxRejected):
        return False
    return isinstance(exc, (OSError, ClagdError))
