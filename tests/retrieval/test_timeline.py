"""Time neighbours (clagd/retrieval/timeline.py): the order kept across snapshots equals
one built from scratch, and a query finds the reply to a matching memory that the organizer
filed in another cluster."""

import random
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from clagd.config import RetrievalConfig
from clagd.model import Cluster, Memory
from clagd.retrieval.index import Index
from clagd.retrieval.timeline import Timeline, id_keys

T0 = datetime(2024, 3, 1, tzinfo=timezone.utc)


def at(minutes: float) -> str:
    return (T0 + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_id_keys_sort_like_the_ids():
    mems = [Memory.new(f"note {i}", at(0)) for i in range(200)]
    ids = [m.id for m in mems]
    keys = id_keys(ids)
    assert [ids[i] for i in np.argsort(keys, kind="stable")] == sorted(ids)
    # any other id still gets a key, by its first bytes
    odd = id_keys(["m1", "zz-not-hex", "m-xyz"])
    assert len(odd) == 3 and len(set(odd.tolist())) == 3


def _reference(alive: np.ndarray, ts: np.ndarray, ids: list[str], gap: float):
    """Links from scratch: live slots sorted by (time, id), linked within the gap."""
    n = len(alive)
    prev, nxt = np.full(n, -1), np.full(n, -1)

    def when(i: int) -> float:
        return -np.inf if np.isnan(ts[i]) else float(ts[i])

    live = sorted(np.flatnonzero(alive).tolist(), key=lambda i: (when(i), ids[i]))
    for a, b in zip(live, live[1:]):
        if when(a) > -np.inf and when(b) - when(a) <= gap:
            nxt[a], prev[b] = b, a
    return live, prev, nxt


def test_incremental_updates_equal_a_timeline_from_scratch():
    """Batches of new slots (equal times, unknown times, out of order) and removals of
    old ones: after every update the order and links equal the reference."""
    rng = random.Random(5)
    gap = 30 * 60.0
    tl = Timeline(gap)
    alive = np.zeros(0, dtype=bool)
    ts = np.zeros(0, dtype=np.float64)
    ids: list[str] = []
    for step in range(80):
        k = rng.randint(0, 12)
        new_ts = [
            np.nan if rng.random() < 0.1 else 60.0 * rng.choice([0, 5, 5, 40, 41, 200, step])
            for _ in range(k)
        ]
        new_ids = [Memory.new(f"m {step} {i}", at(0)).id for i in range(k)]
        base = len(alive)
        alive = np.concatenate((alive, np.ones(k, dtype=bool)))
        # half the steps only add (links kept, relinked around the new slots)
        for slot in rng.sample(range(base), min(base, rng.choice([0, 0, 1, 3]))):
            alive[slot] = False  # removed (or changed: its new version is a new slot)
        ts = np.concatenate((ts, np.asarray(new_ts, dtype=np.float64)))
        ids += new_ids
        before = (tl.order.copy(), tl.prev.copy(), tl.next.copy())
        new = tl.updated(alive.copy(), ts, base, new_ids)
        order, prev, nxt = _reference(alive, ts, ids, gap)
        assert new.order.tolist() == order
        assert new.prev.tolist() == prev.tolist() and new.next.tolist() == nxt.tolist()
        # the old timeline is untouched (snapshots share it)
        assert [a.tolist() for a in (tl.order, tl.prev, tl.next)] == [b.tolist() for b in before]
        tl = new


def test_an_unchanged_set_of_memories_keeps_its_timeline():
    tl = Timeline(60.0).updated(np.ones(3, dtype=bool), np.array([0.0, 10, 20]), 0, ["a", "b", "c"])
    assert tl.updated(np.ones(3, dtype=bool), np.array([0.0, 10, 20]), 3, []) is tl
    grown = tl.updated(np.array([True, True, True, False]), np.array([0.0, 10, 20, 5]), 3, ["d"])
    assert grown.next.tolist() == [1, 2, -1, -1] and grown.prev.tolist() == [-1, 0, 1, -1]


def _conversation(neighbors: str, second: float = 0.0, top: int = 1) -> Index:
    """A question about a trip, its answer a turn later, and an aside between them in the
    other order; the organizer cut the episode so that the answer sits with the cooking
    talk of the same evening."""
    trip = Cluster(
        "c-0000000a",
        "Trip planning",
        memories=[
            Memory.new("Ana: How was the trip to Lisbon with your sister?", at(0)),
            Memory.new("Ben: We planned the Lisbon trip for months", at(60 * 24)),
            Memory.new("Ben: Lisbon trip photos are on the drive", at(60 * 48)),
        ],
    )
    evening = Cluster(
        "c-0000000b",
        "Cooking dinner",
        memories=[
            Memory.new("Ben: Wonderful, we ate pastries every single morning", at(0.2)),
            Memory.new("Ana: I baked bread tonight with rye flour", at(0.4)),
            Memory.new("Ben: Rye bread needs a long proof", at(0.6)),
            Memory.new("Ana: Bread flour is cheaper at the market", at(0.8)),
        ],
    )
    cfg = RetrievalConfig(top_clusters=top, neighbors=neighbors, second_neighbor_weight=second)
    return Index.build([trip, evening], [], cfg)


def test_the_reply_filed_in_another_cluster_is_found_by_its_time_neighbour():
    question = "What did Ben say about the trip to Lisbon with his sister?"
    answer = "Ben: Wonderful, we ate pastries every single morning"
    by_time = _conversation("time").search(question, max_memories=5, token_budget=0)
    assert by_time.clusters[0][0] == "c-0000000a"  # only the trip cluster is chosen
    got = [h.memory.content for h in by_time.memories]
    assert answer in got  # its cluster is not chosen: found through the turn before it
    assert len(got) == 4  # and nothing else of the cooking talk
    # neighbours inside the cluster only (before issue 13): the reply is out of reach
    by_cluster = _conversation("cluster").search(question, max_memories=5, token_budget=0)
    assert answer not in [h.memory.content for h in by_cluster.memories]


def test_memories_two_steps_away_in_time_lift_a_memory():
    q = "the Lisbon trip, and baked bread"
    s0, s1 = (
        {
            h.memory.content: h.score
            for h in _conversation("time", second=w, top=2).search(q, token_budget=0).memories
        }
        for w in (0.0, 0.5)
    )
    asked = "Ana: How was the trip to Lisbon with your sister?"
    baked = "Ana: I baked bread tonight with rye flour"  # two turns after the question
    best = max(s0.values())
    assert s0[asked] > 0 and s0[baked] > 0
    # the question's normalized BM25, half of it: exactly what the second step adds
    gained = s1[baked] - s0[baked]
    assert gained > 0.05
    reply = "Ben: Wonderful, we ate pastries every single morning"  # nothing 2 steps away
    assert s1.get(reply) == pytest.approx(s0.get(reply))
    later = "Ben: We planned the Lisbon trip for months"  # a day from anything: no links
    assert s1[later] == pytest.approx(s0[later]) and best >= s0[later]


def test_the_gap_keeps_other_days_apart():
    ix = _conversation("time")
    slot = {ix.memories.mems[i].content: i for i in range(len(ix.memories.mems))}
    q = slot["Ana: How was the trip to Lisbon with your sister?"]
    r = slot["Ben: Wonderful, we ate pastries every single morning"]
    d = slot["Ben: We planned the Lisbon trip for months"]
    assert ix.memories.time.next[q] == r and ix.memories.time.prev[r] == q
    assert ix.memories.time.prev[d] == -1 and ix.memories.time.next[d] == -1  # a day from anything
