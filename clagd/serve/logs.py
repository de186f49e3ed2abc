"""Logging: plain lines on stderr, fit for journald (no colours; no timestamps under it)."""

from __future__ import annotations

import logging
import os
import sys


def setup_logging(level: str = "INFO") -> None:
    under_journal = bool(os.environ.get("JOURNAL_STREAM"))
    fmt = (
        "%(levelname)s %(name)s: %(message)s"
        if under_journal
        else "%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(fmt, "%Y-%m-%dT%H:%M:%S"))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("watchdog").setLevel(logging.WARNING)
