"""A query process's copy of the index: the pickled index plus the writer's published
changes, applied in order, must answer every query exactly as the engine's own index, after
every kind of change (ingest, route pass, session, revert, archive, a whole reload)."""

from __future__ import annotations

import pickle
from pathlib import Path

from helpers import git, make_store

from clagd.engine.core import Engine, answer
from clagd.engine.hooks import EngineHooks
from clagd.protocol import QueryParams
from clagd.retrieval.index import Index

QUERIES = ["tea", "garden tomatoes", "meeting monday", "dog walk park", "bike repair", "x"]


def test_the_copy_answers_as_the_engine_after_every_change(tmp_path: Path) -> None:
    store = make_store(
        tmp_path / "m",
        {"ingest": {"route_inline_max": 5}, "archive": {"cold_after_days": 0, "min_size": 1}},
    )
    changes: list[bytes] = []
    hooks = EngineHooks(
        on_index=lambda ch: changes.append(pickle.dumps(ch, pickle.HIGHEST_PROTOCOL))
    )
    eng = Engine(store, hooks=hooks)
    copy: Index = pickle.loads(pickle.dumps(eng.index, pickle.HIGHEST_PROTOCOL))
    seen = 0

    def check(step: str) -> None:
        nonlocal copy, seen
        for data in changes[seen:]:
            copy = pickle.loads(data).applied_to(copy)
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
        assert out["status"] in ("accepted", "noop"), out
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
