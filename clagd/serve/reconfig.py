"""A `clagd.yaml` changed while the daemon runs: validated at once, applied where the
running parts read the value at each use, otherwise reported as "restart needed"; an
invalid file is reported with its exact error and the running configuration stays."""

from __future__ import annotations

import logging
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from clagd.config import Config, load_config
from clagd.errors import ConfigError

log = logging.getLogger("clagd")

# keys that the running daemon reads afresh at each use (so a new value takes effect)
LIVE = {
    "session.memory_add_threshold",
    "session.dialogue_round_threshold",
    "archive.cold_after_days",
    "archive.min_size",
    "archive.thaw_on_hit",
    "inbox.debounce_seconds",
    "inbox.settle_seconds",
    "inbox.max_file_bytes",
    "inbox.max_items_per_file",
    "inbox.max_batch",
    "ingest.route_inline_max",
}


def _flat(d: dict[str, object], prefix: str = "") -> dict[str, object]:
    """The config's values by dotted key (`inbox.settle_seconds`)."""
    out: dict[str, object] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict):
            out.update(_flat(v, key))
        else:
            out[key] = v
    return out


@dataclass(frozen=True)
class ConfigStatus:
    """The `config` section of `status`: the last reload's error, the keys it applied and
    those that need a restart."""

    file: str
    error: str
    applied: tuple[str, ...]
    restart_needed: tuple[str, ...]


class ConfigReloader:
    """Watches `<store>/clagd.yaml` (by mtime and size, from housekeeping)."""

    def __init__(self, store: Path, config: Config) -> None:
        self.path = Path(store) / "clagd.yaml"
        self.config = config
        self._sig = self._signature()
        self.error = ""
        self.applied: list[str] = []
        self.restart_needed: list[str] = []
        self._lock = threading.Lock()  # housekeeping and a SIGHUP may both reload

    def _signature(self) -> tuple[int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def check(self, force: bool = False) -> bool:
        """Take in a changed file (any file when `force`: a SIGHUP); True when it changed
        or was forced."""
        with self._lock:
            sig = self._signature()
            if sig == self._sig and not force:
                return False
            self._sig = sig
            self._reload()
            return True

    def _reload(self) -> None:
        try:
            new = load_config(self.path.parent)
        except ConfigError as exc:
            self.error = str(exc)
            log.error("clagd.yaml changed but is invalid (still running with the old): %s", exc)
            return
        self.error = ""
        old_flat, new_flat = _flat(asdict(self.config)), _flat(asdict(new))
        changed = sorted(k for k in new_flat if new_flat[k] != old_flat.get(k))
        applied = [k for k in changed if k in LIVE]
        for key in applied:
            section, _, name = key.partition(".")
            setattr(getattr(self.config, section), name, new_flat[key])
        self.applied = sorted(set(self.applied) | set(applied))
        pending = {k for k in self.restart_needed if new_flat[k] != old_flat.get(k)}
        self.restart_needed = sorted(pending | {k for k in changed if k not in LIVE})
        if changed:
            log.info(
                "clagd.yaml changed: applied %s; restart needed for %s",
                ", ".join(applied) or "nothing",
                ", ".join(self.restart_needed) or "nothing",
            )

    def status(self) -> ConfigStatus:
        return ConfigStatus(
            str(self.path), self.error, tuple(self.applied), tuple(self.restart_needed)
        )
