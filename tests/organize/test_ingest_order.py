"""Ties by ingest order: a batch add gives every memory the same created_at; the files and
the lexical organizer must keep the order the memories arrived in, never the content hash's."""

from __future__ import annotations

from pathlib import Path

from clagd.config import SessionConfig
from clagd.engine.core import Engine
from clagd.model import Memory
from clagd.organize.lexical import organize_all
from clagd.yamlio import load_yaml_file

TOPICS = {
    "garden": "tomatoes garden watering soil compost seedlings greenhouse harvest",
    "car": "car engine mechanic brakes tires oil garage repair",
    "piano": "piano lesson scales chords recital teacher practice sheet",
}
STAMP = "2025-05-01T10:00:00Z"


def _batch() -> list[str]:
    out = []
    for topic, vocab in TOPICS.items():
        ws = vocab.split()
        for i in range(8):
            out.append(f"{topic} {ws[i % 8]} {ws[(i + 3) % 8]} {ws[(i + 5) % 8]} note {i}")
    return out


def test_lexical_organizer_keeps_arrival_order_for_equal_times() -> None:
    texts = _batch()
    mems = [Memory.new(t, created_at=STAMP) for t in texts]
    # content-hash order differs from arrival order, so a hash tie-break would shuffle them
    assert [m.id for m in sorted(mems, key=lambda m: m.id)] != [m.id for m in mems]
    clusters = organize_all(mems, SessionConfig(target_cluster_size=8, min_cluster_size=2))
    assert len(clusters) == 3
    for c in clusters:
        topics = {m.content.split()[0] for m in c.memories}
        assert len(topics) == 1, [m.content for m in c.memories]
        order = [texts.index(m.content) for m in c.memories]
        assert order == sorted(order)


def test_batch_add_keeps_arrival_order_in_files_and_clusters(store: Path) -> None:
    texts = _batch()
    eng = Engine(store)
    try:
        eng.config.backend.kind = "none"
        eng.config.session.target_cluster_size = 8
        eng.add([{"content": t} for t in texts])  # one batch: one created_at for all
        shard_files = sorted((store / "unsorted").glob("*.yaml"))
        assert len(shard_files) == 1
        shard = load_yaml_file(shard_files[0])
        mems = shard["memories"] if isinstance(shard, dict) else shard
        assert len({m["created_at"] for m in mems}) == 1
        assert [m["content"] for m in mems] == texts
        res = eng.recluster(backend="none")
        assert res.status == "accepted", res
        files = sorted((store / "clusters").glob("*.yaml"))
        assert len(files) == 3
        for f in files:
            data = load_yaml_file(f)
            contents = [m["content"] for m in data["memories"]]
            assert len({c.split()[0] for c in contents}) == 1, contents
            order = [texts.index(c) for c in contents]
            assert order == sorted(order), contents
    finally:
        eng.close()
