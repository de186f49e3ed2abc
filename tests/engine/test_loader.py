"""Loading a store from its files in several processes (a start without a snapshot): the same
state and the same index as loading it in one, every broken file still named, and a loader
process that cannot start or dies costs only time."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from helpers import assert_same_index, make_store

from clagd.config import load_config
from clagd.engine import loader
from clagd.engine.core import Engine
from clagd.errors import StoreError
from clagd.model import Cluster, Memory
from clagd.retrieval.index import Index
from clagd.store.files import Paths, load_state, write_cluster, write_shard

TOPICS = [
    "boat sailing harbour wind",
    "garden tomatoes compost soil",
    "kitchen bread oven flour",
    "train station ticket platform",
    "piano lesson scales practice",
    "dog walk park leash",
]
QUERIES = ["sailing in the wind", "bread oven", "ticket for the train", "dog park", "tomatoes", "x"]


def _store(tmp_path: Path) -> Path:
    root = make_store(tmp_path / "m")
    paths = Paths(root)
    n = 0
    for i, topic in enumerate(TOPICS):
        mems = []
        for j in range(40):
            n += 1
            mems.append(
                Memory.new(
                    f"{topic} note {j} number {n} {'extra words ' * (j % 3)}",
                    f"2024-01-{1 + j % 28:02d}T10:00:00Z",
                )
            )
        write_cluster(
            paths, Cluster(f"c-{i:08x}", topic.split()[0].title() + " notes", memories=mems)
        )
    write_shard(
        paths, "u-20240101T000000-abcdef", [Memory.new("loose memory about boats and bread")]
    )
    write_cluster(
        paths,
        Cluster("c-0000ffff", "Old things", memories=[Memory.new("archived violin")]),
        archived=True,
    )
    return root


def _results(ix: Index) -> list[list[tuple[str, float]]]:
    now = datetime(2024, 2, 1, tzinfo=timezone.utc)  # the same freshness for every index
    return [[(h.memory.id, h.score) for h in ix.search(q, now=now).memories] for q in QUERIES]


def test_parallel_load_equals_a_load_in_one_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _store(tmp_path)
    cfg = load_config(root)
    one = loader.load_store(root, cfg, workers=1)
    many = loader.load_store(root, cfg, workers=3)
    # fewer chunks than processes
    monkeypatch.setattr(loader, "_chunks", lambda rels, sizes, procs: [rels[:3], rels[3:]])
    few = loader.load_store(root, cfg, workers=3)
    assert (one.workers, many.workers, few.workers) == (1, 3, 3)
    files = load_state(root)
    plain = Index.build(files.clusters, files.unsorted_memories(), cfg.retrieval, cfg.ingest)
    hot = {m.id for m, area, _ in files.all_memories() if area != "archive"}
    assert len(hot) == 241 and all(_results(plain)[:5])
    for got in (one, many, few):
        assert got.state.clusters == files.clusters
        assert list(got.state.clusters) == list(files.clusters)  # in the files' order
        assert got.state.archived == files.archived
        assert got.state.unsorted == files.unsorted
        # archived memories are not in the hot index
        assert got.index.memory_ids() == hot and len(got.index) == len(plain)
        assert got.index.n_clusters == plain.n_clusters == len(TOPICS)
        assert_same_index(got.index, plain)
        assert _results(got.index) == _results(plain)


def test_workers_are_spawned_while_another_thread_runs(tmp_path: Path) -> None:
    """fork only while the loading process runs no other thread (a forked child could
    inherit a lock another thread holds); the load is the same either way."""
    root = _store(tmp_path)
    if threading.active_count() == 1:
        assert loader._start_method().get_start_method() == "fork"
    forked = loader.load_store(root, workers=2)
    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        assert loader._start_method().get_start_method() == "spawn"
        spawned = loader.load_store(root, workers=2)
    finally:
        release.set()
        other.join()
    assert spawned.state == forked.state
    assert_same_index(spawned.index, forked.index)


def test_broken_files_are_named_whichever_process_read_them(tmp_path: Path) -> None:
    root = _store(tmp_path)
    (root / "clusters" / "c-00000002.yaml").write_text("id: c-00000002\nmemories: [unclosed\n")
    (root / "clusters" / "c-00000004.yaml").write_text("- not a mapping\n")
    with pytest.raises(StoreError) as exc:
        loader.load_store(root, workers=2)
    assert "c-00000002.yaml" in str(exc.value) and "c-00000004.yaml" in str(exc.value)


def _problem_stores(tmp_path: Path) -> list[tuple[str, Path]]:
    """Stores whose problems lie across files that different chunks (processes) read."""
    out = []
    for what in ("twice", "hot and archived", "unsorted twice", "bad id", "empty"):
        root = _store(tmp_path / what.replace(" ", "-"))
        paths = Paths(root)
        first = load_state(root).clusters["c-00000000"]
        if what == "twice":  # the first cluster's first memory also in the last cluster
            last = load_state(root).clusters["c-00000005"]
            last.memories.append(first.memories[0])
            write_cluster(paths, last)
        elif what == "hot and archived":
            write_cluster(paths, first, archived=True)
        elif what == "unsorted twice":
            write_shard(paths, "u-20240101T000000-bbbbbb", [first.memories[3]])
        else:
            bad = first.memories[5]
            if what == "bad id":
                bad.id = "m-nothex"
            else:
                bad.content = "  "
            write_cluster(paths, first)
        out.append((what, root))
    return out


def test_problems_across_processes_are_named_as_in_one_load(tmp_path: Path) -> None:
    for what, root in _problem_stores(tmp_path):
        with pytest.raises(StoreError) as plain:
            load_state(root)
        for workers in (1, 3):
            with pytest.raises(StoreError) as got:
                loader.load_store(root, workers=workers)
            assert str(got.value) == str(plain.value), (what, workers)


class _NoPool:
    def __init__(self, *a: Any, **k: Any) -> None:
        raise OSError("no processes here")


class _DeadPool:
    def __init__(self, *a: Any, **k: Any) -> None:
        pass

    def submit(self, *a: Any, **k: Any) -> Future:
        fut: Future = Future()
        fut.set_exception(BrokenProcessPool("a worker died"))
        return fut

    def shutdown(self, *a: Any, **k: Any) -> None:
        pass


@pytest.mark.parametrize("pool", [_NoPool, _DeadPool])
def test_a_loader_process_that_fails_costs_only_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, pool: type
) -> None:
    root = _store(tmp_path)
    monkeypatch.setattr(loader, "ProcessPoolExecutor", pool)
    with caplog.at_level(logging.WARNING, logger="clagd.loader"):
        got = loader.load_store(root, workers=2)
    assert got.state.clusters == load_state(root).clusters
    assert len(got.index) == 241
    assert "loading" in caplog.text


def test_a_large_store_starts_with_several_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _store(tmp_path)
    monkeypatch.setattr(loader, "PARALLEL_MIN_BYTES", 1)
    monkeypatch.setattr(loader, "_cpus", lambda: 2)
    eng = Engine(root)
    try:
        st = eng.status()
        assert (st.load_source, st.load_processes) == ("files", 2)
        hits = eng.query("bread in the oven", count_round=False).memories
        assert hits and "bread" in hits[0].content
    finally:
        eng.close()


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_memory_freed_after_loading_goes_back_to_the_system() -> None:
    from clagd.serve.daemon import release_free_memory

    blobs = [bytes(2000) for _ in range(100_000)]  # ~200 MB from malloc, as a load leaves
    pin = bytearray(3000)  # allocated last: the freed space is not at the top of the heap
    del blobs
    before = _rss_mb()
    assert release_free_memory()
    after = _rss_mb()
    assert before - after > 100, (before, after)
    assert len(pin) == 3000
