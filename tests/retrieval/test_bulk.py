"""The start-up loader's index (`bulk.prepare` part by part, then `bulk.build`) is the one
`Index.build` gives for the same clusters and unsorted memories: every array, every posting
(compared by term, since term ids may differ), every cluster profile, and the same search
results, ids and scores, to the last bit."""

from __future__ import annotations

import random
import threading
from datetime import datetime, timedelta, timezone

import pytest
from helpers import assert_same_index

from clagd.change import IndexChange
from clagd.config import RetrievalConfig
from clagd.model import Cluster, Memory
from clagd.retrieval import bulk
from clagd.retrieval.index import Index

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
WORDS = (
    "boat sailing harbour wind garden tomatoes compost soil kitchen bread oven flour train "
    "station ticket platform piano lesson scales practice dog walk park leash running the a "
    "of and is was were Caroline Melanie adoption agency painting sunrise lake camping"
).split()
ODD = ["Café crème brûlée", "naïve résumé", "Straße", "ΣΊΣΥΦΟΣ ΣΑΣ", "İstanbul trip", "日本語 text"]
QUERIES = [
    "sailing in the wind",
    "bread oven flour",
    "ticket for the train platform",
    "dog park",
    "painting a sunrise at the lake",
    "résumé café",
    "σας",
    "adoption",
    "nothing matches zzz",
]


def _text(rng: random.Random) -> str:
    ws = [rng.choice(WORDS) for _ in range(rng.randint(1, 30))]
    ws += [f"w{rng.randrange(3000)}" for _ in range(rng.randint(0, 8))]  # a large vocabulary
    if rng.random() < 0.15:
        ws.insert(rng.randrange(len(ws) + 1), rng.choice(ODD))
    if rng.random() < 0.1:
        ws.append(rng.choice(["don't", "it's", "e-mail", "3.14", "x_y", "HELLO!!", "a\tb\nc"]))
    return " ".join(ws)


def _memory(rng: random.Random, i: int) -> Memory:
    if rng.random() < 0.05:
        at = "" if rng.random() < 0.5 else "not a time"  # unknown times: first in a chain
    else:  # ties in time on purpose: the chain orders them by id
        at = (T0 + timedelta(minutes=rng.randrange(400))).strftime("%Y-%m-%dT%H:%M:%SZ")
    meta = {"importance": rng.choice([0.1, 0.9, "high", 2])} if rng.random() < 0.2 else {}
    return Memory.new(f"{_text(rng)} #{i}", at, meta)


def _store(seed: int) -> tuple[list[Cluster], list[Memory]]:
    rng = random.Random(seed)
    n = 0
    clusters = []
    for c in range(25):
        k = 0 if c == 7 else rng.randint(1, 30)  # one empty cluster
        mems = [_memory(rng, n + j) for j in range(k)]
        n += k
        sup = {mems[1].id: mems[0].id} if k > 2 and c % 4 == 0 else {}
        tags = [rng.choice(WORDS) for _ in range(rng.randint(0, 3))]
        name = " ".join(rng.sample(WORDS, 2)) if c % 5 else "Café Straße"
        clusters.append(
            Cluster(
                f"c-{c:08x}",
                name,
                rng.choice(["", "notes on things"]),
                tags,
                memories=mems,
                supersedes=sup,
            )
        )
    unsorted = [_memory(rng, n + j) for j in range(40)]
    return clusters, unsorted


def _results(ix: Index) -> list[list[tuple[str, float]]]:
    now = T0 + timedelta(days=3)  # the same freshness for both
    return [
        [(h.memory.id, h.score) for h in ix.search(q, 10, 0, now=now).memories] for q in QUERIES
    ]


def _parts(clusters: list[Cluster], unsorted: list[Memory], cuts: list[int]) -> list:
    """The store split like the loader splits it: runs of files, each with its clusters
    and the unsorted memories of its shards."""
    parts = []
    bounds = [0, *cuts, len(clusters)]
    ubounds = [0, *[len(unsorted) * c // len(clusters) for c in cuts], len(unsorted)]
    for i in range(len(bounds) - 1):
        parts.append(
            bulk.prepare(
                clusters[bounds[i] : bounds[i + 1]],
                unsorted[ubounds[i] : ubounds[i + 1]],
                stem=True,
                stopwords=True,
            )
        )
    return parts


@pytest.mark.parametrize("neighbors", ["time", "cluster"])
@pytest.mark.parametrize("cuts", [[], [10], [3, 4, 20], [0, 10, 10, 25]])  # empty parts too
def test_bulk_build_equals_index_build(neighbors: str, cuts: list[int]) -> None:
    clusters, unsorted = _store(seed=len(cuts))
    cfg = RetrievalConfig(neighbors=neighbors)  # type: ignore[arg-type]
    plain = Index.build(clusters, unsorted, cfg)
    got = bulk.build(_parts(clusters, unsorted, cuts), cfg)
    assert len(got) == sum(len(c.memories) for c in clusters) + len(unsorted)
    assert_same_index(got, plain)
    results = _results(plain)
    assert sum(map(len, results)) > 30  # the queries find things
    assert _results(got) == results


def test_a_bulk_built_index_takes_changes_like_any_other() -> None:
    clusters, unsorted = _store(seed=5)
    cfg = RetrievalConfig()
    plain = Index.build(clusters, unsorted, cfg)
    got = bulk.build(_parts(clusters, unsorted, [12]), cfg)
    extra = [Memory.new("a new note about sailing boats in the harbour", "2024-01-02T00:00:00Z")]
    change = {
        "upsert_clusters": [Cluster("c-000000aa", "Sailing", memories=extra), clusters[3]],
        "remove_clusters": [clusters[0].id],
        "remove_unsorted": [unsorted[0].id],
    }
    a, b = got.apply(IndexChange(**change)), plain.apply(IndexChange(**change))
    assert _results(a) == _results(b)
    assert a.memory_ids() == b.memory_ids()


def test_ids_named_twice_are_left_to_index_build() -> None:
    clusters, unsorted = _store(seed=3)
    twice = [*unsorted, clusters[2].memories[0]]  # a memory in a cluster and unsorted
    plain = Index.build(clusters, twice)
    got = bulk.build(_parts(clusters, twice, [9]))
    assert_same_index(got, plain)


def test_no_memories_at_all() -> None:
    got = bulk.build([bulk.prepare([], [], True, True)])
    assert len(got) == 0 and got.n_clusters == 0
    assert got.search("anything").memories == []
    empty = bulk.build([bulk.prepare([Cluster("c-00000001", "Empty")], [], True, True)])
    assert empty.n_clusters == 1 and empty.search("empty").memories == []


def test_threads_preparing_at_once_each_have_their_own_vocabulary() -> None:
    """Two engines starting in one process may prepare their stores in two threads at once:
    each numbers its terms in its own vocabulary (one shared list could give two terms one
    id when the threads interleave), and both builds are right."""
    from concurrent.futures import ThreadPoolExecutor

    stores = [_store(seed) for seed in range(2)]
    both = threading.Barrier(2)  # two threads, each in its own task

    def prepare_in_a_thread(store: tuple[list[Cluster], list[Memory]]) -> tuple[object, Index]:
        both.wait(timeout=10)
        return bulk._words(True, True), bulk.build(_parts(store[0], store[1], [5, 9]))

    with ThreadPoolExecutor(2) as pool:
        vocabs, built = zip(*pool.map(prepare_in_a_thread, stores))
    assert vocabs[0] is not vocabs[1]
    for (clusters, unsorted), got in zip(stores, built):
        assert_same_index(got, Index.build(clusters, unsorted))
