"""A query process's copy of the index: the pickled index plus the writer's published
changes, applied in order, must answer every query exactly as the engine's own index, after
every kind of change (ingest, route pass, session, revert, archive, a whole reload)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from helpers import git, make_store

from clagd.change import IndexChange
from clagd.engine.answer import answer
from clagd.engine.core import Engine
from clagd.engine.hooks import EngineHooks
from clagd.protocol import QueryParams
from clagd.retrieval.index import Index
from clagd.serve.control import Applied
from clagd.serve.query_worker import Replica

QUERIES = ["tea", "garden tomatoes", "meeting monday", "dog walk park", "bike repair", "x"]


class _Published:
    """An index publisher that only keeps what it is published, pickled as a query process
    gets it (it prepares nothing)."""

    def __init__(self) -> None:
        self.changes: list[bytes] = []

    def prepare(self, change: IndexChange) -> None:
        return None

    def publish(self, change: IndexChange, prepared: None) -> None:
        self.changes.append(pickle.dumps(change, pickle.HIGHEST_PROTOCOL))


def test_the_copy_answers_as_the_engine_after_every_change(tmp_path: Path) -> None:
    store = make_store(
        tmp_path / "m",
        {"ingest": {"route_inline_max": 5}, "archive": {"cold_after_days": 0, "min_size": 1}},
    )
    published = _Published()
    changes = published.changes
    eng = Engine(store, hooks=EngineHooks(index_publisher=published))
    copy: Index = pickle.loads(pickle.dumps(eng.index, pickle.HIGHEST_PROTOCOL))
    seen = 0

    def check(step: str) -> None:
        nonlocal copy, seen
        for data in changes[seen:]:
            copy = copy.apply(pickle.loads(data))
        seen = len(changes)
        assert len(copy) == len(eng.index), step
        for q in QUERIES:
            mine, _, _ = answer(copy, QueryParams(q))
            theirs, _, _ = answer(eng.index, QueryParams(q))
            assert mine == theirs, (step, q)

    topics = ["tea", "garden tomatoes", "meeting monday", "dog walk park", "bike repair"]
    try:
        for r in range(6):
            eng.add([{"content": f"{t} note {r} {i}"} for i, t in enumerate(topics)])
            check(f"add {r}")
        eng.add([{"content": f"{topics[i % 5]} bulk {i}"} for i in range(40)])  # a shard
        check("bulk add")
        eng.maybe_route(wait=True)
        check("route pass")
        out = eng.recluster("manual")
        assert out.status in ("accepted", "noop"), out
        check("session")
        eng.revert(git(store, "rev-parse", "HEAD").strip())
        check("revert")
        eng.archive()
        check("archive")
        # a hand edit committed by the person: taken in from outside
        (store / "unsorted" / "hand.yaml").write_text(
            "memories:\n- id: m-0123456789abcdef\n  content: tea by hand\n"
            "  created_at: '2024-01-01T00:00:00Z'\n"
        )
        git(store, "add", "-A")
        git(store, "commit", "-qm", "by hand")
        eng.check_outside()
        check("outside edit")
        assert len(changes) >= 10
    finally:
        eng.close()


def test_the_compute_lock_of_a_query_process_is_taken_in_the_order_asked() -> None:
    """Connection threads of a query process take turns in arrival order: one that arrives
    while others wait cannot overtake them (the 16-client tail)."""
    import threading

    from helpers import wait_for

    from clagd.serve.query_worker import FairLock

    lock = FairLock()
    order: list[int] = []
    threads = []
    lock.__enter__()
    for i in range(8):

        def take(i: int = i) -> None:
            with lock:
                order.append(i)

        t = threading.Thread(target=take)
        t.start()
        threads.append(t)
        wait_for(lambda i=i: len(lock._waiters) == i + 1, 10, f"thread {i} to queue")
    lock.__exit__(None, None, None)
    for t in threads:
        t.join(10)
    assert order == list(range(8))
    with lock:  # free again, and taken at once
        pass


class _Channel:
    """The control channel's daemon end, as far as a Replica writes to it."""

    def __init__(self) -> None:
        self.sent: list[object] = []

    def send_bytes(self, data: bytes) -> None:
        self.sent.append(pickle.loads(data))


class _ToReplica:
    """The query processes' publisher, with one Replica in this process: each change goes
    pickled to `prepare` (the snapshot is made, not served), then `commit` serves what was
    prepared; a change published without being prepared comes whole as `apply`."""

    def __init__(self, store: Path, channel: _Channel) -> None:
        self.store = store
        self.channel = channel
        self.replica: Replica | None = None
        self.served: list[str] = []
        self.heads: list[str] = []  # HEAD when each change was prepared

    def prepare(self, change: IndexChange) -> int:
        replica = self.replica
        assert replica is not None
        self.heads.append(git(self.store, "rev-parse", "HEAD").strip())
        before = replica.index
        replica.prepare(pickle.loads(pickle.dumps(change, pickle.HIGHEST_PROTOCOL)))
        assert replica.index is before  # not served before its commit
        return replica.version

    def publish(self, change: IndexChange, prepared: int | None) -> None:
        replica = self.replica
        assert replica is not None
        version = replica.version + 1
        if prepared is not None:
            assert prepared == replica.version  # prepared on the snapshot it still serves
            replica.commit(version)
            self.served.append("commit")
        else:
            replica.apply(version, pickle.loads(pickle.dumps(change, pickle.HIGHEST_PROTOCOL)))
            self.served.append("apply")
        assert self.channel.sent[-1] == Applied(version)


def test_a_copy_that_prepares_beside_each_commit_answers_as_the_engine(tmp_path: Path) -> None:
    """The query process's way: each change arrives first as `prepare` (while the writer's
    git runs) and is served on `commit`; a change the engine published without preparing
    it comes whole as `apply`. Its answers equal the engine's, and it serves a prepared
    snapshot only once committed."""
    store = make_store(tmp_path / "m", {"ingest": {"route_inline_max": 5}})
    to = _ToReplica(store, _Channel())
    eng = Engine(store, hooks=EngineHooks(index_publisher=to))
    to.replica = Replica(to.channel, pickle.loads(pickle.dumps(eng.index)), 0)  # type: ignore[arg-type]
    topics = ["tea", "garden tomatoes", "meeting monday", "dog walk park", "bike repair"]
    try:
        for r in range(4):
            eng.add([{"content": f"{t} note {r} {i}"} for i, t in enumerate(topics)])
        eng.add([{"content": f"{topics[i % 5]} bulk {i}"} for i in range(40)])
        eng.maybe_route(wait=True)
        assert eng.recluster("manual").status in ("accepted", "noop")
        assert to.served.count("commit") >= 6, to.served
        assert len(to.replica.index) == len(eng.index)
        for q in QUERIES:
            mine = answer(to.replica.index, QueryParams(q))[0]
            assert mine == answer(eng.index, QueryParams(q))[0]
    finally:
        eng.close()


def test_a_prepared_change_whose_commit_failed_is_never_served() -> None:
    from clagd.errors import ClagdError
    from clagd.model import Memory

    channel = _Channel()
    base = Index.build([], [Memory.new("the first note")])
    replica = Replica(channel, base, 3)  # type: ignore[arg-type]
    failed = IndexChange(add_unsorted=(Memory.new("a note whose commit failed"),))
    replica.prepare(failed)
    assert replica.index is base and replica.version == 3
    landed = IndexChange(add_unsorted=(Memory.new("the note that was committed"),))
    replica.apply(4, landed)  # the next change comes whole: what was prepared is dropped
    assert replica.pending is None and replica.version == 4
    texts = {h.memory.content for h in replica.index.search("note", max_memories=10).memories}
    assert texts == {"the first note", "the note that was committed"}
    with pytest.raises(ClagdError, match="never prepared"):
        replica.commit(5)
    assert replica.version == 4 and channel.sent == [Applied(4)]


def test_a_change_is_sent_to_prepare_before_its_commit_exists(tmp_path: Path) -> None:
    """The query processes make their snapshot while the git thread writes the files and
    commits them: the change reaches them before the commit exists, and it is published
    (as `commit`, never whole) once it does."""
    store = make_store(tmp_path / "m")
    to = _ToReplica(store, _Channel())
    eng = Engine(store, hooks=EngineHooks(index_publisher=to))
    to.replica = Replica(to.channel, pickle.loads(pickle.dumps(eng.index)), 0)  # type: ignore[arg-type]
    try:
        head = git(store, "rev-parse", "HEAD").strip()
        out = eng.add([{"content": "a note prepared early"}])
        assert to.heads == [head]
        assert git(store, "rev-parse", "HEAD").strip() == out.commit != head
        assert to.served == ["commit"]
        assert to.replica.index.search("prepared early", max_memories=1).memories
    finally:
        eng.close()
