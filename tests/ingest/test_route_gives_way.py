"""Organizing's slices give way to writes (issue 26): an agent writing one memory after
another does not wait behind a route slice or an archive slice at every write."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers import git, make_store, wait_for

from clagd.engine import route_ops
from clagd.engine.core import Engine
from clagd.model import Cluster, Memory
from clagd.store import writequeue
from clagd.store.files import Paths, write_cluster

TOPICS = [
    "sailing boat harbour wind",
    "piano scales practice metronome",
    "garden tomato soil compost",
    "train ticket platform delay",
    "tax forms april receipts",
    "cat food bowl kibble",
]
PER_SLICE = 3  # writes run while a slice waits, then it runs anyway


def _store(tmp_path: Path) -> Path:
    root = make_store(
        tmp_path / "m", {"ingest": {"route_inline_max": 1, "route_delay_seconds": 60}}
    )
    for k, topic in enumerate(TOPICS):
        mems = [Memory.new(f"{topic} note {i}", f"2024-01-0{k + 1}T10:0{i}:00Z") for i in range(3)]
        write_cluster(Paths(root), Cluster(f"c-0000aa{k:02x}", topic.title(), memories=mems))
    git(root, "add", "-A")
    git(root, "commit", "-qm", "hand: six topics")
    return root


class Timeline:
    """The name of every operation the writer runs, in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.names: list[str] = []
        real = writequeue.Queued.run

        def run(item: writequeue.Queued, ctx: object) -> object:
            self.names.append(item.name)
            return real(item, ctx)  # type: ignore[arg-type]

        monkeypatch.setattr(writequeue.Queued, "run", run)

    def writes_before_each(self, name: str, start: int) -> list[int]:
        """For each `name` op from index `start` on: the other ops run since the one
        before it (or since `start`)."""
        out, since = [], 0
        for op in self.names[start:]:
            if op == name:
                out.append(since)
                since = 0
            else:
                since += 1
        return out


@contextmanager
def _agent_writing(eng: Engine) -> Iterator[None]:
    """An agent writing one memory after another (already under way) until the block
    ends; slices wait for PER_SLICE writes, never for a pause (the grace is a minute)."""
    eng.writer._q.grace, eng.writer._q.writes_per_slice = 60.0, PER_SLICE
    stop, written = threading.Event(), [0]

    def write() -> None:
        while not stop.is_set():
            eng.add([{"content": f"a note written while organizing runs, number {written[0]}"}])
            written[0] += 1

    agent = threading.Thread(target=write)
    agent.start()
    try:
        wait_for(lambda: written[0] >= 2, 30, "the agent's first writes")
        yield
    finally:
        stop.set()
        agent.join(30)


def test_route_slices_give_way_to_writes_that_keep_coming(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass of six slices under an agent that writes back to back: every slice waits
    until PER_SLICE writes have run (the writes never pause for a whole grace), so no
    write after the first PER_SLICE meets two slices in a row, and the pass still
    finishes. (Before, each slice was queued as the last one ended and ran before the
    agent's next write: one write, one slice.)"""
    monkeypatch.setattr(route_ops, "ROUTE_SLICE_CLUSTERS", 1)
    store = _store(tmp_path)
    eng = Engine(store)
    ops = Timeline(monkeypatch)
    try:
        res = eng.add([{"content": f"{t} once more"} for t in TOPICS])
        assert res.route_deferred
        eng.scorer.wait(10)
        with _agent_writing(eng):
            start = len(ops.names)
            assert eng.maybe_route(force=True, wait=False) is None
            wait_for(lambda: len(eng.routes) == 0, 120, "every slice of the route pass")
        eng.writer.call(lambda _ctx: None)  # the last slice's commit is in
        routes = ops.writes_before_each("_route_op", start)
        assert len(routes) >= len(TOPICS)
        # each slice ran after PER_SLICE writes (the first: one may have been running
        # when the pass was queued)
        assert routes[0] >= PER_SLICE - 1 and all(n == PER_SLICE for n in routes[1:])
        for k, topic in enumerate(TOPICS):  # each one routed into its topic's cluster
            assert (
                f"{topic} once more" in (store / "clusters" / f"c-0000aa{k:02x}.yaml").read_text()
            )
        route_commits = git(store, "log", "--format=%s").count("route: ")
        assert route_commits == len(TOPICS)
    finally:
        eng.close()


def test_without_writes_a_pass_runs_after_a_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With nothing written, the slices run one after another, each at most a grace
    after the last write: the pass is not held back."""
    monkeypatch.setattr(route_ops, "ROUTE_SLICE_CLUSTERS", 1)
    store = _store(tmp_path)
    eng = Engine(store)
    ops = Timeline(monkeypatch)
    try:
        eng.writer._q.grace = 0.3
        res = eng.add([{"content": f"{t} once more"} for t in TOPICS])
        assert res.route_deferred
        eng.scorer.wait(10)
        start = len(ops.names)
        t = time.monotonic()
        assert eng.maybe_route(force=True, wait=False) is None
        wait_for(lambda: len(eng.routes) == 0, 60, "every slice of the route pass")
        took = time.monotonic() - t
        assert ops.writes_before_each("_route_op", start) == [0] * len(TOPICS)
        # the first slice waited for the grace after the add; the others did not
        assert 0.25 <= took < 0.3 + 10
    finally:
        eng.close()


def test_archive_slices_give_way_to_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The archive job's slices are organizing too: under an agent writing back to back,
    each waits for PER_SLICE writes, and every cold cluster is archived in the end."""
    from clagd.engine import archive

    monkeypatch.setattr(archive, "ARCHIVE_SLICE", 2)
    store = _store(tmp_path)
    eng = Engine(store)
    ops = Timeline(monkeypatch)
    try:
        with _agent_writing(eng):
            start = len(ops.names)
            # every hand-made cluster is cold a year on
            out = eng.archive(now=time.time() + 365 * 86400)
        assert set(out.clusters) >= {f"c-0000aa{k:02x}" for k in range(len(TOPICS))}
        slices = ops.writes_before_each("_archive_op", start)
        assert len(slices) == len(out.clusters) // 2 + len(out.clusters) % 2
        assert all(n >= PER_SLICE for n in slices[1:])
        assert all(not (store / "clusters" / f"{c}.yaml").exists() for c in out.clusters)
    finally:
        eng.close()
