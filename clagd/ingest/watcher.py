"""Watching the inbox: watchdog events wake the ingest loop; a periodic rescan catches
whatever events missed. Files leave the inbox only after the commit holding them exists."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from watchdog.events import (
    FileClosedEvent,
    FileCreatedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.polling import PollingObserver

from clagd.config import InboxConfig
from clagd.errors import ClagdError, InboxRejected
from clagd.ingest.inbox import InboxTracker, Item, ignored_name, read_file, reject

log = logging.getLogger("clagd.inbox")

# ingest(items, files) commits the items; raises on failure (files then stay in the inbox)
IngestFn = Callable[[list[Item], int], object]


# Only these events are delivered (on inotify the kernel is not even asked for the rest):
# reads, modifications and deletions, ours included, never wake or delay the ingest loop.
EVENTS: list[type[FileSystemEvent]] = [FileCreatedEvent, FileMovedEvent, FileClosedEvent]


class _Handler(FileSystemEventHandler):
    def __init__(self, watcher: InboxWatcher) -> None:
        self.w = watcher

    def on_any_event(self, event: FileSystemEvent) -> None:
        etype = event.event_type
        if event.is_directory or etype not in ("created", "moved", "closed"):
            return
        path = Path(str(event.dest_path if etype == "moved" else event.src_path))
        if path.parent != self.w.inbox:  # inbox/.tmp/, inbox/rejected/: never read
            return
        # renamed in (from inbox/.tmp/ or another name in the inbox) or closed after writing
        if etype in ("moved", "closed") and not ignored_name(path.name):
            self.w.tracker.mark_complete(path.name)
        self.w.poke()


class InboxWatcher:
    def __init__(self, inbox: Path, cfg: InboxConfig, ingest: IngestFn) -> None:
        self.inbox = Path(inbox).resolve()
        self.cfg = cfg
        self.ingest = ingest
        self.tracker = InboxTracker(self.inbox, cfg.settle_seconds)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._backlog: set[str] = set()  # files present at start
        self._backlog_done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="clagd-inbox", daemon=True)
        self._observer: Any = None  # a watchdog Observer or PollingObserver
        self._last_event = 0.0
        self.files_ingested = 0
        self.files_rejected = 0
        self.failures = 0
        self.consecutive_failures = 0
        self.last_error = ""
        self.paused_until = 0.0
        self.observer_kind = ""

    def start(self) -> None:
        self.inbox.mkdir(parents=True, exist_ok=True)
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
            obs = Observer() if kind == "inotify" else PollingObserver(timeout=1.0)
            try:
                # inotify watches the subfolders too, so that a rename out of inbox/.tmp/
                # arrives as a move (complete at once), not as a file created in the inbox
                # (complete only after settle_seconds). Polling would rarely see a file in
                # .tmp/ between two polls, and would walk inbox/rejected/ every second.
                obs.schedule(
                    _Handler(self),
                    str(self.inbox),
                    recursive=kind == "inotify",
                    event_filter=EVENTS,
                )
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

    def alive(self) -> bool:
        obs_ok = self._observer is None or self._observer.is_alive()
        return self._thread.is_alive() and obs_ok

    def poke(self) -> None:
        self._last_event = time.monotonic()
        self._wake.set()

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
            busy = self.process() > 0
            self._check_backlog()
        try:
            self.process()
        except Exception as exc:  # noqa: BLE001
            log.error("final inbox pass failed: %s", exc)

    def _debounce(self) -> None:
        """Let a burst of files finish arriving (one commit, not many), but never wait long."""
        started = time.monotonic()
        while (
            time.monotonic() - self._last_event < self.cfg.debounce_seconds
            and time.monotonic() - started < 5 * self.cfg.debounce_seconds + 1
            and not self._stop.is_set()
        ):
            time.sleep(self.cfg.debounce_seconds / 4)

    def process(self) -> int:
        """One pass: ingest every complete file, reject the malformed. Returns files handled."""
        if time.monotonic() < self.paused_until:
            return 0
        handled = 0
        while True:
            ready, waiting = self.tracker.ready()
            batch_items: list[Item] = []
            batch_files: list[str] = []
            for name in ready:
                path = self.inbox / name
                try:
                    items = read_file(path, self.cfg.max_file_bytes, self.cfg.max_items_per_file)
                except FileNotFoundError:
                    self.tracker.forget(name)
                    continue
                except InboxRejected as exc:
                    if self._maybe_incomplete(path, name):
                        waiting += 1
                        continue
                    self._reject(name, str(exc))
                    handled += 1
                    continue
                except OSError as exc:
                    self._reject(name, f"cannot read: {exc}")
                    handled += 1
                    continue
                batch_items.extend(items)
                batch_files.append(name)
                if len(batch_items) >= self.cfg.max_batch:
                    break
            if batch_files:
                try:
                    self.ingest(batch_items, len(batch_files))
                except ClagdError as exc:
                    self._fail(exc)
                    return handled
                except OSError as exc:
                    self._fail(exc)
                    return handled
                for name in batch_files:
                    try:
                        (self.inbox / name).unlink()
                    except FileNotFoundError:
                        pass
                    self.tracker.forget(name)
                self.files_ingested += len(batch_files)
                self.consecutive_failures = 0
                self.last_error = ""
                handled += len(batch_files)
            more = len(ready) > len(batch_files) and batch_files
            if not more:
                break
        if waiting:
            threading.Timer(self.cfg.settle_seconds / 2 + 0.05, self._wake.set).start()
        return handled

    def _maybe_incomplete(self, path: Path, name: str) -> bool:
        """A young file that fails to parse may still be being written in place: wait."""
        try:
            age = time.time() - path.stat().st_mtime
        except FileNotFoundError:
            return False
        return age < max(3.0, 3 * self.cfg.settle_seconds) and name not in self.tracker._complete

    def _reject(self, name: str, reason: str) -> None:
        try:
            reject(self.inbox, name, reason)
            self.files_rejected += 1
        except OSError as exc:
            log.error("cannot move %s to rejected/: %s", name, exc)
        self.tracker.forget(name)

    def _fail(self, exc: Exception) -> None:
        self.failures += 1
        self.consecutive_failures += 1
        self.last_error = str(exc)
        backoff = min(30.0, 0.25 * 2 ** min(self.consecutive_failures, 7))
        self.paused_until = time.monotonic() + backoff
        log.error("ingest failed, files stay in the inbox; retrying in %.1fs: %s", backoff, exc)
        threading.Timer(backoff + 0.05, self._wake.set).start()
