"""Which SLM backend is active, and why: chosen at start, re-checked periodically."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from clagd.config import Config
from clagd.slm.base import Backend, select_backend

log = logging.getLogger("clagd.slm")


@dataclass(frozen=True)
class BackendStatus:
    """The `backend` section of `status`: the backend configured and the one in use (and
    why), its failures; `gate`: every model's measured competence (the daemon adds it)."""

    configured: str
    active: str
    model: str | None
    reason: str
    checked_at: float | None
    failures: int
    last_error: str
    gate: tuple[Mapping[str, object], ...] = ()


class BackendManager:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.backend: Backend | None = None
        self.reason = "not checked yet"
        self.checked_at: float | None = None
        self.failures = 0
        self.last_error = ""
        self._lock = threading.Lock()
        self._closed = False

    def recheck(self) -> Backend | None:
        with self._lock:
            before = self.backend.name if self.backend else "none"
            try:
                self.backend, self.reason = select_backend(self.config, self.backend)
            except Exception as exc:  # noqa: BLE001 - a broken backend means: no model
                self.backend, self.reason = None, f"backend check failed: {exc}"
            if self._closed:  # the daemon stopped while this check ran: close its choice
                self._close_locked()
                return None
            self.checked_at = time.time()
            after = self.backend.name if self.backend else "none"
            if after != before:
                log.info("SLM backend: %s (%s)", after, self.reason)
            return self.backend

    def get(self) -> Backend | None:
        if self.checked_at is None:
            return self.recheck()
        return self.backend

    def record_failure(self, message: str) -> None:
        self.failures += 1
        self.last_error = message

    def status(self) -> BackendStatus:
        b = self.backend
        return BackendStatus(
            self.config.backend.kind,
            b.name if b else "none",
            b.model if b else None,
            self.reason,
            self.checked_at,
            self.failures,
            self.last_error,
        )

    def close(self) -> None:
        """Close the backend. A check in progress (an Ollama probe, imports) is not waited
        for: it closes what it chose when it ends (`recheck`)."""
        self._closed = True
        if not self._lock.acquire(blocking=False):
            return
        try:
            self._close_locked()
        finally:
            self._lock.release()

    def _close_locked(self) -> None:
        if self.backend is not None:
            self.backend.close()
            self.backend = None
