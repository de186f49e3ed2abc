"""Large batches are committed as one unsorted file, and a route pass moves their memories
with a strong match into clusters afterwards, in one commit for many batches. Small batches
are routed in their own commit, as before."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from helpers import InProcessDaemon, assert_same_as_files, git, make_store, wait_for

from clagd.engine.core import Engine
from clagd.engine.results import Status
from clagd.engine.routing import RouteQueue
from clagd.errors import Conflict
from clagd.ingest.inbox import Item
from clagd.model import Cluster, Memory
from clagd.store import writer
from clagd.store.files import Paths, write_cluster

SAILING = [f"sailing the boat out of the harbour in a strong wind, trip {i}" for i in range(20)]
NEW_SAILING = [
    "the boat left the harbour, sailing against the wind",
    "wind and sailing: the harbour master checked the boat",
    "sailing lesson: trim the boat for the harbour wind",
    "harbour wind too strong for sailing the small boat",
]
OTHER = ["quarterly tax forms are due in april", "the cat refuses her new food"]


def _store(tmp_path: Path, **ingest: object) -> Path:
    root = make_store(tmp_path / "m", {"ingest": ingest})
    mems = [Memory.new(t, f"2024-01-01T10:{i:02d}:00Z") for i, t in enumerate(SAILING)]
    write_cluster(Paths(root), Cluster("c-0000aaaa", "Sailing trips", memories=mems))
    for j, topic in enumerate(["piano scales practice", "garden tomato soil", "train ticket"]):
        others = [Memory.new(f"{topic} note {i}") for i in range(10)]
        write_cluster(Paths(root), Cluster(f"c-0000bbb{j}", topic.title(), memories=others))
    git(root, "add", "-A")
    git(root, "commit", "-qm", "a sailing cluster")
    return root


def _trailers(root: Path, ref: str = "HEAD") -> str:
    return git(root, "log", "-1", "--format=%B", ref)


def test_a_large_batch_is_one_file_then_one_route_commit(tmp_path: Path) -> None:
    root = _store(tmp_path, route_inline_max=3, route_delay_seconds=60)
    eng = Engine(root)
    try:
        res = eng.ingest([Item(t, None, {}) for t in NEW_SAILING + OTHER], source="test")
        assert res.deferred and res.unsorted == 6 and not res.routed
        assert git(root, "show", "--name-only", "--format=", "HEAD").split() == [
            f"unsorted/{res.shard}.yaml"
        ]
        assert "Clagd-Route: deferred" in _trailers(root)
        assert eng.status().route_pending == 1
        # retrievable at once, from the unsorted area
        hit = eng.query("the harbour master checked", count_round=False).memories[0]
        assert hit.content == NEW_SAILING[1] and hit.cluster_id is None

        assert eng.maybe_route() is None  # the inbox has not been quiet for 60 s
        out = eng.maybe_route(force=True)
        assert out is not None and out.routed == 4 and out.clusters == 1
        assert "Clagd-Kind: route" in _trailers(root) and "Clagd-Routed: 4" in _trailers(root)
        cluster = yaml.safe_load((root / "clusters" / "c-0000aaaa.yaml").read_text())
        assert {m["content"] for m in cluster["memories"]} == set(SAILING + NEW_SAILING)
        shard = yaml.safe_load((root / "unsorted" / f"{res.shard}.yaml").read_text())
        assert [m["content"] for m in shard["memories"]] == OTHER
        assert git(root, "status", "--porcelain", "clusters", "unsorted") == ""
        assert_same_as_files(eng)
        hit = eng.query("the harbour master checked", count_round=False).memories[0]
        assert hit.content == NEW_SAILING[1] and hit.cluster_id == "c-0000aaaa"
        st = eng.status()
        assert st.route_pending == 0
        assert st.counters["routed"] == 4 and st.counters["route_passes"] == 1
        assert eng.maybe_route(force=True) is None  # nothing left waiting
    finally:
        eng.close()


def test_a_status_a_batch_overtakes_never_shows_it_added_and_not_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A status read while a deferred batch's commit lands shows the batch waiting, or not
    yet added: never added with no route pass waiting, which an idle check (the eval's, the
    benchmark's "until routed") would take for routed."""
    root = _store(tmp_path, route_inline_max=3, route_delay_seconds=60)
    eng = Engine(root)
    try:
        real_len = RouteQueue.__len__
        read, landed = threading.Event(), threading.Event()
        reader: list[threading.Thread] = []

        def held_len(queue: RouteQueue) -> int:
            n = real_len(queue)
            if reader and threading.current_thread() is reader[0] and not read.is_set():
                read.set()  # the status has read the queue: the batch lands now
                assert landed.wait(10)
            return n

        monkeypatch.setattr(RouteQueue, "__len__", held_len)
        got: list[Status] = []
        reader.append(threading.Thread(target=lambda: got.append(eng.status())))
        reader[0].start()
        assert read.wait(10)
        res = eng.ingest([Item(t, None, {}) for t in NEW_SAILING + OTHER], source="test")
        assert res.deferred and eng.status().counters["added"] == 6
        landed.set()
        reader[0].join(10)
        st = got[0]
        assert (st.counters["added"], st.route_pending) in {(0, 0), (6, 1)}
    finally:
        eng.close()


def test_a_small_batch_is_routed_in_its_own_commit(tmp_path: Path) -> None:
    root = _store(tmp_path, route_inline_max=3)
    eng = Engine(root)
    try:
        res = eng.ingest([Item(t, None, {}) for t in NEW_SAILING[:2]], source="test")
        assert not res.deferred and res.routed == {"c-0000aaaa": 2}
        assert eng.status().route_pending == 0
        assert "clusters/c-0000aaaa.yaml" in git(root, "show", "--name-only", "--format=", "HEAD")
    finally:
        eng.close()


def test_a_failed_route_pass_changes_nothing_and_is_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _store(tmp_path, route_inline_max=1, route_delay_seconds=0)
    eng = Engine(root)
    try:
        eng.ingest([Item(t, None, {}) for t in NEW_SAILING], source="test")
        head = git(root, "rev-parse", "HEAD")

        def disk_full(*a: object, **k: object) -> None:
            raise OSError(28, "No space left on device")

        # the pass has moved the memories in the state when writing the cluster file fails
        monkeypatch.setattr(writer, "cluster_yaml", disk_full)
        with pytest.raises(OSError):
            eng.maybe_route()
        assert git(root, "rev-parse", "HEAD") == head
        assert git(root, "status", "--porcelain", "clusters", "unsorted") == ""
        assert_same_as_files(eng)
        st = eng.status()
        assert st.route_pending == 1 and st.counters["route_failures"] == 1
        monkeypatch.undo()
        routed = eng.maybe_route()
        assert routed is not None and routed.routed == 4
        assert_same_as_files(eng)
    finally:
        eng.close()


def test_inbox_bursts_are_routed_once_the_inbox_is_quiet(tmp_path: Path, short_tmp: Path) -> None:
    root = _store(tmp_path, route_inline_max=2, route_delay_seconds=0.2)
    d = InProcessDaemon(root, short_tmp / "s.sock")
    try:
        inbox = root / "inbox"
        for i, chunk in enumerate((NEW_SAILING[:2] + OTHER[:1], NEW_SAILING[2:] + OTHER[1:])):
            tmp = inbox / ".tmp" / f"b{i}.json"
            tmp.write_text(json.dumps([{"content": t} for t in chunk]))
            tmp.rename(inbox / f"b{i}.json")

        def routed() -> bool:
            with d.client() as c:
                st = c.status()
            return st["counters"]["routed"] == 4 and st["route_pending"] == 0

        wait_for(routed, 20, "the route pass")
        with d.client() as c:
            kinds = [e["kind"] for e in c.log(10)["entries"]]
        assert "route" in kinds and "ingest" in kinds
        cluster = yaml.safe_load((root / "clusters" / "c-0000aaaa.yaml").read_text())
        assert set(NEW_SAILING) <= {m["content"] for m in cluster["memories"]}
    finally:
        d.stop()
    # a clean stop leaves nothing waiting and the store equal to HEAD
    assert git(root, "status", "--porcelain", "clusters", "unsorted") == ""


def test_a_routed_batch_is_undone_wherever_the_route_pass_moved_it(tmp_path: Path) -> None:
    """Reverting an ingest after the route pass moved its memories into clusters takes
    them out of those clusters (as a forget would), in one revert commit; reverting it
    again says it was reverted already."""
    root = _store(tmp_path, route_inline_max=1, route_delay_seconds=60)
    eng = Engine(root)
    try:
        res = eng.ingest([Item(t, None, {}) for t in NEW_SAILING + OTHER], source="test")
        routed = eng.maybe_route(force=True)
        assert routed is not None and routed.routed == 4
        head = git(root, "rev-parse", "HEAD")
        eng.revert(str(res.commit))  # the route pass changed the batch's files since
        assert git(root, "rev-parse", "HEAD") != head
        assert git(root, "status", "--porcelain", "clusters", "unsorted") == ""
        contents = {m.content for m, _a, _k in eng.state.all_memories()}
        assert contents == set(SAILING) | {
            f"{t} note {i}"
            for t in ["piano scales practice", "garden tomato soil", "train ticket"]
            for i in range(10)
        }
        assert_same_as_files(eng)
        with pytest.raises(Conflict, match="revert"):
            eng.revert(str(res.commit))
    finally:
        eng.close()


def test_the_pass_starts_when_due_not_at_the_next_housekeeping(
    tmp_path: Path, short_tmp: Path
) -> None:
    """The daemon queues the pass once the inbox has been quiet for route_delay_seconds,
    without waiting for housekeeping (here every 30 s, the rescan interval)."""
    root = _store(tmp_path, route_inline_max=2, route_delay_seconds=0.2)
    cfg = yaml.safe_load((root / "clagd.yaml").read_text())
    cfg["inbox"]["rescan_seconds"] = 30
    (root / "clagd.yaml").write_text(yaml.safe_dump(cfg))
    d = InProcessDaemon(root, short_tmp / "s.sock")
    try:
        with d.client() as c:
            c.call("add", items=[{"content": t} for t in NEW_SAILING + OTHER])
            assert c.status()["route_pending"] == 1

        def routed() -> bool:
            with d.client() as c:
                st = c.status()
            return st["counters"]["routed"] == 4 and st["route_pending"] == 0

        wait_for(routed, 10, "the route pass, well before the next housekeeping")
    finally:
        d.stop()


def test_a_file_still_being_written_does_not_hold_the_pass_back(
    tmp_path: Path, short_tmp: Path
) -> None:
    """The inbox checks a file that is still open again and again (every settle/2); those
    passes handle nothing and must not count as inbox activity, or the route pass of a
    large batch would wait for the file (here: for ROUTE_MAX_WAIT, 30 s)."""
    root = _store(tmp_path, route_inline_max=2, route_delay_seconds=0.5)
    cfg = yaml.safe_load((root / "clagd.yaml").read_text())
    cfg["inbox"]["rescan_seconds"] = 30  # no housekeeping tick routes it meanwhile
    (root / "clagd.yaml").write_text(yaml.safe_dump(cfg))
    d = InProcessDaemon(root, short_tmp / "s.sock")
    inbox = root / "inbox"
    try:
        with open(inbox / "slow.txt", "w") as slow:  # an agent still writing its file
            slow.write("half of a memory")
            slow.flush()
            (inbox / ".tmp" / "b.json").write_text(
                json.dumps([{"content": t} for t in NEW_SAILING + OTHER])
            )
            (inbox / ".tmp" / "b.json").rename(inbox / "b.json")

            def routed() -> bool:
                with d.client() as c:
                    st = c.status()
                return st["counters"]["routed"] == 4 and st["route_pending"] == 0

            wait_for(routed, 10, "the route pass while a file is still being written")
            assert (inbox / "slow.txt").exists()  # still waiting for its writer
        assert "slow.txt" not in {p.name for p in (inbox / "rejected").glob("*")}
    finally:
        d.stop()


def _route_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many memories each `Index.route_many` or `route_steps` call scores (the scoring
    ahead goes in steps), from now on."""
    from clagd.retrieval.index import Index

    calls: list[int] = []
    real, real_steps = Index.route_many, Index.route_steps

    def counting(self: Index, memories: list[Memory]) -> list[str | None]:
        calls.append(len(memories))
        return real(self, memories)

    def counting_steps(self: Index, memories: list[Memory], step: int) -> Iterator[list]:
        calls.append(len(memories))
        return real_steps(self, memories, step)

    monkeypatch.setattr(Index, "route_many", counting)
    monkeypatch.setattr(Index, "route_steps", counting_steps)
    return calls


def test_the_pass_uses_the_scores_made_while_it_waited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deferred batch is scored off the writer right after its commit; the pass, when no
    cluster changed meanwhile, moves the memories by those answers without scoring again."""
    root = _store(tmp_path, route_inline_max=3, route_delay_seconds=60)
    eng = Engine(root)
    try:
        calls = _route_calls(monkeypatch)
        res = eng.ingest([Item(t, None, {}) for t in NEW_SAILING + OTHER], source="test")
        assert res.deferred and res.shard
        eng.scorer.wait(10)  # the batch scored off the writer, on the index it published
        assert calls == [6]  # the shard, scored ahead
        kept = eng.routes.scores([res.shard], eng.index.route_key)
        assert kept == dict(
            zip(res.added, eng.index.route_many([m for m in eng.state.unsorted[res.shard]]))
        )
        assert sum(cid == "c-0000aaaa" for cid in kept.values()) == 4
        calls.clear()
        out = eng.maybe_route(force=True)
        assert out is not None and out.routed == 4 and calls == []
        cluster = yaml.safe_load((root / "clusters" / "c-0000aaaa.yaml").read_text())
        assert {m["content"] for m in cluster["memories"]} == set(SAILING + NEW_SAILING)
        assert_same_as_files(eng)
    finally:
        eng.close()


def test_the_scoring_ahead_never_holds_the_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deferred batch's scoring runs off the writer (issue 26: ~1 ms a memory at 11k
    clusters, an operation of its own before): an `add` goes through while it runs, and the
    answers it keeps are those of the index the batch's commit published."""
    import threading

    from clagd.retrieval.index import Index

    root = _store(tmp_path, route_inline_max=3, route_delay_seconds=60)
    eng = Engine(root)
    try:
        started, release = threading.Event(), threading.Event()
        real = Index.route_steps

        def slow(self: Index, memories: list[Memory], step: int) -> Iterator[list]:
            started.set()  # the batch's scoring ahead (an add routes inline: route_many)
            assert release.wait(10)
            return real(self, memories, step)

        monkeypatch.setattr(Index, "route_steps", slow)
        res = eng.ingest([Item(t, None, {}) for t in NEW_SAILING + OTHER], source="test")
        published = eng.index
        assert res.deferred and res.shard and started.wait(10)
        assert eng.add([{"content": "an add while the batch is scored"}]).added
        release.set()
        eng.scorer.wait(10)
        monkeypatch.setattr(Index, "route_steps", real)
        kept = eng.routes.scores([res.shard], published.route_key)
        assert kept == dict(zip(res.added, published.route_many(eng.state.unsorted[res.shard])))
    finally:
        release.set()
        eng.close()


def test_scores_made_before_a_cluster_changed_are_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cluster that changed after the scoring (here a small batch routed into it) may
    change the answers: the pass scores the waiting memories again, on the index it serves
    (in the calling thread, when it waits for the pass; on the scorer's otherwise)."""
    root = _store(tmp_path, route_inline_max=3, route_delay_seconds=60)
    eng = Engine(root)
    try:
        res = eng.ingest([Item(t, None, {}) for t in NEW_SAILING + OTHER], source="test")
        eng.scorer.wait(10)
        key = eng.index.route_key
        assert len(eng.routes.scores([res.shard or ""], key)) == 6
        small = eng.ingest(
            [Item("a sailing boat in the harbour wind, one more trip", None, {})], source="test"
        )
        assert small.routed == {"c-0000aaaa": 1}
        assert eng.index.route_key is not key  # the cluster's profile changed
        calls = _route_calls(monkeypatch)
        out = eng.maybe_route(force=True)
        assert out is not None and out.routed == 4 and calls == [6]
        assert_same_as_files(eng)
    finally:
        eng.close()


def test_an_inbox_burst_is_routed_once_the_inbox_is_empty_not_a_quiet_after_its_commit(
    tmp_path: Path, short_tmp: Path
) -> None:
    """The inbox has had no file arrive for route_delay_seconds while the burst's commit
    was still being made (slow, here): the pass starts when the inbox is found empty after
    that commit, not another route_delay_seconds later."""
    import threading

    root = _store(tmp_path, route_inline_max=2, route_delay_seconds=1.5)
    d = InProcessDaemon(root, short_tmp / "s.sock")
    watcher = d.daemon.watcher
    real_ingest = watcher.ingest
    committed = threading.Event()
    at: list[float] = []

    def slow_ingest(items: list, files: int) -> object:
        # a commit that takes longer than the quiet the pass waits for
        # (quiet_for says 0 during a pass: the time since the last file event itself)
        wait_for(lambda: time.monotonic() - watcher._last_event > 1.7, 30, "1.7 s quiet")
        out = real_ingest(items, files)
        at.append(time.monotonic())
        committed.set()
        return out

    watcher.ingest = slow_ingest
    inbox = root / "inbox"
    try:
        for i, text in enumerate(NEW_SAILING + OTHER):
            (inbox / ".tmp" / f"s{i}.json").write_text(json.dumps({"content": text}))
            (inbox / ".tmp" / f"s{i}.json").rename(inbox / f"s{i}.json")
        assert committed.wait(30)

        def routed() -> bool:
            with d.client() as c:
                st = c.status()
            return st["counters"]["routed"] == 4 and st["route_pending"] == 0

        wait_for(routed, 10, "the route pass")
        assert time.monotonic() - at[0] < 1.0  # not 1.5 s after the commit
    finally:
        d.stop()


def test_the_route_pass_routes_each_memory_into_a_cluster_of_its_own_scope(
    tmp_path: Path,
) -> None:
    """Issue 24: clusters never mix scopes, the route pass included. Bob has a sailing
    cluster too; a large batch of Bob's sailing memories goes into his cluster only, and
    Alice's (who has no cluster of hers) stay unsorted, however well the default scope's
    and Bob's clusters match them."""
    root = _store(tmp_path, route_inline_max=3, route_delay_seconds=60)
    bobs = [
        Memory.new(f"bob {t}", f"2024-01-02T10:{i:02d}:00Z", scope="bob")
        for i, t in enumerate(SAILING)
    ]
    write_cluster(Paths(root), Cluster("c-0000b0b0", "Sailing trips", memories=bobs, scope="bob"))
    git(root, "add", "-A")
    git(root, "commit", "-qm", "bob's sailing cluster")
    eng = Engine(root)
    try:
        for who in ("alice", "bob"):
            res = eng.ingest([Item(t, None, {}, scope=who) for t in NEW_SAILING], source="test")
            assert res.deferred and res.unsorted == len(NEW_SAILING)
        out = eng.maybe_route(force=True)
        assert out is not None and out.routed == len(NEW_SAILING) and out.clusters == 1
        bob = yaml.safe_load((root / "clusters" / "c-0000b0b0.yaml").read_text())
        assert {m["content"] for m in bob["memories"]} == {m.content for m in bobs} | set(
            NEW_SAILING
        )
        assert {m.get("scope") for m in bob["memories"]} == {"bob"}
        plain = yaml.safe_load((root / "clusters" / "c-0000aaaa.yaml").read_text())
        assert {m["content"] for m in plain["memories"]} == set(SAILING)  # nothing of theirs
        for cl in eng.state.clusters.values():
            assert {m.scope for m in cl.memories} <= {cl.scope}, cl.name
        loose = [m for shard in eng.state.unsorted.values() for m in shard]
        assert sorted(m.content for m in loose) == sorted(NEW_SAILING)
        assert {m.scope for m in loose} == {"alice"}
        assert_same_as_files(eng)
    finally:
        eng.close()


def test_a_route_pass_pauses_on_staged_changes_as_add_does(tmp_path: Path) -> None:
    """Issue 26: a person's change staged in the memory folders pauses the route pass as it
    pauses `add` (code `paused`, naming the file); nothing is committed on top, and once the
    person resets, the pass routes what waited."""
    from clagd.errors import Paused

    root = _store(tmp_path, route_inline_max=3, route_delay_seconds=60)
    eng = Engine(root)
    try:
        res = eng.ingest([Item(t, None, {}) for t in NEW_SAILING + OTHER], source="test")
        assert res.deferred and res.shard
        head = git(root, "rev-parse", "HEAD").strip()
        cluster = root / "clusters" / "c-0000bbb0.yaml"
        cluster.write_text(cluster.read_text() + "# edited by hand\n")
        git(root, "add", str(cluster.relative_to(root)))
        with pytest.raises(Paused) as err:
            eng.maybe_route(force=True)
        assert "staged" in str(err.value) and cluster.name in str(err.value)
        assert git(root, "rev-parse", "HEAD").strip() == head
        assert len(eng.routes) == 1  # still waiting
        git(root, "reset", "-q", "--hard")
        out = eng.maybe_route(force=True)
        assert out is not None and out.routed == 4 and out.commit
        assert_same_as_files(eng)
    finally:
        eng.close()
