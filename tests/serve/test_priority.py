"""`server.background_nice`: the organizing threads are registered where they start and
niced by that registration, whatever they are called."""

from __future__ import annotations

import os
import threading

from clagd.serve.priority import OrganizingThreads


def niceness(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


def run_registered(group: OrganizingThreads, name: str, stop: threading.Event) -> list[int]:
    """Start a thread named `name` that registers itself, and wait until it has."""
    tid: list[int] = []
    ready = threading.Event()

    def body() -> None:
        group.enter()
        tid.append(threading.get_native_id())
        ready.set()
        stop.wait(30)

    threading.Thread(target=body, name=name, daemon=True).start()
    assert ready.wait(10)
    return tid


def test_registered_threads_run_nicer_before_and_after_lower() -> None:
    group, stop = OrganizingThreads(), threading.Event()
    mine = niceness(threading.get_native_id())
    try:
        early = run_registered(group, "any-name-at-all", stop)
        other = threading.Thread(target=stop.wait, args=(30,), name="clagd-writer", daemon=True)
        other.start()  # named like an organizing thread, but not registered
        assert group.lower(5) == 1
        late = run_registered(group, "ThreadPoolExecutor-9_9", stop)
        assert niceness(early[0]) == niceness(late[0]) == min(19, mine + 5)
        assert other.native_id is not None and niceness(other.native_id) == mine
        assert niceness(threading.get_native_id()) == mine  # the caller keeps its own
        assert len(group.threads()) == 2
    finally:
        stop.set()


def test_no_nice_changes_nothing() -> None:
    group, stop = OrganizingThreads(), threading.Event()
    mine = niceness(threading.get_native_id())
    try:
        tid = run_registered(group, "t", stop)
        assert group.lower(0) == 0
        assert niceness(tid[0]) == mine
    finally:
        stop.set()


def test_the_settled_heap_is_frozen_and_full_collections_are_rare() -> None:
    """After its start the daemon freezes the loaded heap and makes a full collection rare:
    each is a stop-the-world pass over every object made since, the tail of `add` latency
    while sessions run (docs/retrieval.md, "Stop 35")."""
    import gc

    from clagd.serve import daemon

    before = gc.get_threshold()
    try:
        daemon.Daemon._settle_heap()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (before[0], before[1], daemon.FULL_GC_EVERY)
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
