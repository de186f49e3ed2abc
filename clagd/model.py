"""Memories and clusters: the data a store holds, and how it maps to YAML.

A memory's id is derived from its normalized content, so the same memory dropped twice is
stored once. Cluster ids are generated; both are checked against strict patterns because they
become file names.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import unicodedata
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from clagd.scopes import DEFAULT_SCOPE, check_scope

MEMORY_ID_RE = re.compile(r"^m-[0-9a-f]{16}$")
CLUSTER_ID_RE = re.compile(r"^c-[0-9a-f]{8,32}$")
# whitespace, C0 and C1 control characters (ESC, BEL, CR, ...) and DEL: runs of them are
# one space in stored text, so none can start a context line or drive a terminal
_WS_RE = re.compile(r"[\s\x00-\x1f\x7f-\x9f]+")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# the metadata keys of a supersede link, written by clagd only (`clagd update` and the
# supersede found at ingest): the newer memory's `supersedes` names the older one, the
# older one's `superseded_by` the newer; a superseded memory is left out of queries
SUPERSEDES = "supersedes"
SUPERSEDED_BY = "superseded_by"
LINK_KEYS = (SUPERSEDES, SUPERSEDED_BY)


def iso_utc(when: datetime | float | None = None) -> str:
    """The one form every time clagd writes takes: UTC, seconds precision, a trailing Z
    ("2026-01-31T12:00:00Z"). `when`: a datetime (naive ones are UTC), seconds since the
    epoch, or None for now."""
    if when is None:
        dt = datetime.now(timezone.utc)
    elif isinstance(when, datetime):
        dt = when if when.tzinfo else when.replace(tzinfo=timezone.utc)
    else:
        dt = datetime.fromtimestamp(when, timezone.utc)
    return dt.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_iso() -> str:
    """Now, in the form every stored time uses (`iso_utc`)."""
    return iso_utc()


def normalize_content(content: str) -> str:
    """NFC, whitespace and control characters collapsed to one space, stripped: what two
    copies of one memory share."""
    return _WS_RE.sub(" ", unicodedata.normalize("NFC", content)).strip()


def one_line(text: str) -> str:
    """`text` with line breaks and control characters (newline, ESC, BEL, ...) collapsed to
    one space: what a name, tag or content read from a file may hold. Returned as it is
    (one regex search) when there are none."""
    if _CONTROL_RE.search(text) is None:
        return text
    return _WS_RE.sub(" ", text).strip()


def day_label(stamp: str) -> str:
    """ "2023-05-08T13:56:00Z" -> "8 May 2023": the day a context line shows ("" when the
    stamp does not parse)."""
    at = parse_time(stamp)
    return f"{at.day} {at.strftime('%B %Y')}" if at is not None else ""


def memory_id(content: str, scope: str = DEFAULT_SCOPE) -> str:
    """The id of this content in this scope: a hash, so the same memory dropped twice in
    one scope is stored once, and the same text in two scopes is two memories."""
    return normalized_id(normalize_content(content), scope)


def normalized_id(normalized: str, scope: str = DEFAULT_SCOPE) -> str:
    """`memory_id` of content that `normalize_content` has made already (a tenth of the
    cost: normalizing is the rest). The default scope hashes the content alone (the ids of
    a store written before scopes); another scope hashes "<scope>\n<content>" (normalized
    content holds no newline, so no id of one scope can be an id of another)."""
    key = normalized if scope == DEFAULT_SCOPE else f"{scope}\n{normalized}"
    return "m-" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


def new_id(prefix: str, stamped: bool = False) -> str:
    """A fresh id: `prefix`, then (when `stamped`) the UTC time as YYYYmmddTHHMMSS and "-",
    so that ids sort by creation and say when, then 12 random hex digits (48 bits: no
    collision among the ids one store makes). Used for clusters ("c-"), ingest batches
    ("b-"), sessions ("s-", stamped) and unsorted shards ("u-", stamped)."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S") + "-" if stamped else ""
    return f"{prefix}{stamp}{secrets.token_hex(6)}"


def new_cluster_id() -> str:
    return new_id("c-")


def parse_time(value: str | None) -> datetime | None:
    """Parse an ISO 8601 time (a trailing Z allowed); naive times are taken as UTC."""
    if not value:
        return None
    try:
        dt = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt


def parse_epoch(value: str | None) -> float | None:
    """Seconds since the epoch of a stored time, or None when it is missing or unparseable.

    None, not a number standing for "unknown": what an unknown time means depends on the
    use, and each caller says it where it uses the value (the archive and the organizers
    count it as the oldest, `or 0.0`; the index gives it a neutral freshness, NaN). A
    silent 0.0 or NaN here was two behaviours behind one name."""
    dt = parse_time(value)
    return dt.timestamp() if dt is not None else None


@dataclass
class Memory:
    id: str
    content: str
    created_at: str
    metadata: dict[str, Any] = field(default_factory=dict)
    # who the memory belongs to (`clagd.scopes`); written to YAML only when not the default
    scope: str = DEFAULT_SCOPE

    @classmethod
    def new(
        cls,
        content: str,
        created_at: str | None = None,
        metadata: dict[str, Any] | None = None,
        scope: str = DEFAULT_SCOPE,
    ) -> Memory:
        content = normalize_content(content)
        scope = check_scope(scope)
        return cls(
            memory_id(content, scope), content, created_at or now_iso(), dict(metadata or {}), scope
        )

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "content": self.content, "created_at": self.created_at}
        if self.scope != DEFAULT_SCOPE:
            d["scope"] = self.scope
        if self.metadata:
            d["metadata"] = self.metadata
        return d

    @property
    def superseded_by(self) -> str | None:
        """The id of the memory that supersedes this one, or None."""
        v = self.metadata.get(SUPERSEDED_BY)
        return v if isinstance(v, str) and v else None

    @classmethod
    def from_dict(cls, d: dict[str, Any], scope: str = DEFAULT_SCOPE) -> Memory:
        """`scope`: the scope of a memory whose mapping names none (its cluster's)."""
        given = d.get("scope")
        return cls(
            id=str(d["id"]),
            content=str(d["content"]),
            created_at=str(d.get("created_at") or ""),
            metadata=dict(d.get("metadata") or {}),
            scope=scope if given is None else check_scope(given),
        )


@dataclass
class Cluster:
    id: str
    name: str
    description: str = ""
    tags: list[str] = field(default_factory=list)
    created_at: str = ""
    updated_at: str = ""
    memories: list[Memory] = field(default_factory=list)
    pinned: bool = False
    # newer memory id -> older memory id it supersedes (conflicts found in sessions)
    supersedes: dict[str, str] = field(default_factory=dict)
    # the scope of every memory in it (`clagd.scopes`); written only when not the default
    scope: str = DEFAULT_SCOPE

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "id": self.id,
            "name": self.name,
            "description": self.description,
            "tags": list(self.tags),
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }
        if self.scope != DEFAULT_SCOPE:
            d["scope"] = self.scope
        if self.pinned:
            d["pinned"] = True
        if self.supersedes:
            d["supersedes"] = dict(self.supersedes)
        d["memories"] = [m.to_dict() for m in self.memories]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Cluster:
        """A memory that names no scope takes the cluster's; one naming another scope is
        kept as it says (the loader refuses the file: a cluster never mixes scopes)."""
        given = d.get("scope")
        scope = DEFAULT_SCOPE if given is None else check_scope(given)
        return cls(
            id=str(d["id"]),
            name=str(d.get("name") or ""),
            description=str(d.get("description") or ""),
            tags=[str(t) for t in (d.get("tags") or [])],
            created_at=str(d.get("created_at") or ""),
            updated_at=str(d.get("updated_at") or ""),
            memories=[Memory.from_dict(m, scope) for m in (d.get("memories") or [])],
            pinned=bool(d.get("pinned", False)),
            supersedes={str(k): str(v) for k, v in (d.get("supersedes") or {}).items()},
            scope=scope,
        )
