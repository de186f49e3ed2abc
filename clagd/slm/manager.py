"""Which SLM backend is active, and why: chosen at start, re-checked periodically."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from clagd.config import Config
from clagd.slm.base import Backend, select_backend

log = logging.getLogger("clagd.slm")


class BackendManager:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.backend: Backend | None = None
        self.reason = "not checked yet"
        self.checked_at: float | None = None
        self.failures = 0
        self.last_error = ""
        self._lock = threading.Lock()

    def recheck(self) -> Backend | None:
        with self._lock:
            before = self.backend.name if self.backend else "none"
            try:
                self.backend, self.reason = select_backend(self.config, self.backend)
            except Exception as exc:  # noqa: BLE001 - a broken backend means: no model
                self.backend, self.reason = None, f"backend check failed: {exc}"
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

    def status(self) -> dict[str, Any]:
        b = self.backend
        return {
            "configured": self.config.backend.kind,
            "active": b.name if b else "none",
            "model": b.model if b else None,
            "reason": self.reason,
            "checked_at": self.checked_at,
            "failures": self.failures,
            "last_error": self.last_error,
        }

    def close(self) -> None:
        with self._lock:
            if self.backend is not None:
                self.backend.close()
                self.backend = None
