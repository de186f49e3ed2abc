"""The inbox: files dropped by agents become memories.

Events from watchdog are hints only (inotify can overflow; files arrive before the watcher
starts; writers write in place), so the truth is a scan of the folder. A file is read when
it is complete: renamed in (the Maildir contract), closed after its last write, or unchanged
for `settle_seconds`. A file that cannot become memories goes to `inbox/rejected/` with a
`.error` file beside it; it never disappears silently.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any

from clagd.errors import BadScope, InboxRejected
from clagd.model import LINK_KEYS, iso_utc, normalize_content, parse_time
from clagd.protocol import user_name
from clagd.scopes import DEFAULT_SCOPE, SCOPE_RE, check_scope
from clagd.store.special import kind_of, special_kind
from clagd.yamlio import YamlError, loads

log = logging.getLogger("clagd.inbox")

SUFFIXES = {".yaml", ".yml", ".json", ".jsonl", ".md", ".txt"}
IGNORED_ENDINGS = (".tmp", ".part", ".swp", "~")
MAX_CONTENT_CHARS = 65_536
KNOWN_KEYS = {"content", "metadata", "created_at", "scope"}


def ignored_name(name: str) -> bool:
    return name.startswith(".") or name.endswith(IGNORED_ENDINGS)


# inbox/<scope>/: a file dropped there belongs to that scope (`name_scope`); rejected/ and
# hidden folders (.tmp/) are never a scope's
NOT_SCOPE_DIRS = frozenset({"rejected"})


def scope_dirs(root: Path) -> list[str]:
    """The scope folders of an inbox: real folders (not links) named as a scope is."""
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    return sorted(
        e.name
        for e in entries
        if e.name not in NOT_SCOPE_DIRS
        and SCOPE_RE.fullmatch(e.name)
        and e.is_dir(follow_symlinks=False)
    )


def name_scope(name: str) -> str | None:
    """The scope of an inbox file by where it lies: `bob/x.md` is scope bob's; a file in
    the inbox itself has none (its items name their own, else the default)."""
    folder, sep, _ = name.partition("/")
    return folder if sep else None


@dataclass
class Item:
    content: str
    created_at: str | None
    metadata: dict[str, Any]
    scope: str = DEFAULT_SCOPE
    # set by `validate_item`: `content` is normalized already (its id is only a hash)
    normalized: bool = field(default=False, compare=False)
    # a conversation turn's role (`ingest.turns`): the engine stores the roles configured
    role: str | None = field(default=None, compare=False)


MAX_INT = 2**63  # a metadata integer must fit a JSON number every reader can take
# metadata.importance: one scale everywhere, the one retrieval reads (retrieval/index.py:
# confidence, 0.5 when absent); checked on every path a memory arrives by
IMPORTANCE_MIN, IMPORTANCE_MAX, IMPORTANCE_DEFAULT = 0.0, 1.0, 0.5
IMPORTANCE_SCALE = "a number from 0 (unimportant) to 1 (vital); 0.5 when left out"


def check_importance(value: Any, where: str = "metadata") -> None:
    """Raise InboxRejected unless `value` is on the importance scale."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not IMPORTANCE_MIN <= value <= IMPORTANCE_MAX:
        raise InboxRejected(f"{where}: 'importance' must be {IMPORTANCE_SCALE}, got {value!r}")


def check_text(text: str, what: str) -> str:
    """Text that YAML, JSON, git and every reader can store as UTF-8: no lone surrogates
    (from a broken encoder), no NUL (a UTF-16 file read as UTF-8 is full of them)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InboxRejected(
            f"{what} holds a lone surrogate (text from a broken UTF-16 encoder)"
        ) from None
    if "\x00" in text:
        raise InboxRejected(f"{what} holds a NUL character (a UTF-16 file? save it as UTF-8)")
    return text


def _jsonable(value: Any, depth: int = 0) -> Any:
    """Metadata must round-trip through YAML and JSON: plain types only, bounded depth,
    integers that fit 64 bits, finite floats, text without NUL or lone surrogates."""
    if depth > 20:
        raise InboxRejected("metadata is nested too deeply")
    if isinstance(value, str):
        return check_text(value, "metadata")
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        if not -MAX_INT <= value < MAX_INT:
            raise InboxRejected("a metadata integer is too large (over 64 bits)")
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise InboxRejected("a metadata number is NaN or infinite (not valid JSON)")
        return value
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, list):
        return [_jsonable(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {
            check_text(str(k), "a metadata key"): _jsonable(v, depth + 1) for k, v in value.items()
        }
    raise InboxRejected(f"metadata value of type {type(value).__name__} is not supported")


def _created_at(value: Any) -> str | None:
    try:
        return _created_at_utc(value)
    except (OverflowError, ValueError) as exc:  # e.g. 9999-12-31T23:59:59-14:00
        raise InboxRejected(f"created_at {str(value)[:80]!r} is out of range ({exc})") from None


def _created_at_utc(value: Any) -> str | None:
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


def item_scope(raw: dict[str, Any], where: str, scope: str | None) -> str:
    """The scope of one item: its own `scope:` key, else `scope` (the file's folder,
    `inbox/<scope>/`, or the request's), else the default. A bad name, or an item naming
    another scope than its folder's, is refused (code `bad_scope`) naming both."""
    given = raw.get("scope")
    try:
        own = None if given is None else check_scope(given)
        outer = None if scope is None else check_scope(scope)
    except BadScope as exc:
        raise InboxRejected(f"{where}: {exc}", BadScope.code) from None
    if own is not None and outer is not None and own != outer:
        raise InboxRejected(
            f"{where}: 'scope' is {own!r} but it came in for scope {outer!r} "
            "(its inbox folder or the request): one scope per item",
            BadScope.code,
        )
    return own or outer or DEFAULT_SCOPE


def validate_item(raw: Any, where: str = "item", scope: str | None = None) -> Item:
    """Check one mapping (from any format, or the socket `add` op) and normalise it.
    `scope`: the scope the item arrives in (its inbox folder's, the request's); an item's
    own `scope:` key must agree with it (`item_scope`)."""
    if not isinstance(raw, dict):
        raise InboxRejected(f"{where}: expected a mapping with 'content', got {type(raw).__name__}")
    if "content" not in raw:
        raise InboxRejected(f"{where}: no 'content'")
    content = raw["content"]
    if not isinstance(content, str):
        raise InboxRejected(f"{where}: 'content' must be a string, got {type(content).__name__}")
    content = normalize_content(check_text(content, f"{where}: 'content'"))
    if not content:
        raise InboxRejected(f"{where}: 'content' is empty")
    if len(content) > MAX_CONTENT_CHARS:
        raise InboxRejected(
            f"{where}: 'content' is {len(content)} characters, over the limit of "
            f"{MAX_CONTENT_CHARS} per memory (fixed, no setting raises it): split it into "
            "several memories"
        )
    meta = raw.get("metadata") or {}
    if not isinstance(meta, dict):
        raise InboxRejected(f"{where}: 'metadata' must be a mapping")
    meta = dict(_jsonable(meta))
    for k, v in raw.items():  # other keys an agent wrote are kept as metadata
        if k not in KNOWN_KEYS:
            meta.setdefault(str(k), _jsonable(v))
    if "importance" in meta:
        check_importance(meta["importance"], f"{where}: metadata")
    for key in LINK_KEYS:
        if key in meta:
            raise InboxRejected(
                f"{where}: '{key}' is clagd's own link between memories; to change a "
                "memory use `clagd update ID TEXT` (socket op `update`)"
            )
    return Item(
        content,
        _created_at(raw.get("created_at")),
        meta,
        item_scope(raw, where, scope),
        normalized=True,
    )


def _items_from_data(data: Any, max_items: int, scope: str | None) -> list[Item]:
    """A file's items: a mapping or a list of them, each a memory or a chat message (a
    `role` key; `ingest.turns`), or a conversation (`{"messages": [...], ...}`)."""
    from clagd.ingest.turns import conversation_items, is_conversation, is_turn, turn_item

    if is_conversation(data):
        if isinstance(data["messages"], list) and len(data["messages"]) > max_items:
            raise InboxRejected(f"more than {max_items} messages in one file")
        return conversation_items(data, scope=scope)
    if isinstance(data, list):
        if not data:
            raise InboxRejected("the list is empty")
        if len(data) > max_items:
            raise InboxRejected(f"more than {max_items} items in one file")
        return [
            turn_item(d, f"message {i + 1}", scope=scope)
            if is_turn(d)
            else validate_item(d, f"item {i + 1}", scope)
            for i, d in enumerate(data)
        ]
    if is_turn(data):
        return [turn_item(data, "file", scope=scope)]
    return [validate_item(data, "file", scope)]


def _json_lines(text: str) -> list[Any]:
    """A `.jsonl` file: one JSON object per line (blank lines skipped); a bad line is named
    by its number."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except (json.JSONDecodeError, RecursionError) as exc:
            raise InboxRejected(f"bad JSON on line {n}: {exc}") from None
    return out


def parse_text(
    name: str, text: str, max_items: int = 10_000, scope: str | None = None
) -> list[Item]:
    """Parse one inbox file's text by its suffix; raise InboxRejected with the reason,
    whatever the parsers raise (deep nesting, a 5,000-digit integer, a date out of range).
    `scope`: the scope of the file's items unless each names its own (`validate_item`)."""
    try:
        return _parse_text(name, text, max_items, scope)
    except InboxRejected:
        raise
    except RecursionError:
        raise InboxRejected("nested too deeply") from None
    except (ValueError, OverflowError, TypeError, UnicodeError) as exc:
        raise InboxRejected(f"cannot be parsed: {type(exc).__name__}: {exc}"[:300]) from None


def _parse_text(name: str, text: str, max_items: int, scope: str | None) -> list[Item]:
    suffix = Path(name).suffix.lower()
    if suffix in (".yaml", ".yml"):
        try:
            data = loads(text)
        except YamlError as exc:
            raise InboxRejected(f"bad YAML: {exc}") from None
        return _items_from_data(data, max_items, scope)
    if suffix == ".json":
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise InboxRejected(f"bad JSON: {exc}") from None
        return _items_from_data(data, max_items, scope)
    if suffix == ".jsonl":
        return _items_from_data(_json_lines(text), max_items, scope)
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
        return [validate_item({**front, "content": body}, "file", scope)]
    if suffix == ".txt":
        return [validate_item({"content": text}, "file", scope)]
    raise InboxRejected(
        f"unsupported file type {suffix or '(none)'}: use .yaml .yml .json .jsonl .md .txt"
    )


def read_file(
    path: Path,
    max_bytes: int,
    max_items: int,
    setting: str | None = "inbox.max_file_bytes",
    scope: str | None = None,
    follow: bool = True,
) -> list[Item]:
    """The items of one file. `setting`: the clagd.yaml key that sets `max_bytes`, named
    when a file is over it (None: a fixed limit, `clagd import`'s). `scope`: as for
    `parse_text` (the file's `inbox/<scope>/` folder). `follow=False` (the inbox): only a
    regular file with one name is read (`_read_regular`)."""
    if not follow:
        raw = _read_regular(path, max_bytes, setting)
    else:
        _check_size(path.stat().st_size, max_bytes, setting)
        raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InboxRejected(f"not UTF-8: {exc}") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    return parse_text(path.name, text, max_items, scope)


def _read_regular(path: Path, max_bytes: int, setting: str | None) -> bytes:
    """The bytes of a regular file, never through a link: a FIFO is not waited for (opened
    without blocking, then refused), a symlink, socket, device or a file with other names
    (hard-linked) is refused with what it is."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EMLINK):
            what = special_kind(path) or "not a regular file"
            raise InboxRejected(not_regular_file(path.name, what)) from None
        raise
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        kind = kind_of(st)
        if kind is not None:
            raise InboxRejected(not_regular_file(path.name, kind))
        _check_size(st.st_size, max_bytes, setting)
        return f.read()


def not_regular_file(name: str, kind: str) -> str:
    """Why an inbox entry that is not a regular file is rejected."""
    return (
        f"inbox/{name} is {kind}, not a regular file: only regular files are read (write "
        "the memory into a plain file, or copy it in)"
    )


def _check_size(size: int, max_bytes: int, setting: str | None) -> None:
    if size > max_bytes:
        where = f"{setting} in clagd.yaml" if setting else "a fixed limit"
        more = f", or raise {setting}" if setting else ""
        raise InboxRejected(
            f"file is {size} bytes, over the limit of {max_bytes} ({where}): split it into "
            f"smaller files{more}"
        )


def _specials_in(folder: Path, prefix: str) -> list[tuple[str, str]]:
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    out = []
    for e in entries:
        if ignored_name(e.name):
            continue
        try:
            kind = kind_of(e.stat(follow_symlinks=False))
        except OSError:
            continue
        if kind is not None and kind != "a folder":
            out.append((prefix + e.name, kind))
    return out


@dataclass
class Seen:
    size: int
    mtime_ns: int
    first_seen: float


@dataclass
class InboxTracker:
    """Decides which inbox files are complete. Thread-safe: watchdog events arrive on the
    observer's thread, scans happen on the ingest thread.

    With inotify the tracker also sees opens and closes: a file open (for writing, or by
    anyone) is not complete whatever its age, up to `open_max_seconds` (a writer that never
    closes); past that the settle rule applies and the file is listed in `held_open`. A
    file's modification time in the future (a skewed clock, `touch -d`) does not hold it
    back: its age counts from when it was first seen."""

    root: Path
    settle_seconds: float = 1.0
    open_max_seconds: float = 3600.0
    _seen: dict[str, Seen] = field(default_factory=dict)
    _complete: dict[str, float] = field(default_factory=dict)  # name -> when we learnt it
    _open: dict[str, tuple[int, float]] = field(default_factory=dict)  # name -> (opens, since)
    held_open: list[str] = field(default_factory=list)  # open longer than open_max_seconds
    held_open_total: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def mark_complete(self, name: str) -> None:
        with self._lock:
            self._complete[name] = time.time()

    def opened(self, name: str) -> None:
        with self._lock:
            n, since = self._open.get(name, (0, time.monotonic()))
            self._open[name] = (n + 1, since)

    def closed(self, name: str) -> None:
        with self._lock:
            n, since = self._open.get(name, (1, 0.0))
            if n <= 1:
                self._open.pop(name, None)
            else:
                self._open[name] = (n - 1, since)

    def forget(self, name: str) -> None:
        with self._lock:
            self._seen.pop(name, None)
            self._complete.pop(name, None)
            self._open.pop(name, None)

    def candidates(self) -> list[str]:
        """The files to read: those in the inbox, and those in its scope folders
        (`inbox/<scope>/`, named `<scope>/<file>`; found by the scan, which the periodic
        rescan runs, as no event is watched there)."""
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return []
        names = [
            e.name for e in entries if not ignored_name(e.name) and e.is_file(follow_symlinks=False)
        ]
        for d in scope_dirs(self.root):
            try:
                inside = list(os.scandir(self.root / d))
            except OSError:
                continue
            names += [
                f"{d}/{e.name}"
                for e in inside
                if not ignored_name(e.name) and e.is_file(follow_symlinks=False)
            ]
        return sorted(names)

    def specials(self) -> list[tuple[str, str]]:
        """(name, kind) of each entry of the inbox (and its scope folders) that is not a
        regular file with one name: a symlink, FIFO, socket, device, a hard-linked file
        (never read: rejected with what it is). Folders are scopes' or the daemon's."""
        out = _specials_in(self.root, "")
        for d in scope_dirs(self.root):
            out += _specials_in(self.root / d, f"{d}/")
        return sorted(out)

    def _still_open(self, name: str) -> bool:
        entry = self._open.get(name)
        if entry is None:
            return False
        if time.monotonic() - entry[1] < self.open_max_seconds:
            return True
        if name not in self.held_open:
            self.held_open.append(name)
            self.held_open_total += 1
            log.warning(
                "inbox file %r has been open for over %ss: read it", name, self.open_max_seconds
            )
        return False

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
                    prev = self._seen[name] = Seen(st.st_size, st.st_mtime_ns, now)
                    stable = False
                else:
                    stable = True
                mtime = st.st_mtime_ns / 1e9
                future = mtime > now + 1.0
                age = now - (prev.first_seen if future else mtime)
                if self._still_open(name):
                    waiting += 1
                elif (closed is not None and (closed >= mtime or future)) or (
                    stable and age >= self.settle_seconds
                ):
                    ready.append(name)
                else:
                    waiting += 1
            for gone in set(self._seen) - set(names):
                self._seen.pop(gone, None)
                self._complete.pop(gone, None)
                self._open.pop(gone, None)
            self.held_open = [n for n in self.held_open if n in self._open]
        return ready, waiting


@dataclass(frozen=True)
class Rejection:
    """Where a rejected file went; `refused`: why inbox/rejected/ was not used ("" when it
    was)."""

    path: Path
    refused: str = ""


def reject(inbox: Path, name: str, reason: str) -> Rejection:
    """Move a file to inbox/rejected/ (never over another) with `<name>.error` beside it.

    Every step goes through directory descriptors opened with O_NOFOLLOW and the .error file
    is created with O_EXCL, so no link another account planted in a shared inbox is followed.
    A symlink in place of rejected/ is replaced by a real folder; a rejected/ owned by
    another account is not used: the file goes to the store's private `.clagd/rejected/`
    and `refused` says why (the daemon reports it in status).
    """
    inbox_fd = os.open(inbox, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        rejected, refused = _rejected_dir(inbox, inbox_fd)
        try:
            target = _free_name(rejected, name.replace("/", "_"))  # inbox/bob/x.md: bob_x.md
            os.rename(name, target, src_dir_fd=inbox_fd, dst_dir_fd=rejected)
            error = error_name(target)
            if error != target + ".error":  # shortened: it names the file it is about
                reason = f"{reason}\nfile: {target}"
            _write_new(rejected, error, error_text(reason))
        finally:
            os.close(rejected)
    finally:
        os.close(inbox_fd)
    # %r: a newline in a file name cannot forge a log line
    log.warning("rejected inbox file %r: %r", name, reason)
    where = (inbox.parent / ".clagd" / "rejected") if refused else (inbox / "rejected")
    return Rejection(where / target, refused)


def error_text(reason: str) -> str:
    """The .error file: every line a comment, no control character, so that no shell (or
    other interpreter) that is made to read it runs any of the input it quotes."""
    lines = [
        "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in line)
        for line in reason.split("\n")
    ]
    return "".join(f"# {line}\n" for line in lines) + f"# rejected at {iso_utc()}\n"


NAME_MAX = 255  # bytes in one file name (Linux file systems)


def error_name(target: str) -> str:
    """`<target>.error`, or, when that is over NAME_MAX bytes (a 250-byte inbox name),
    the name cut at a character boundary plus a hash of the whole: still one per file."""
    name = target + ".error"
    raw = os.fsencode(target)
    if len(os.fsencode(name)) <= NAME_MAX:
        return name
    digest = hashlib.sha1(raw).hexdigest()[:8]
    cut = raw[: NAME_MAX - len(".error") - len(digest) - 1]
    stem = cut.decode("utf-8", errors="ignore") if _utf8(raw) else os.fsdecode(cut)
    while len(os.fsencode(stem)) > len(cut):  # never over: a cut escape may not grow it
        stem = stem[:-1]
    return f"{stem}~{digest}.error"


def _utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _rejected_dir(inbox: Path, inbox_fd: int) -> tuple[int, str]:
    """A descriptor of inbox/rejected/ (made 0700 when missing), or of `.clagd/rejected/`
    with the reason when the former belongs to another account."""
    fd = _private_subdir(inbox_fd, "rejected")
    owner = os.fstat(fd).st_uid
    if owner == os.getuid():
        return fd, ""
    os.close(fd)
    refused = (
        f"{inbox / 'rejected'} is owned by {user_name(owner)}, not by the daemon: not used; "
        f"rejected files go to {inbox.parent / '.clagd' / 'rejected'}"
    )
    log.error("%s", refused)
    store_fd = os.open(inbox.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        runtime = _private_subdir(store_fd, ".clagd")
    finally:
        os.close(store_fd)
    try:
        fd = _private_subdir(runtime, "rejected")
    finally:
        os.close(runtime)
    if os.fstat(fd).st_uid != os.getuid():
        os.close(fd)
        raise PermissionError(f"{inbox.parent / '.clagd' / 'rejected'}: not ours")
    return fd, refused


def _private_subdir(parent_fd: int, name: str) -> int:
    """Open (creating it 0700) the folder `name` in `parent_fd`, never through a link: a
    symlink or file in its place is replaced by a real folder."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(3):
        try:
            fd = os.open(name, flags, dir_fd=parent_fd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            log.warning("%s is not a folder (a symlink?): replacing it with one", name)
            os.unlink(name, dir_fd=parent_fd)
        else:
            st = os.fstat(fd)
            if st.st_uid == os.getuid() and st.st_mode & 0o077:
                os.fchmod(fd, 0o700)  # ours, but open to others: they could plant links
            return fd
        try:
            os.mkdir(name, 0o700, dir_fd=parent_fd)
        except FileExistsError:
            pass
    raise OSError(errno.EAGAIN, f"{name}: replaced again and again while being made")


def _free_name(dir_fd: int, name: str) -> str:
    """`name`, or `stem.N.suffix`: a name taken neither by a file nor by its .error."""
    target, n = name, 1
    while _exists(dir_fd, target) or _exists(dir_fd, error_name(target)):
        stem, dot, suffix = name.rpartition(".")
        target = f"{stem}.{n}.{suffix}" if dot else f"{name}.{n}"
        n += 1
    return target


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _write_new(dir_fd: int, name: str, text: str) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, 0o600, dir_fd=dir_fd)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
