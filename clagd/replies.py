"""The socket protocol's results as a Python program reads them: one dataclass per op
(docs/protocol.md gives every field), built by `from_dict` from the reply's JSON object.

Every one keeps the object as it came in `raw` (what `clagd ... --json` prints, with any
field a newer daemon added), and reads like that object too (`result["ids"]`,
`result.get("commit")`), for code written when the client returned plain dicts; a field
the class does not know is in `raw` only. Nested sections that have a type of their own
here (`Status.counts`, `ClusterList.clusters`, `Log.entries`) are dataclasses; the others
(status sections owned by parts of the daemon) stay JSON objects.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from clagd.scopes import DEFAULT_SCOPE

R = TypeVar("R", bound="Reply")


class MalformedReply(ValueError):
    """A result object that lacks a field its op always sends, or is no object."""


class Reply:
    """What every typed result shares: its JSON object (`raw`) and read access to it."""

    raw: dict[str, Any]  # each subclass's last field
    # field -> how to build it from its JSON value (a nested dataclass, a list of them)
    nested: ClassVar[Mapping[str, Callable[[Any], Any]]] = {}

    @classmethod
    def from_dict(cls: type[R], d: Mapping[str, Any]) -> R:
        """The result from its JSON object: the fields the class knows (absent optional
        ones take their defaults), `raw` the whole object. MalformedReply when a field
        every reply of the op has is missing."""
        if not isinstance(d, Mapping):
            raise MalformedReply(f"{cls.__name__}: not an object: {str(d)[:200]}")
        kw: dict[str, Any] = {}
        for f in fields(cls):  # type: ignore[arg-type]
            if f.name == "raw" or f.name not in d:
                continue
            value = d[f.name]
            build = cls.nested.get(f.name)
            kw[f.name] = build(value) if build is not None and value is not None else value
        kw["raw"] = dict(d)
        try:
            return cls(**kw)
        except TypeError as exc:
            raise MalformedReply(f"{cls.__name__}: {exc}") from None

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    def __contains__(self, key: object) -> bool:
        return key in self.raw

    def get(self, key: str, default: Any = None) -> Any:
        return self.raw.get(key, default)


def _raw() -> Any:
    return field(default_factory=dict, repr=False, compare=False)


def _list_of(cls: type[R]) -> Callable[[Any], list[R]]:
    def build(values: Any) -> list[R]:
        if not isinstance(values, list):
            raise MalformedReply(f"{cls.__name__}: expected a list, got {type(values).__name__}")
        return [cls.from_dict(v) for v in values]

    return build


@dataclass
class Pong(Reply):
    """`ping`."""

    pong: bool
    pid: int
    store: str
    raw: dict[str, Any] = _raw()


@dataclass
class Added(Reply):
    """`add` (and `add_many`, `add_messages`): one batch committed, or only duplicates."""

    batch: str
    added: int
    ids: list[str]
    duplicates: int = 0
    duplicate_ids: list[str] = field(default_factory=list)
    routed: int = 0
    unsorted: int = 0
    commit: str | None = None
    files: int = 0
    route_deferred: bool = False
    skipped: int = 0  # conversation turns not stored for their role
    raw: dict[str, Any] = _raw()


@dataclass
class MemoryRecord(Reply):
    """`get`, and each memory of `list`: a memory and where it is filed."""

    id: str
    content: str
    created_at: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    cluster_id: str | None = None
    cluster_name: str = ""
    archived: bool = False
    scope: str = DEFAULT_SCOPE
    raw: dict[str, Any] = _raw()


@dataclass
class MemoryList(Reply):
    """`list`: the newest memories the filter lets through (at most `limit`) and how many
    it lets through in all (`total`)."""

    memories: list[MemoryRecord]
    total: int
    limit: int
    raw: dict[str, Any] = _raw()
    nested = {"memories": _list_of(MemoryRecord)}


@dataclass
class ClusterInfo(Reply):
    """One cluster of `clusters` (without its memories)."""

    id: str
    name: str
    description: str = ""
    tags: list[str] = field(default_factory=list)
    size: int = 0
    archived: bool = False
    pinned: bool = False
    created_at: str = ""
    updated_at: str = ""
    access_count: int = 0
    last_accessed: str | None = None
    scope: str = DEFAULT_SCOPE  # the scope of its memories (a cluster holds one)
    raw: dict[str, Any] = _raw()


@dataclass
class ClusterList(Reply):
    """`clusters`: hot (and, when asked, archived) clusters, and the unsorted count."""

    clusters: list[ClusterInfo]
    unsorted: int = 0
    raw: dict[str, Any] = _raw()
    nested = {"clusters": _list_of(ClusterInfo)}


@dataclass
class LogEntry(Reply):
    """One commit of `log`, its trailers read out."""

    commit: str
    date: str
    subject: str
    kind: str
    trailers: dict[str, str] = field(default_factory=dict)
    parents: list[str] = field(default_factory=list)
    session: str | None = None
    status: str | None = None
    trigger: str | None = None
    backend: str | None = None
    raw: dict[str, Any] = _raw()


@dataclass
class Log(Reply):
    """`log`: the newest commits, and the outside moves of the branch that took memories
    out of HEAD (`history`, JSON objects: docs/protocol.md)."""

    entries: list[LogEntry]
    history: list[dict[str, Any]] = field(default_factory=list)
    raw: dict[str, Any] = _raw()
    nested = {"entries": _list_of(LogEntry)}


@dataclass
class Reverted(Reply):
    """`revert`: the commits undone, the revert commits made, and HEAD after."""

    reverted: list[str]
    commits: list[str]
    head: str | None = None
    raw: dict[str, Any] = _raw()


@dataclass
class Updated(Reply):
    """`update`: the new memory's id, the id of the one it supersedes, the commit."""

    id: str
    supersedes: str
    cluster_id: str | None = None
    commit: str | None = None
    raw: dict[str, Any] = _raw()


@dataclass
class Forgotten(Reply):
    """`forget`: the memories removed from HEAD in one commit, and with `purge` what the
    history rewrite did (`purge`, a JSON object: docs/protocol.md)."""

    forgotten: list[str]
    commit: str | None = None
    head: str | None = None
    scope: str = DEFAULT_SCOPE
    rejected_redacted: list[str] = field(default_factory=list)
    purge: dict[str, Any] | None = None
    raw: dict[str, Any] = _raw()


@dataclass
class Session(Reply):
    """`recluster`: a session's outcome (`status` "scheduled" and nothing else when it
    was only queued, `wait=False`)."""

    status: str
    session_id: str | None = None
    trigger: str | None = None
    backend: str | None = None
    model: str | None = None
    reasons: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    commits: list[str] = field(default_factory=list)
    sampled: int = 0
    moved: int = 0
    attempts: int = 0
    calls: int = 0
    error_rate: float | None = None
    raw: dict[str, Any] = _raw()


@dataclass
class Archived(Reply):
    """`archive`: the cold clusters moved to `archive/` (or, `dry_run`, only listed)."""

    dry_run: bool
    clusters: list[str]
    names: list[str] = field(default_factory=list)
    commit: str | None = None
    raw: dict[str, Any] = _raw()


@dataclass
class Rounds(Reply):
    """`round`: the dialogue rounds counted since the last session."""

    rounds_since_session: int
    raw: dict[str, Any] = _raw()


@dataclass
class FollowStatus(Reply):
    """`sync` (a follower's `status.follow`): what it serves of its primary."""

    remote: str
    branch: str
    head: str | None = None
    remote_head: str | None = None
    behind: int = 0
    last_fetch_at: float | None = None
    seconds_since_fetch: float | None = None
    fetches: int = 0
    failures: int = 0
    moves: int = 0
    rewrites: int = 0
    last_error: str = ""
    inbox_waiting: int = 0
    inbox_files: list[str] = field(default_factory=list)
    raw: dict[str, Any] = _raw()


@dataclass
class Counts(Reply):
    """`status.counts`: what the store holds."""

    memories: int
    clusters: int
    archived_clusters: int = 0
    archived_memories: int = 0
    unsorted: int = 0
    # per scope: {"memories", "clusters", "archived_memories", "unsorted"}
    scopes: dict[str, dict[str, int]] = field(default_factory=dict)
    scope: str | None = None  # `status --scope`: the scope these counts are of
    raw: dict[str, Any] = _raw()


@dataclass
class Status(Reply):
    """`status`: the engine's own fields typed; the sections of the daemon's parts
    (`writer`, `backend`, `inbox`, `query_processes`, ...) as their JSON objects (None
    when the daemon has no such part)."""

    store: str
    head: str | None
    counts: Counts
    counters: dict[str, int] = field(default_factory=dict)
    uptime_seconds: float = 0.0
    load_seconds: float = 0.0
    load_source: str = ""
    load_processes: int = 1
    route_pending: int = 0
    new_since_session: int = 0
    rounds_since_session: int = 0
    last_session: Session | None = None
    outside_edit_error: str = ""
    recovery: list[str] = field(default_factory=list)
    branch: str = ""
    paused: str = ""
    ignored_files: list[str] = field(default_factory=list)
    writer: dict[str, Any] = field(default_factory=dict)
    git_gc: dict[str, Any] = field(default_factory=dict)
    history: dict[str, Any] = field(default_factory=dict)
    backend: dict[str, Any] | None = None
    inbox: dict[str, Any] | None = None
    query_processes: dict[str, Any] | None = None
    activity: dict[str, Any] | None = None
    privacy: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    refine: dict[str, Any] | None = None
    replication: dict[str, Any] | None = None
    follow: FollowStatus | None = None
    raw: dict[str, Any] = _raw()
    nested = {
        "counts": Counts.from_dict,
        "last_session": Session.from_dict,
        "follow": FollowStatus.from_dict,
    }
