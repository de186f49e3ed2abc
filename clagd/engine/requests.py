"""The arguments of the engine's writer operations (one typed value each, as the writer's
`call` takes them), their bounds, and what `Engine.prepare` hands to `publish`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clagd.ingest.inbox import Item
from clagd.retrieval.index import Index

# dialogue rounds one `round` request may count (a bigger one is a client's bug)
MAX_ROUNDS = 10_000


@dataclass(frozen=True)
class IngestBatch:
    """The ingest operation's argument: validated items, where they came from, how many
    inbox files they were read from."""

    items: list[Item]
    source: str
    files: int = 0


# cluster files one route-pass slice rewrites at most (one commit each; writes between).
# At 100k realistic (bench_burst.py, in process, loaded): the longest slice 281-333 ms with
# 40, 447-606 ms with 100 (a commit's own cost at 11k clusters is ~100-150 ms)
ROUTE_SLICE_CLUSTERS = 40


@dataclass(frozen=True)
class ArchiveRun:
    """The archive operation's argument: `dry_run` lists what would move; `now` (epoch
    seconds) stands for the clock in tests."""

    dry_run: bool = False
    now: float | None = None
    scope: str | None = None  # only this scope's clusters (None: every scope's)
    # one slice: these clusters (found cold off the writer), if still cold; None: all
    clusters: tuple[str, ...] | None = None


@dataclass(frozen=True)
class NextIndex:
    """What `Engine.prepare` made beside a commit: the engine's next snapshot, and what its
    index publisher prepared (`EngineHooks.index_publisher`: given back to its `publish`)."""

    index: Index
    theirs: Any = None
