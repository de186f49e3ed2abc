"""How nice the daemon's organizing threads run (`server.background_nice`).

Organizing is background work once queries have processes of their own: on a busy CPU the
kernel should give a query the core before the writer, a session or git. Linux nice is per
thread, so the threads that organize are registered where they start, each on itself
(`OrganizingThreads.enter`, handed down as the `on_thread_start` of the writer, the inbox
watcher and the scheduler's pools), never found by name: a renamed thread, ours or a
library's, cannot silently stay at full priority. A thread that registers after `lower`
was called takes the lower priority at once; the threads and processes a registered thread
starts inherit it.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref

log = logging.getLogger("clagd")


class OrganizingThreads:
    """The threads that organize (the writer and its git thread, the inbox watcher, the
    scheduler's job threads), and the niceness they run at."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._threads: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
        self._level: int | None = None  # the niceness to run at (None: as started)

    def enter(self) -> None:
        """Register the calling thread (called first thing on it)."""
        with self._lock:
            self._threads.add(threading.current_thread())
            level = self._level
        if level is not None:
            _renice(threading.get_native_id(), level)

    def lower(self, nice: int) -> int:
        """Run every registered thread, and every one registered later, `nice` steps nicer
        than the caller, up to 19. Returns how many threads were changed; a failure changes
        nothing and is logged."""
        if nice <= 0:
            return 0
        level = min(19, os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) + nice)
        with self._lock:
            self._level = level
        return sum(_renice(t.native_id, level) for t in self.threads() if t.native_id is not None)

    def threads(self) -> list[threading.Thread]:
        """The registered threads still running."""
        with self._lock:
            return [t for t in self._threads if t.is_alive()]


def _renice(tid: int, level: int) -> bool:
    """Make thread `tid` at least as nice as `level`."""
    try:
        if os.getpriority(os.PRIO_PROCESS, tid) < level:
            os.setpriority(os.PRIO_PROCESS, tid, level)
        return True
    except OSError as exc:  # a thread that just ended, or a system that refuses
        log.debug("cannot renice thread %s: %s", tid, exc)
        return False
