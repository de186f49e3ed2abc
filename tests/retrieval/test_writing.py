"""Changing a snapshot (`Index.apply`, `retrieval.writing`): every change equals a rebuild,
compaction keeps the answers, old snapshots stay as they were, pickles of another format
are refused."""

from __future__ import annotations

import random

import pytest
from index_stores import HIKING, mem, random_store, routing_store, same_results

from clagd.change import IndexChange
from clagd.model import Cluster, Memory
from clagd.retrieval.index import Index
from clagd.retrieval.snapshot import _with_supersedes


def test_incremental_apply_equals_full_rebuild():
    clusters, unsorted, vocab, rng = random_store(1)
    ix = Index.build(clusters, unsorted)
    cids = sorted(clusters)
    # a session: one cluster removed, one changed (takes two unsorted memories), new unsorted
    gone = cids[0]
    changed = clusters[cids[1]]
    moved = unsorted[:2]
    changed2 = Cluster(changed.id, "Renamed topic", memories=changed.memories[2:] + moved)
    added = [mem("fresh note " + " ".join(rng.choices(vocab, k=5)), 99)]
    inc = ix.apply(
        IndexChange(
            upsert_clusters=[changed2],
            remove_clusters=[gone],
            add_unsorted=added,
            remove_unsorted=[m.id for m in moved],
        )
    )
    final = {cid: c for cid, c in clusters.items() if cid != gone}
    final[changed2.id] = changed2
    full = Index.build(final, unsorted[2:] + added)
    queries = [" ".join(rng.choices(vocab, k=3)) for _ in range(25)] + ["renamed topic w3"]
    same_results(inc, full, queries)
    # the old snapshot is untouched
    same_results(ix, Index.build(clusters, unsorted), queries[:5])


def test_compaction_keeps_results():
    clusters, unsorted, vocab, rng = random_store(2, n_clusters=3, per=5, n_unsorted=1200)
    ix = Index.build(clusters, unsorted)
    ix2 = ix.apply(IndexChange(remove_unsorted=[m.id for m in unsorted[:1100]]))
    assert len(ix2.memories.mems) == len(ix2)  # dead slots outnumbered live ones: compacted
    full = Index.build(clusters, unsorted[1100:])
    same_results(ix2, full, [" ".join(rng.choices(vocab, k=3)) for _ in range(10)])


def test_many_mixed_changes_equal_a_full_rebuild():
    """Ingest batches, routing into clusters, sessions that move, merge, split, rename and
    delete clusters, metadata edits: after every step the incremental snapshot answers
    exactly like one built from scratch, and older snapshots keep their answers."""
    clusters, unsorted, vocab, rng = random_store(3, n_clusters=5, per=6, n_unsorted=8)
    clusters = dict(clusters)
    unsorted = list(unsorted)
    ix = Index.build(clusters, unsorted)
    history = [(ix, dict(clusters), list(unsorted))]
    queries = [" ".join(rng.choices(vocab, k=3)) for _ in range(8)] + ["topic notes w7"]
    n = 1000
    for step in range(60):
        op = rng.choice(["ingest", "route", "session", "delete", "rename", "edit", "split"])
        kw: dict = {}
        if op == "ingest":
            new = [mem(" ".join(rng.choices(vocab, k=5)) + f" n{n + i}", n + i) for i in range(4)]
            n += 4
            unsorted += new
            kw = {"add_unsorted": new}
        elif op == "route" and clusters:
            cid = rng.choice(sorted(clusters))
            m = mem(" ".join(rng.choices(vocab, k=4)) + f" r{n}", n)
            n += 1
            c = clusters[cid]
            clusters[cid] = Cluster(cid, c.name, memories=[*c.memories, m])
            kw = {"upsert_clusters": [clusters[cid]]}
        elif op == "session" and unsorted and clusters:
            take = unsorted[: rng.randint(1, 4)]
            unsorted = unsorted[len(take) :]
            a, b = (
                (rng.sample(sorted(clusters), 2) + [None])[:2]
                if len(clusters) > 1
                else (
                    next(iter(clusters)),
                    None,
                )
            )
            merged = clusters[a].memories + take
            removed = []
            if b is not None and rng.random() < 0.5:  # merge b into a
                merged += clusters.pop(b).memories
                removed = [b]
            clusters[a] = Cluster(a, f"Merged {step}", memories=merged)
            kw = {
                "upsert_clusters": [clusters[a]],
                "remove_clusters": removed,
                "remove_unsorted": [m.id for m in take],
            }
        elif op == "delete" and clusters:
            cid = rng.choice(sorted(clusters))
            back = clusters.pop(cid).memories
            unsorted += back  # its memories go back to unsorted
            kw = {"remove_clusters": [cid], "add_unsorted": back}
        elif op == "rename" and clusters:
            cid = rng.choice(sorted(clusters))
            c = clusters[cid]
            clusters[cid] = Cluster(
                cid, f"Renamed {step}", "new words", ["tag"], memories=c.memories
            )
            kw = {"upsert_clusters": [clusters[cid]]}
        elif op == "edit" and clusters:
            cid = rng.choice(sorted(clusters))
            c = clusters[cid]
            if c.memories:
                old = c.memories[0]
                edited = Memory(old.id, old.content, old.created_at, {"importance": 0.9})
                clusters[cid] = Cluster(cid, c.name, memories=[edited, *c.memories[1:]])
                kw = {"upsert_clusters": [clusters[cid]]}
        elif op == "split" and clusters:
            cid = rng.choice(sorted(clusters))
            c = clusters[cid]
            half = len(c.memories) // 2
            if half:
                nid = f"c-{0xF000 + step:08x}"
                clusters[cid] = Cluster(cid, c.name, memories=c.memories[:half])
                clusters[nid] = Cluster(nid, f"Split {step}", memories=c.memories[half:])
                kw = {"upsert_clusters": [clusters[cid], clusters[nid]]}
        if not kw:
            continue
        ix = ix.apply(IndexChange(**kw))
        history.append((ix, dict(clusters), list(unsorted)))
        if step % 5 == 0:
            same_results(ix, Index.build(clusters, unsorted), queries)
    same_results(ix, Index.build(clusters, unsorted), queries)
    for old, cl, un in history[::7]:  # snapshots are immutable
        same_results(old, Index.build(cl, un), queries[:3])


def _links(ix: Index) -> list[tuple[str, str]]:
    """The snapshot's supersedes links as (superseded id, successor id), in its order."""
    mems = ix.memories.mems
    return [(mems[a].id, mems[b].id) for a, b in zip(ix.sup_old.tolist(), ix.sup_new.tolist())]


def test_supersedes_links_follow_every_change():
    """A change carries the clusters with supersedes links over (`Index.sup_cslots`)
    instead of looking at every cluster: after links are made, cleared, their clusters
    rewritten or removed, they are the ones of a look at every cluster, in its order, and
    the links equal a rebuild's."""
    clusters, unsorted, vocab, rng = random_store(5, n_clusters=6, per=5, n_unsorted=4)
    ix = Index.build(clusters, unsorted)
    queries = [" ".join(rng.choices(vocab, k=3)) for _ in range(6)]
    for step in range(40):
        cid = rng.choice(sorted(clusters))
        c = clusters[cid]
        op = rng.choice(["link", "link", "clear", "remove", "route", "unsorted"])
        kw: dict = {}
        if op == "link" and len(c.memories) > 1:
            a, b = rng.sample(c.memories, 2)
            sup = {**c.supersedes, b.id: a.id}
            clusters[cid] = Cluster(cid, c.name, memories=c.memories, supersedes=sup)
            kw = {"upsert_clusters": [clusters[cid]]}
        elif op == "clear" and c.supersedes:
            clusters[cid] = Cluster(cid, c.name, memories=c.memories)
            kw = {"upsert_clusters": [clusters[cid]]}
        elif op == "remove" and len(clusters) > 2:
            del clusters[cid]
            kw = {"remove_clusters": [cid]}
        elif op == "route":
            m = mem(" ".join(rng.choices(vocab, k=4)) + f" s{step}", 500 + step)
            clusters[cid] = Cluster(cid, c.name, memories=[*c.memories, m], supersedes=c.supersedes)
            kw = {"upsert_clusters": [clusters[cid]]}
        else:
            m = mem(" ".join(rng.choices(vocab, k=4)) + f" t{step}", 900 + step)
            unsorted.append(m)
            kw = {"add_unsorted": [m]}
        if kw:
            ix = ix.apply(IndexChange(**kw))
        full = Index.build(clusters, unsorted)
        # the order of a looking at every cluster (slot_of's), the links of a rebuild
        assert ix.sup_cslots == _with_supersedes(ix.profiles)
        assert sorted(_links(ix)) == sorted(_links(full))
        if step % 8 == 0:
            same_results(ix, full, queries)


def _answers(ix: Index, queries: list[str], batch: list[Memory]) -> list:
    """Everything a query or a route reads of a snapshot, floats exactly."""
    out: list = [ix.route_many(batch), sorted(ix.memory_scores(queries[0]).items())]
    for q in queries:
        r = ix.search(q, max_memories=7)
        out.append(([(h.memory.id, h.cluster_id, h.score) for h in r.memories], r.clusters))
        out.append(ix.cluster_candidates(q, 5))
    return out


def test_cluster_compaction_keeps_every_answer(monkeypatch: pytest.MonkeyPatch):
    """Routed memories and sessions leave dead cluster slots behind (a rewritten cluster
    gets a new slot); once they outnumber the live clusters the cluster level is compacted
    (`writing.clusters_compacted`). The compacted lineage answers exactly like one that
    never compacts (ids, float scores, the clusters chosen, routes), and stays small."""
    import clagd.retrieval.snapshot as snapshot

    clusters, batch = routing_store(6)
    ixs = {4: Index.build(clusters, []), 10**9: Index.build(clusters, [])}
    rng = random.Random(6)
    queries = [m.content for m in batch[:6]] + ["topic notes w7"]
    for step in range(120):
        cid = rng.choice(sorted(clusters))
        c = clusters[cid]
        m = batch[step % len(batch)]
        m = mem(m.content + f" s{step}", 2000 + step)
        kw: dict = {}
        if step % 9 == 4 and len(c.memories) > 1:  # a session: one cluster split in two
            nid = f"c-{0xE000 + step:08x}"
            half = len(c.memories) // 2
            first = c.memories[:half]
            sup = {first[1].id: first[0].id} if half > 1 else {}  # and a supersedes link
            clusters[cid] = Cluster(cid, c.name, memories=first, supersedes=sup)
            clusters[nid] = Cluster(nid, f"Split {step}", memories=c.memories[half:])
            kw = {"upsert_clusters": [clusters[cid], clusters[nid]]}
        elif step % 13 == 6 and len(clusters) > 3:  # a merge
            other = rng.choice(sorted(set(clusters) - {cid}))
            merged = c.memories + clusters.pop(other).memories
            clusters[cid] = Cluster(cid, c.name, memories=merged)
            kw = {"upsert_clusters": [clusters[cid]], "remove_clusters": [other]}
        else:  # a routed memory
            clusters[cid] = Cluster(cid, c.name, memories=[*c.memories, m])
            kw = {"upsert_clusters": [clusters[cid]]}
        for limit in ixs:
            monkeypatch.setattr(snapshot, "DEAD_CLUSTERS_MIN", limit)
            ixs[limit] = ixs[limit].apply(IndexChange(**kw), routes=True)
        small, big = ixs[4], ixs[10**9]
        assert len(small.profiles.alive) <= 2 * max(4, small.n_clusters) + 2
        assert small.sup_cslots == _with_supersedes(small.profiles)
        assert sorted(_links(small)) == sorted(_links(big))
        if step % 10 == 0 or step == 119:
            assert _answers(small, queries, batch) == _answers(big, queries, batch)
    assert len(ixs[10**9].profiles.alive) > 3 * len(ixs[4].profiles.alive)
    assert _links(ixs[4])


def test_compaction_after_many_removals_keeps_answers():
    clusters, unsorted, vocab, rng = random_store(4, n_clusters=4, per=5, n_unsorted=0)
    ix = Index.build(clusters, [])
    live: list[Memory] = []
    for batch in range(12):
        new = [mem(" ".join(rng.choices(vocab, k=5)) + f" b{batch}x{i}", i) for i in range(200)]
        ix = ix.apply(IndexChange(add_unsorted=new, remove_unsorted=[m.id for m in live[:150]]))
        live = live[150:] + new
    assert len(ix.memories.mems) < 2 * len(ix) + 1100  # compacted along the way
    same_results(
        ix, Index.build(clusters, live), [" ".join(rng.choices(vocab, k=3)) for _ in range(6)]
    )


def test_search_cache_is_per_snapshot():
    ix = Index.build({HIKING.id: HIKING}, [])
    a = ix.search("hiking boots")
    assert ix.search("hiking boots") is a and ix.cache_hits == 1
    ix2 = ix.apply(IndexChange(add_unsorted=[mem("hiking boots on sale", 20)]))
    b = ix2.search("hiking boots")
    assert b is not a and ix2.cache_hits == 0
    assert "hiking boots on sale" in b.context


def test_old_snapshot_pickles_are_refused():
    import pickle

    ix = Index.build({HIKING.id: HIKING}, [])
    back = pickle.loads(pickle.dumps(ix))
    assert back.search("hiking boots").context == ix.search("hiking boots").context
    state = dict(ix.__getstate__(), format=3)
    with pytest.raises(ValueError):
        Index.__new__(Index).__setstate__(state)
