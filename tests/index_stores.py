"""Small stores for the retrieval tests: memories a minute apart, two tiny clusters, a
random store of a few words."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest

from clagd.model import Cluster, Memory
from clagd.retrieval.index import Index

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)


def mem(text: str, i: int = 0, **meta) -> Memory:
    at = (T0 + timedelta(minutes=i)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return Memory.new(text, created_at=at, metadata=meta)


def cluster(cid: str, name: str, texts: list[str], start: int = 0, **kw) -> Cluster:
    """Members one minute apart from `start` minutes after T0 (clusters of the same minutes
    are one conversation: their memories are each other's time neighbours)."""
    return Cluster(cid, name, memories=[mem(t, start + i) for i, t in enumerate(texts)], **kw)


HIKING = cluster(
    "c-00000001",
    "Hiking Trips",
    ["I love hiking in the mountains", "New hiking boots arrived", "Rain ruined the hike"],
)
COOKING = cluster(
    "c-00000002",
    "Cooking Recipes",
    ["Lasagna recipe uses ricotta", "Baked bread with rye flour", "Tomato soup for dinner"],
    start=24 * 60,  # the next day
)


def random_store(seed: int, n_clusters: int = 6, per: int = 8, n_unsorted: int = 10):
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(120)]
    clusters = {}
    k = 0
    for c in range(n_clusters):
        texts = [
            " ".join(rng.choices(vocab, k=rng.randint(3, 12))) + f" u{k + i}" for i in range(per)
        ]
        k += per
        cid = f"c-{c:08x}"
        clusters[cid] = cluster(cid, f"Topic {c} notes", texts)
    unsorted = [mem(" ".join(rng.choices(vocab, k=6)) + f" x{i}", i) for i in range(n_unsorted)]
    return clusters, unsorted, vocab, rng


def same_results(a: Index, b: Index, queries: list[str]) -> None:
    assert len(a) == len(b) and a.n_clusters == b.n_clusters
    for q in queries:
        sa = a.memory_scores(q)
        sb = b.memory_scores(q)
        assert sa.keys() == sb.keys()
        for mid in sa:
            assert sa[mid] == pytest.approx(sb[mid], rel=1e-5, abs=1e-6)
        ra, rb = a.search(q, max_memories=7), b.search(q, max_memories=7)
        assert [h.memory.id for h in ra.memories] == [h.memory.id for h in rb.memories]
        assert [h.score for h in ra.memories] == pytest.approx([h.score for h in rb.memories])
        assert ra.context == rb.context


def routing_store(seed: int):
    """Nine topical clusters (each with words of its own) and 122 new memories to route, some
    clearly of one cluster, some of none."""
    clusters, unsorted, vocab, rng = random_store(seed, n_clusters=9, per=6, n_unsorted=0)
    # topical clusters: each has its own words, so routing has clear winners
    for j, cid in enumerate(sorted(clusters)):
        c = clusters[cid]
        own = [f"t{j}x{k}" for k in range(4)]
        clusters[cid] = Cluster(
            cid,
            c.name,
            memories=[
                mem(m.content + " " + " ".join(rng.choices(own, k=3)), i)
                for i, m in enumerate(c.memories)
            ],
        )
    batch = []
    for i in range(120):
        j = rng.randrange(9)
        own = [f"t{j}x{k}" for k in range(4)]
        words = rng.choices(vocab, k=rng.randint(0, 6)) + rng.choices(own, k=rng.randint(0, 3))
        batch.append(mem(" ".join(words) + f" r{i} r{i}", 100 + i))
    batch.append(mem("zzz qqq unknown words only", 999))
    batch.append(mem("the and of", 998))
    return clusters, batch
