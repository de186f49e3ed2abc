"""What the composition root (the daemon, `clagd eval`, a test) plugs into an engine: one
typed object handed to `Engine(...)`, so every wire is visible where the engine is built
instead of being set on it afterwards."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from clagd.change import IndexChange, Publisher

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from clagd.engine.core import Engine
    from clagd.organize.session import SessionOutcome
    from clagd.retrieval.refine import Refiner


class SessionRunner(Protocol):
    """Runs one clustering session on an engine and returns its outcome;
    `organize.session.engine_session_runner` builds the real one."""

    def __call__(
        self,
        engine: Engine,
        trigger: str = ...,
        backend: str | None = ...,
        scope: str | None = ...,
    ) -> SessionOutcome: ...


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
    # where the engine's index changes go next (the query processes), on the writer
    # thread: `prepare` while the commit is written (a copy may make its next snapshot,
    # not served yet), `publish` right after the engine's own swap, with what `prepare`
    # returned for that very change (None: apply it whole). A failed commit publishes none.
    index_publisher: Publisher[IndexChange, Any] | None = None
    # called first on each thread the engine starts (the writer and its git thread): the
    # daemon registers them as organizing threads (`serve/priority.py`)
    on_thread_start: Callable[[], None] | None = None
