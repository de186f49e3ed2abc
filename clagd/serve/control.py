"""The messages of a query process's control channel (`serve/queryproc.py` on the daemon's
side, `serve/query_worker.py` on the process's): one small frozen dataclass each, pickled
whole, dispatched on its type.

Daemon to process: `Init` (the index, once), then in the writer's order `Prepare`,
`Commit` and `Apply`; `Serve` once it caught up; `Stop`. Process to daemon: `Applied` and
`Queried`.
"""

from __future__ import annotations

from dataclasses import dataclass

from clagd.change import IndexChange
from clagd.retrieval.index import Index


@dataclass(frozen=True)
class Init:
    """The index the process starts from, and its version."""

    version: int
    index: Index


@dataclass(frozen=True)
class Prepare:
    """The writer is committing `change`: make its snapshot beside the served one."""

    change: IndexChange


@dataclass(frozen=True)
class Commit:
    """The change last prepared was committed as `version`: serve what was made."""

    version: int


@dataclass(frozen=True)
class Apply:
    """The served index changed by `change` (not prepared): apply it as `version`."""

    version: int
    change: IndexChange


@dataclass(frozen=True)
class Serve:
    """The daemon saw this copy catch up with its writer: accept connections now."""


@dataclass(frozen=True)
class Stop:
    """End: the daemon stops, or replaces this process."""


@dataclass(frozen=True)
class Applied:
    """The process serves `version` now."""

    version: int


@dataclass(frozen=True)
class Queried:
    """A query the process answered: the memories and clusters it returned (the daemon
    keeps the access statistics and counts the rounds that trigger sessions)."""

    memory_ids: list[str]
    cluster_ids: list[str]


ToProcess = Init | Prepare | Commit | Apply | Serve | Stop
ToDaemon = Applied | Queried
