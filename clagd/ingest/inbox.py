"""The inbox: files dropped by agents become memories.

Events from watchdog are hints only (inotify can overflow; files arrive before the watcher
starts; writers write in place), so the truth is a scan of the folder. A file is read when
it is complete: renamed in (the Maildir contract), closed after its last write, or unchanged
for `settle_seconds`. A file that cannot become memories goes to `inbox/rejected/` with a
`.error` file beside it; it never disappears silently.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any

from clagd.errors import InboxRejected
from clagd.model import iso_utc, normalize_content, parse_time
from clagd.yamlio import YamlError, loads

log = logging.getLogger("clagd.inbox")

SUFFIXES = {".yaml", ".yml", ".json", ".md", ".txt"}
IGNORED_ENDINGS = (".tmp", ".part", ".swp", "~")
MAX_CONTENT_CHARS = 65_536
KNOWN_KEYS = {"content", "metadata", "created_at"}


def ignored_name(name: str) -> bool:
    return name.startswith(".") or name.endswith(IGNORED_ENDINGS)


@dataclass
class Item:
    content: str
    created_at: str | None
    metadata: dict[str, Any]


def _jsonable(value: Any, depth: int = 0) -> Any:
    """Metadata must round-trip through YAML and JSON: plain types only, bounded depth."""
    if depth > 20:
        raise InboxRejected("metadata is nested too deeply")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, list):
        return [_jsonable(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v, depth + 1) for k, v in value.items()}
    raise InboxRejected(f"metadata value of type {type(value).__name__} is not supported")


def _created_at(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        dt = value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    elif isinstance(value, date):
        dt = datetime(value.year, value.month, value.day, tzinfo=timezone.utc)
    else:
        parsed = parse_time(str(value))
        if parsed is None:
            raise InboxRejected(f"created_at {value!r} is not an ISO 8601 time")
        dt = parsed
    return iso_utc(dt)


def validate_item(raw: Any, where: str = "item") -> Item:
    """Check one mapping (from any format, or the socket `add` op) and normalise it."""
    if not isinstance(raw, dict):
        raise InboxRejected(f"{where}: expected a mapping with 'content', got {type(raw).__name__}")
    if "content" not in raw:
        raise InboxRejected(f"{where}: no 'content'")
    content = raw["content"]
    if not isinstance(content, str):
        raise InboxRejected(f"{where}: 'content' must be a string, got {type(content).__name__}")
    content = normalize_content(content)
    if not content:
        raise InboxRejected(f"{where}: 'content' is empty")
    if len(content) > MAX_CONTENT_CHARS:
        raise InboxRejected(f"{where}: 'content' is longer than {MAX_CONTENT_CHARS} characters")
    meta = raw.get("metadata") or {}
    if not isinstance(meta, dict):
        raise InboxRejected(f"{where}: 'metadata' must be a mapping")
    meta = dict(_jsonable(meta))
    for k, v in raw.items():  # other keys an agent wrote are kept as metadata
        if k not in KNOWN_KEYS:
            meta.setdefault(str(k), _jsonable(v))
    return Item(content, _created_at(raw.get("created_at")), meta)


def _items_from_data(data: Any, max_items: int) -> list[Item]:
    if isinstance(data, list):
        if not data:
            raise InboxRejected("the list is empty")
        if len(data) > max_items:
            raise InboxRejected(f"more than {max_items} items in one file")
        return [validate_item(d, f"item {i + 1}") for i, d in enumerate(data)]
    return [validate_item(data, "file")]


def parse_text(name: str, text: str, max_items: int = 10_000) -> list[Item]:
    """Parse one inbox file's text by its suffix; raise InboxRejected with the reason."""
    suffix = Path(name).suffix.lower()
    if suffix in (".yaml", ".yml"):
        try:
            data = loads(text)
        except YamlError as exc:
            raise InboxRejected(f"bad YAML: {exc}") from None
        return _items_from_data(data, max_items)
    if suffix == ".json":
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise InboxRejected(f"bad JSON: {exc}") from None
        return _items_from_data(data, max_items)
    if suffix == ".md":
        front: dict[str, Any] = {}
        body = text
        if text.startswith("---"):
            lines = text.split("\n")
            end = next(
                (i for i in range(1, len(lines)) if lines[i].strip() in ("---", "...")), None
            )
            if end is None:
                raise InboxRejected("front matter starts with '---' but never ends")
            try:
                fm = loads("\n".join(lines[1:end]))
            except YamlError as exc:
                raise InboxRejected(f"bad front matter: {exc}") from None
            if fm is not None and not isinstance(fm, dict):
                raise InboxRejected("front matter must be a mapping")
            front = fm or {}
            body = "\n".join(lines[end + 1 :])
        if "content" in front:
            raise InboxRejected("front matter must not have 'content': the body is the content")
        return [validate_item({**front, "content": body}, "file")]
    if suffix == ".txt":
        return [validate_item({"content": text}, "file")]
    raise InboxRejected(
        f"unsupported file type {suffix or '(none)'}: use .yaml .yml .json .md .txt"
    )


def read_file(path: Path, max_bytes: int, max_items: int) -> list[Item]:
    size = path.stat().st_size
    if size > max_bytes:
        raise InboxRejected(f"file is {size} bytes, over the limit of {max_bytes}")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InboxRejected(f"not UTF-8: {exc}") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    return parse_text(path.name, text, max_items)


@dataclass
class Seen:
    size: int
    mtime_ns: int


@dataclass
class InboxTracker:
    """Decides which inbox files are complete. Thread-safe: watchdog events arrive on the
    observer's thread, scans happen on the ingest thread."""

    root: Path
    settle_seconds: float = 1.0
    _seen: dict[str, Seen] = field(default_factory=dict)
    _complete: dict[str, float] = field(default_factory=dict)  # name -> when we learnt it
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def mark_complete(self, name: str) -> None:
        with self._lock:
            self._complete[name] = time.time()

    def forget(self, name: str) -> None:
        with self._lock:
            self._seen.pop(name, None)
            self._complete.pop(name, None)

    def candidates(self) -> list[str]:
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return []
        return sorted(
            e.name for e in entries if not ignored_name(e.name) and e.is_file(follow_symlinks=False)
        )

    def ready(self) -> tuple[list[str], int]:
        """(names complete now, how many more are still being written)."""
        now = time.time()
        ready, waiting = [], 0
        names = self.candidates()
        with self._lock:
            for name in names:
                try:
                    st = (self.root / name).stat()
                except FileNotFoundError:
                    continue
                prev = self._seen.get(name)
                closed = self._complete.get(name)
                if prev is None or (prev.size, prev.mtime_ns) != (st.st_size, st.st_mtime_ns):
                    self._seen[name] = Seen(st.st_size, st.st_mtime_ns)
                    stable = False
                else:
                    stable = True
                age = now - st.st_mtime_ns / 1e9
                if (closed is not None and closed * 1e9 >= st.st_mtime_ns) or (
                    stable and age >= self.settle_seconds
                ):
                    ready.append(name)
                else:
                    waiting += 1
            for gone in set(self._seen) - set(names):
                self._seen.pop(gone, None)
                self._complete.pop(gone, None)
        return ready, waiting


def reject(inbox: Path, name: str, reason: str) -> Path:
    """Move a file to inbox/rejected/ (never over another) with `<name>.error` beside it."""
    rejected = inbox / "rejected"
    rejected.mkdir(exist_ok=True)
    target = rejected / name
    n = 1
    while target.exists() or (rejected / (target.name + ".error")).exists():
        stem, dot, suffix = name.rpartition(".")
        target = rejected / (f"{stem}.{n}.{suffix}" if dot else f"{name}.{n}")
        n += 1
    os.replace(inbox / name, target)
    (rejected / (target.name + ".error")).write_text(
        f"{reason}\nrejected at {iso_utc()}\n",
        encoding="utf-8",
    )
    log.warning("rejected inbox file %s: %s", name, reason)
    return target
