"""Access statistics: runtime state that changes on every query, saved periodically, never
committed. They live in `.git/clagd-stats.json`, beside the lock, where `git clean -fdx`
and `rm -rf .clagd` do not reach (a store's `.clagd/stats.json` of before is taken over
once and removed).

No statistics means "unknown", not "cold": `since` is when these statistics began (their
file was made, or found missing), and a cluster never read since then counts as read at
that time, so a store that lost them archives nothing by their absence."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

from clagd.store.durable import atomic_write_text

log = logging.getLogger("clagd.stats")


STATS_FILE = "clagd-stats.json"  # in .git/: no cleaning of the working tree removes it


class AccessStats:
    def __init__(self, path: Path, legacy: Path | None = None) -> None:
        self.path = Path(path)
        self.legacy = Path(legacy) if legacy is not None else None  # `.clagd/stats.json`
        self._lock = threading.Lock()
        self.memories: dict[str, list[float]] = {}  # id -> [access_count, last_accessed]
        self.clusters: dict[str, list[float]] = {}
        self.since = time.time()  # when these statistics began (see the module's docstring)
        self._dirty = False
        self.load()

    def load(self) -> None:
        source = self.path
        if not source.exists() and self.legacy is not None and self.legacy.exists():
            source = self.legacy  # taken over: saved to `path`, then removed
        try:
            data = json.loads(source.read_text(encoding="utf-8"))
            self.memories = {
                str(k): [float(v[0]), float(v[1])] for k, v in data.get("memories", {}).items()
            }
            self.clusters = {
                str(k): [float(v[0]), float(v[1])] for k, v in data.get("clusters", {}).items()
            }
            since = data.get("since")
            if isinstance(since, (int, float)) and 0 < since <= self.since:
                self.since = float(since)
            else:
                self._dirty = True  # a file of before: they count from now on
        except FileNotFoundError:
            self._dirty = True  # none at all: unknown until now, saved with `since`
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
            log.warning("ignoring unreadable access statistics %s: %s", source, exc)
            self._dirty = True
        if source != self.path:
            self._dirty = True

    def record(
        self, memory_ids: list[str], cluster_ids: list[str], when: float | None = None
    ) -> None:
        now = time.time() if when is None else when
        with self._lock:
            for key, table in ((memory_ids, self.memories), (cluster_ids, self.clusters)):
                for k in key:
                    entry = table.setdefault(k, [0.0, now])
                    entry[0] += 1
                    entry[1] = now
            self._dirty = True

    def touch_cluster(self, cid: str, when: float | None = None) -> None:
        """Mark a cluster as used now without counting an access (e.g. just thawed)."""
        now = time.time() if when is None else when
        with self._lock:
            entry = self.clusters.setdefault(cid, [0.0, now])
            entry[1] = now
            self._dirty = True

    def cluster(self, cid: str) -> tuple[int, float | None]:
        with self._lock:
            e = self.clusters.get(cid)
            return (int(e[0]), e[1]) if e else (0, None)

    def memory(self, mid: str) -> tuple[int, float | None]:
        with self._lock:
            e = self.memories.get(mid)
            return (int(e[0]), e[1]) if e else (0, None)

    def most_accessed(self, n: int) -> list[str]:
        with self._lock:
            return [k for k, _ in sorted(self.memories.items(), key=lambda kv: -kv[1][0])[:n]]

    def forget(self, memory_ids: set[str]) -> None:
        """Drop these memories' entries and save at once (a forget leaves no trace here)."""
        with self._lock:
            for mid in memory_ids:
                self.memories.pop(mid, None)
            self._dirty = True
        self.save()

    def save(self) -> bool:
        with self._lock:
            if not self._dirty:
                return False
            data = {"since": self.since, "memories": self.memories, "clusters": self.clusters}
            text = json.dumps(data, separators=(",", ":"))
            self._dirty = False
        atomic_write_text(self.path, text)
        if self.legacy is not None:
            self.legacy.unlink(missing_ok=True)  # taken over: no second copy (a forget)
        return True
