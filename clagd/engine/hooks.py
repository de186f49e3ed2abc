"""What the composition root (the daemon, `clagd eval`, a test) plugs into an engine: one
typed object handed to `Engine(...)`, so every wire is visible where the engine is built
instead of being set on it afterwards."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from clagd.retrieval.change import IndexChange
from clagd.retrieval.index import Index

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from clagd.engine.core import Engine
    from clagd.organize.session import SessionOutcome
    from clagd.retrieval.refine import Refiner
    from clagd.store.writer import Changes


class SessionRunner(Protocol):
    """Runs one clustering session on an engine and returns its outcome;
    `organize.session.engine_session_runner` builds the real one."""

    def __call__(
        self, engine: Engine, trigger: str = ..., backend: str | None = ...
    ) -> SessionOutcome: ...


@dataclass(frozen=True, eq=False)
class PreparedIndex:
    """The snapshot `change` makes of `base`, made while git built the commit of `changes`
    (`Writer.commit_beside_prepare`); served only if the engine still serves `base` when
    that commit is published."""

    base: Index
    changes: Changes
    change: IndexChange
    index: Index


@dataclass
class EngineHooks:
    """Every field is optional: an engine without hooks (scripts, tests) builds its session
    runner from the config on first use, reports no backend, and pushes nowhere."""

    # a session threshold was reached ("memories" or "rounds"): schedule a session
    on_threshold: Callable[[str], None] | None = None
    # a commit was published (its sha): e.g. wake the replicator
    on_commit: Callable[[str], None] | None = None
    # a large batch was committed unsorted: the route pass is due after this many seconds
    # of quiet (the daemon arms a timer; without one, housekeeping finds it due)
    on_route_waiting: Callable[[float], None] | None = None
    session_runner: SessionRunner | None = None
    # the `backend` section of `status` (slm.manager.BackendStatus)
    backend_status: Callable[[], DataclassInstance] | None = None
    # further `status` sections, by their `engine.results.Status` field (inbox, refine,
    # replication, ...): each the typed status of the part it describes (None: left out)
    status: dict[str, Callable[[], DataclassInstance | None]] = field(default_factory=dict)
    # the SLM pick among the lexical cluster candidates (retrieval.slm_refine)
    refiner: Refiner | None = None
    # the served index changed (called on the writer thread, right after the swap)
    on_index: Callable[[IndexChange], None] | None = None
    # the writer is committing this change (called on the writer thread before it writes
    # the files): a copy of the index may make its next snapshot now, to serve it only once
    # `on_index` brings the same change object (a commit that fails brings none)
    on_index_prepare: Callable[[IndexChange], None] | None = None
    # called first on each thread the engine starts (the writer and its git thread): the
    # daemon registers them as organizing threads (`serve/priority.py`)
    on_thread_start: Callable[[], None] | None = None
