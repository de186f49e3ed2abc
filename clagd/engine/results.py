"""What the engine's operations return: one frozen dataclass per reply, its fields exactly
the reply's `result` fields (docs/protocol.md). Only the socket layer turns them into JSON
(`protocol.to_wire`, called by `ok_reply`); inside, callers read attributes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from clagd.ingest.batch import IngestResult
from clagd.model import Cluster
from clagd.protocol import OMIT_NONE
from clagd.retrieval.index import Hit
from clagd.scopes import DEFAULT_SCOPE
from clagd.store.gitrepo import CommitInfo
from clagd.store.history import HistoryEvent, HistoryStatus
from clagd.store.holds import WriterStatus
from clagd.store.packing import GcStatus

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from clagd.organize.session import SessionOutcome


@dataclass(frozen=True)
class Added:
    """`add`: one batch committed (or only duplicates found)."""

    batch: str
    added: int
    ids: tuple[str, ...]
    duplicates: int
    duplicate_ids: tuple[str, ...]
    routed: int
    unsorted: int
    commit: str | None
    files: int
    route_deferred: bool
    supersedes: Mapping[str, str]  # new memory id -> the older one it supersedes
    skipped: int = 0  # conversation turns left out by role (`ingest.assistant_turns`)

    @classmethod
    def of(cls, res: IngestResult, skipped: int = 0) -> Added:
        return cls(
            res.batch,
            len(res.added),
            tuple(res.added),
            len(res.duplicates),
            tuple(res.duplicates),
            sum(res.routed.values()),
            res.unsorted,
            res.commit,
            res.files,
            res.deferred,
            dict(res.supersedes),
            skipped,
        )


@dataclass(frozen=True)
class MemoryHit:
    """One memory a query found."""

    id: str
    content: str
    cluster_id: str | None
    cluster_name: str
    score: float
    created_at: str
    metadata: Mapping[str, object]
    archived: bool
    scope: str = DEFAULT_SCOPE

    @classmethod
    def of(cls, hit: Hit, archived: bool) -> MemoryHit:
        m = hit.memory
        score = round(float(hit.score), 4)
        return cls(
            m.id,
            m.content,
            hit.cluster_id,
            hit.cluster_name,
            score,
            m.created_at,
            dict(m.metadata),
            archived,
            m.scope,
        )


@dataclass(frozen=True)
class MemoryRecord:
    """`get`, and each memory `list` gives: a memory and where it is filed."""

    id: str
    content: str
    created_at: str
    metadata: Mapping[str, object]
    cluster_id: str | None
    cluster_name: str
    archived: bool
    scope: str

    @classmethod
    def of(cls, hit: Hit, archived: bool) -> MemoryRecord:
        m = hit.memory
        return cls(
            m.id,
            m.content,
            m.created_at,
            dict(m.metadata),
            hit.cluster_id,
            hit.cluster_name,
            archived,
            m.scope,
        )


@dataclass(frozen=True)
class MemoryList:
    """`list`: the newest memories the filter lets through (at most `limit`), and how many
    it lets through in all (`total`)."""

    memories: tuple[MemoryRecord, ...]
    total: int
    limit: int


@dataclass(frozen=True)
class ClusterScore:
    """One cluster a query chose, with its cluster-level score."""

    id: str
    name: str
    score: float


@dataclass(frozen=True)
class QueryResult:
    """`query`: the memories found, the clusters chosen, the formatted context and its
    estimated tokens; `thawing`: archived clusters it hit, on their way back."""

    memories: tuple[MemoryHit, ...]
    clusters: tuple[ClusterScore, ...]
    context: str
    tokens: int
    took_ms: float
    thawing: tuple[str, ...] | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True)
class Rounds:
    """`round`: the dialogue rounds counted since the last session."""

    rounds_since_session: int


@dataclass(frozen=True)
class ClusterInfo:
    """One cluster as `clusters` lists it (without its memories)."""

    id: str
    name: str
    description: str
    tags: tuple[str, ...]
    size: int
    archived: bool
    pinned: bool
    created_at: str
    updated_at: str
    access_count: int = 0
    last_accessed: str | None = None
    scope: str = DEFAULT_SCOPE

    @classmethod
    def of(cls, c: Cluster, archived: bool) -> ClusterInfo:
        return cls(
            c.id,
            c.name,
            c.description,
            tuple(c.tags),
            len(c.memories),
            archived,
            c.pinned,
            c.created_at,
            c.updated_at,
            scope=c.scope,
        )


@dataclass(frozen=True)
class ClusterList:
    """`clusters`: hot (and, when asked, archived) clusters, and the unsorted count."""

    clusters: tuple[ClusterInfo, ...]
    unsorted: int


@dataclass(frozen=True)
class LogEntry:
    """One commit of `log`, its trailers read out."""

    commit: str
    date: str
    subject: str
    kind: str
    trailers: Mapping[str, str]
    parents: tuple[str, ...]
    session: str | None
    status: str | None
    trigger: str | None
    backend: str | None

    @classmethod
    def of(cls, c: CommitInfo) -> LogEntry:
        t = c.trailers
        return cls(
            c.commit,
            c.date,
            c.subject,
            c.kind,
            t,
            c.parents,
            t.get("session"),
            t.get("status"),
            t.get("trigger"),
            t.get("backend"),
        )


@dataclass(frozen=True)
class Log:
    """`log`: the newest commits, and the moves of the branch made outside clagd that took
    memories out of HEAD (`.git/clagd-history.jsonl`)."""

    entries: tuple[LogEntry, ...]
    history: tuple[HistoryEvent, ...]


@dataclass(frozen=True)
class Reverted:
    """`revert`: the commits undone, the revert commits made, and HEAD after."""

    reverted: tuple[str, ...]
    commits: tuple[str, ...]
    head: str | None


@dataclass(frozen=True)
class Forgotten:
    """`forget`: the memories removed (ids), the forget commit, HEAD after, and the
    rejected inbox files whose copies of the text were replaced by `[forgotten]`."""

    forgotten: tuple[str, ...]
    commit: str | None
    head: str | None
    scope: str
    rejected_redacted: tuple[str, ...] = ()
    purge: Purged | None = None


@dataclass(frozen=True)
class Rewritten:
    """One commit a purge rewrote: its id before and after."""

    old: str
    new: str


@dataclass(frozen=True)
class Purged:
    """What `forget --purge` did to history."""

    rewritten: tuple[Rewritten, ...]
    seconds: float
    pushed: str = ""
    remote_note: str = ""


@dataclass(frozen=True)
class Archived:
    """`archive`: the cold clusters moved to `archive/` (or, `dry_run`, only listed)."""

    dry_run: bool
    clusters: tuple[str, ...]
    names: tuple[str, ...]
    commit: str | None


@dataclass(frozen=True)
class Thawed:
    """Archived clusters a query hit, back in `clusters/`."""

    clusters: tuple[str, ...]
    commit: str | None


@dataclass(frozen=True)
class Scheduled:
    """`recluster` with `wait: false`: a session is queued."""

    status: str = "scheduled"


@dataclass(frozen=True)
class Counts:
    """The `counts` section of `status`: what the store holds."""

    memories: int
    clusters: int
    archived_clusters: int
    archived_memories: int
    unsorted: int
    # per scope: {"memories", "clusters", "archived_memories", "unsorted"} (hot memories)
    scopes: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    # `status --scope`: the scope every count above is of (None, left out: the whole store)
    scope: str | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True)
class Status:
    """`status`: the engine's own fields, its parts' sections (`writer`, `git_gc`,
    `history`), and those of the parts the composition root plugged in (`backend`,
    `inbox`, `query_processes`, ...: each a dataclass of that part's own, left out when the
    part is not there)."""

    store: str
    head: str | None
    uptime_seconds: float
    load_seconds: float
    load_source: str
    load_processes: int
    route_pending: int
    counts: Counts
    counters: Mapping[str, int]
    writer: WriterStatus
    new_since_session: int
    rounds_since_session: int
    last_session: SessionOutcome | None
    outside_edit_error: str
    recovery: tuple[str, ...]
    branch: str
    paused: str
    git_gc: GcStatus
    ignored_files: tuple[str, ...]
    special_files: tuple[str, ...]  # "folder/name: kind": never read (store/special.py)
    history: HistoryStatus
    backend: DataclassInstance | None = field(default=None, metadata=OMIT_NONE)
    inbox: DataclassInstance | None = field(default=None, metadata=OMIT_NONE)
    query_processes: DataclassInstance | None = field(default=None, metadata=OMIT_NONE)
    activity: DataclassInstance | None = field(default=None, metadata=OMIT_NONE)
    privacy: DataclassInstance | None = field(default=None, metadata=OMIT_NONE)
    config: DataclassInstance | None = field(default=None, metadata=OMIT_NONE)
    refine: DataclassInstance | None = field(default=None, metadata=OMIT_NONE)
    replication: DataclassInstance | None = field(default=None, metadata=OMIT_NONE)
    follow: DataclassInstance | None = field(default=None, metadata=OMIT_NONE)  # a follower's
