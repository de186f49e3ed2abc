"""The ways the eval gets memories into clagd and asks its questions.

* `InProcessPipeline`: organizer + index, no store (development, quick ablations).
* `EnginePipeline` (protocol `batch`): a fresh store, the whole conversation ingested at
  once, one clustering session over all of it (`sample_size` raised to its size).
* `DaemonPipeline` (protocol `stream`, `clagd.eval.stream`): a running daemon, turns
  dropped into its inbox as they happen, organized by its own triggers.
* `StreamEnginePipeline` (`pipeline="stream-inprocess"`): the stream protocol without the
  daemon process: the engine takes each arrival as the inbox would hand it over, and the
  daemon's triggers (memory count, dialogue rounds, the route pass) run its sessions in
  the same order, synchronously (quick ablations; the daemon run confirms).

Every pipeline answers `query(text, k)` with the socket protocol's query result (a dict
with `memories` and `tokens`) and `organization()` with counts of what organizing did (and
the last session's reasons why clusters a model was asked to name kept lexical names).
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path
from typing import Any, Protocol, cast

from clagd.config import BackendKind, Config
from clagd.eval.data import Turn, arrivals
from clagd.ingest.inbox import validate_item
from clagd.model import Memory
from clagd.organize.lexical import organize_all
from clagd.protocol import to_wire
from clagd.retrieval.index import Index
from clagd.retrieval.results import label_tokens
from clagd.scopes import DEFAULT_SCOPE
from clagd.text import estimate_tokens

# what organizing did: counts, and `naming_reasons` (a list of the first reasons)
Organization = dict[str, int | list[str]]
NAMING_REASONS = 6  # reasons kept when conversations are summed


class Pipeline(Protocol):
    def ingest(self, turns: list[Turn]) -> None: ...

    def query(self, text: str, k: int) -> dict[str, Any]: ...

    def organization(self) -> Organization: ...

    def settle(self) -> None: ...

    def close(self) -> None: ...


def line_tokens(result: dict[str, Any]) -> list[int]:
    """Estimated tokens of each returned memory's context line, as the index counts them
    against the budget (`[Memory · <cluster> · <day>] <content>` plus one for the newline)."""
    return [
        estimate_tokens(m["content"]) + label_tokens(m["cluster_name"]) + 1
        for m in result["memories"]
    ]


def organization_of(status: dict[str, Any]) -> Organization:
    """What organizing did, from a `status` result (the engine's or the daemon's)."""
    counts, counters = status["counts"], status["counters"]
    last = status.get("last_session") or {}
    return {
        "sessions": int(counters.get("sessions", 0)),
        "route_passes": int(counters.get("route_passes", 0)),
        "routed": int(counters.get("routed", 0)),
        "named": int(counters.get("named", 0)),  # cluster profiles a model wrote
        "naming_asked": int(counters.get("naming_asked", 0)),  # ... it was asked for
        "naming_rejected": int(counters.get("naming_rejected", 0)),  # answers not used
        "naming_reasons": [str(r) for r in last.get("naming_reasons") or []],
        "clusters": int(counts.get("clusters", 0)),
        "unsorted": int(counts.get("unsorted", 0)),
        "memories": int(counts.get("memories", 0)),
    }


def add_organization(total: Organization, org: Organization) -> None:
    """One conversation's `org` into `total`: counts summed, the first reasons kept."""
    for key, value in org.items():
        was = total.get(key)
        if isinstance(value, list):
            total[key] = ((was if isinstance(was, list) else []) + value)[:NAMING_REASONS]
        else:
            total[key] = (was if isinstance(was, int) else 0) + value


class InProcessPipeline:
    """Organizer -> clusters -> Index, without a store."""

    def __init__(self, config: Config, backend: BackendKind = "none") -> None:
        if backend != "none":
            raise ValueError("the in-process pipeline only runs the lexical organizer")
        self.config = config
        self.index = Index.for_config(config)
        self._clusters = 0

    def ingest(self, turns: list[Turn]) -> None:
        mems = list(
            {m.id: m for m in (Memory.new(t.content, t.created_at) for t in turns)}.values()
        )
        clusters = organize_all(mems, self.config.session)
        self._clusters = len(clusters)
        self.index = Index.build(
            {c.id: c for c in clusters}, [], self.config.retrieval, self.config.ingest
        )

    def query(self, text: str, k: int) -> dict[str, Any]:
        return self.index.search(text, max_memories=k, token_budget=0).to_dict()

    def organization(self) -> Organization:
        return {
            "sessions": 1,
            "route_passes": 0,
            "routed": 0,
            "clusters": self._clusters,
            "unsorted": 0,
            "memories": len(self.index),
        }

    def settle(self) -> None:
        pass

    def close(self) -> None:
        pass


class EnginePipeline:
    """Protocol `batch`: a fresh store, the engine's ingest of the whole conversation, one
    clustering session over all of it, the engine's query (the path the socket serves)."""

    def __init__(
        self, config: Config, backend: BackendKind = "none", scope: str = DEFAULT_SCOPE
    ) -> None:
        from clagd.engine.core import Engine
        from clagd.engine.hooks import EngineHooks
        from clagd.organize.session import engine_session_runner
        from clagd.slm.manager import BackendManager
        from clagd.store.create import init_store

        self._tmp = tempfile.TemporaryDirectory(prefix="clagd-eval-")
        self.backend = backend
        self.scope = scope  # every memory and question of the run in this scope
        self.config = copy.deepcopy(config)
        self.config.backend.kind = backend
        root, _ = init_store(Path(self._tmp.name) / "store")
        # closed with the pipeline: a llama.cpp model is a worker process of ~2 GB, and one
        # per conversation was left running (and busy) after its conversation was done
        self.backends = BackendManager(self.config)
        runner = engine_session_runner(self.backends)
        self.engine = Engine(
            root, self.config, start=True, hooks=EngineHooks(session_runner=runner)
        )

    def ingest(self, turns: list[Turn]) -> None:
        items = [{"content": t.content, "created_at": t.created_at} for t in turns]
        self.engine.add(items, scope=None if self.scope == DEFAULT_SCOPE else self.scope)
        # one clustering pass over the whole conversation
        self.config.session.sample_size = max(self.config.session.sample_size, len(turns))
        self.engine.recluster(trigger="eval", backend=self.backend)

    def query(self, text: str, k: int) -> dict[str, Any]:
        # the eval reads every system's result as the socket's JSON
        res = self.engine.query(text, k, token_budget=0, scope=self.scope)
        return cast("dict[str, Any]", to_wire(res))

    def organization(self) -> Organization:
        return organization_of(cast("dict[str, Any]", to_wire(self.engine.status())))

    def settle(self) -> None:
        pass  # no triggers: the engine runs no scheduler

    def close(self) -> None:
        try:
            self.engine.close()
        finally:
            self.backends.close()
            self._tmp.cleanup()


class StreamEnginePipeline(EnginePipeline):
    """The stream protocol in-process: arrivals (one LoCoMo session, or `batch` turns) go
    to `Engine.ingest` one at a time, as the inbox watcher hands a file over; a threshold
    the engine reports (new memories, dialogue rounds) runs a session with the default
    config right after, as the daemon's scheduler does before the harness sees it idle;
    the route pass runs when a deferred batch waits (the daemon's housekeeping, which
    the stream harness waits out). Config and sample size stay the store's."""

    def __init__(
        self, config: Config, backend: BackendKind = "none", batch: int | None = None
    ) -> None:
        super().__init__(config, backend)
        self.batch = batch
        self._why: list[str] = []
        self.engine.hooks.on_threshold = self._why.append

    def ingest(self, turns: list[Turn]) -> None:
        for group in arrivals(turns, self.batch):
            raw = [{"content": t.content, "created_at": t.created_at} for t in group]
            items = [validate_item(r, f"item {i + 1}") for i, r in enumerate(raw)]
            self.engine.ingest(items, source="inbox", files=1)
            self.settle()

    def settle(self) -> None:
        """Run what the daemon's triggers would have run by the time it is idle: a
        session when a threshold was reached, the route pass when a batch waits."""
        if self._why:
            why = self._why[0]
            self._why.clear()
            self.engine.recluster(trigger=why)
        self.engine.maybe_route(force=True)
