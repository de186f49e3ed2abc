from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import InProcessDaemon, git, head_contents, make_store, wait_for

from clagd.client import ClientError
from clagd.errors import InboxRejected
from clagd.ingest.inbox import ignored_name, parse_text, read_file


def test_formats() -> None:
    assert parse_text("a.txt", "  just text \n")[0].content == "just text"
    it = parse_text(
        "a.yaml",
        "content: hi\nmetadata: {importance: 0.9}\ncreated_at: 2024-05-01T10:00:00+02:00\n",
    )[0]
    assert (it.content, it.metadata, it.created_at) == (
        "hi",
        {"importance": 0.9},
        "2024-05-01T08:00:00Z",
    )
    items = parse_text("a.yml", "- content: one\n- content: two\n  task_type: chat\n")
    assert [i.content for i in items] == ["one", "two"] and items[1].metadata == {
        "task_type": "chat"
    }
    assert [
        i.content for i in parse_text("a.json", json.dumps([{"content": "x"}, {"content": "y"}]))
    ] == ["x", "y"]
    md = parse_text(
        "n.md", "---\nsource: notes\ncreated_at: 2024-01-02\n---\n# Title\n\nBody text\n"
    )[0]
    assert md.content == "# Title Body text" and md.metadata == {"source": "notes"}
    assert md.created_at == "2024-01-02T00:00:00Z"
    assert parse_text("plain.md", "no front matter")[0].content == "no front matter"


@pytest.mark.parametrize(
    "name,text,reason",
    [
        ("a.yaml", "content: [unclosed\n", "bad YAML"),
        ("a.json", "{nope", "bad JSON"),
        ("a.json", '{"metadata": {}}', "no 'content'"),
        ("a.json", '{"content": 42}', "must be a string"),
        ("a.yaml", "content: '   '\n", "empty"),
        ("a.yaml", "a: &x hello\ncontent: *x\n", "aliases"),
        ("a.json", "[]", "empty"),
        ("a.json", '[{"content": "ok"}, 3]', "item 2"),
        ("a.json", '{"content": "x", "metadata": [1]}', "'metadata' must be a mapping"),
        ("a.yaml", "content: x\ncreated_at: yesterday-ish\n", "created_at"),
        ("a.md", "---\nsource: x\nno end", "never ends"),
        ("a.csv", "content,x", "unsupported file type"),
        ("a.json", "[" * 5000 + "]" * 5000, "bad JSON"),
    ],
)
def test_rejections_say_why(name: str, text: str, reason: str) -> None:
    with pytest.raises(InboxRejected, match=reason):
        parse_text(name, text)


def test_size_and_encoding_limits(tmp_path: Path) -> None:
    big = tmp_path / "big.txt"
    big.write_text("x" * 2000)
    with pytest.raises(InboxRejected, match="over the limit"):
        read_file(big, 1000, 10)
    latin = tmp_path / "l.txt"
    latin.write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(InboxRejected, match="not UTF-8"):
        read_file(latin, 1000, 10)


def test_ignored_names() -> None:
    for n in (".hidden.yaml", "a.yaml.tmp", "a.part", "a.swp", "a.txt~"):
        assert ignored_name(n)
    assert not ignored_name("a.yaml")


def test_daemon_ingests_existing_and_new_files_and_rejects_bad(daemon: InProcessDaemon) -> None:
    inbox = daemon.root / "inbox"
    (inbox / "one.txt").write_text("The user's cat is called Miso")
    (inbox / "two.yaml").write_text("content: The user's cat is called Miso\n")  # a duplicate
    (inbox / "bad.json").write_text("{nope")
    (inbox / ".tmp" / "three.json").write_text(json.dumps({"content": "Renamed in, Maildir style"}))
    os.rename(inbox / ".tmp" / "three.json", inbox / "three.json")
    (inbox / "four.md.part").write_text("being written")
    wait_for(
        lambda: (
            not (inbox / "one.txt").exists()
            and not (inbox / "three.json").exists()
            and not (inbox / "two.yaml").exists()
            and (inbox / "rejected" / "bad.json.error").exists()
        ),
        what="inbox drained",
    )
    contents = head_contents(daemon.root)
    assert sorted(contents) == ["Renamed in, Maildir style", "The user's cat is called Miso"]
    assert (inbox / "rejected" / "bad.json").read_text() == "{nope"
    assert "bad JSON" in (inbox / "rejected" / "bad.json.error").read_text()
    assert (inbox / "four.md.part").exists()  # ignored names are left alone
    log = git(daemon.root, "log", "--format=%B")
    assert "Clagd-Kind: ingest" in log and "Clagd-Batch: b-" in log


def test_file_written_in_place_slowly_is_read_only_when_complete(daemon: InProcessDaemon) -> None:
    inbox = daemon.root / "inbox"
    path = inbox / "slow.json"
    text = inbox / "slow.txt"
    with open(path, "w") as fh, open(text, "w") as th:
        fh.write('{"content": "written ')
        fh.flush()
        for i in range(4):
            # A slow writer (the point of this test, so a real pause): the JSON file is
            # incomplete and stays so for longer than settle_seconds; the text file gets
            # a write more often than that. Neither may be read or rejected meanwhile.
            for _ in range(5):
                time.sleep(0.1)
                th.write(f"text part {i} ")
                th.flush()
            fh.write(f"slowly part {i} ")
            fh.flush()
            assert path.exists() and not (inbox / "rejected" / "slow.json").exists()
            assert text.exists()
        fh.write('over seconds"}')
    wait_for(lambda: not path.exists() and not text.exists(), what="slow files ingested")
    assert sorted(head_contents(daemon.root)) == [
        " ".join(f"text part {i}" for i in range(4) for _ in range(5)),
        "written slowly part 0 slowly part 1 slowly part 2 slowly part 3 over seconds",
    ]
    assert not (inbox / "rejected" / "slow.json").exists()


def _rename_in(inbox: Path, name: str, text: str) -> None:
    (inbox / ".tmp" / name).write_text(text)
    os.rename(inbox / ".tmp" / name, inbox / name)


def test_renamed_in_file_is_read_at_once_a_file_still_open_is_not(
    tmp_path: Path, short_tmp: Path
) -> None:
    """settle_seconds is 30: only a rename (or a close) can make a file complete in time."""
    store = make_store(tmp_path / "memory", {"inbox": {"settle_seconds": 30.0}})
    d = InProcessDaemon(store, short_tmp / "s.sock")
    inbox = store / "inbox"
    try:
        with open(inbox / "open.json", "w") as fh:
            # valid JSON already, but its writer has not closed it: it may write more
            fh.write(json.dumps({"content": "written in place, still open"}))
            fh.flush()
            t0 = time.monotonic()
            _rename_in(inbox, "renamed.json", json.dumps({"content": "renamed in from .tmp"}))
            wait_for(lambda: not (inbox / "renamed.json").exists(), 10, "the renamed file")
            assert time.monotonic() - t0 < 10
            # the pass that took the renamed file saw the open one, and left it
            assert head_contents(store) == ["renamed in from .tmp"]
            assert (inbox / "open.json").exists()
            assert not (inbox / "rejected").exists() or not any((inbox / "rejected").iterdir())
            ready, waiting = d.daemon.watcher.tracker.ready()
            assert ready == [] and waiting == 1
        # closed after its last write: complete at once too
        wait_for(lambda: not (inbox / "open.json").exists(), 10, "the closed file")
        assert sorted(head_contents(store)) == [
            "renamed in from .tmp",
            "written in place, still open",
        ]
    finally:
        d.stop()


def test_a_file_moved_in_from_another_folder_is_read_at_once(
    tmp_path: Path, short_tmp: Path
) -> None:
    """`mv` from a folder the watcher does not watch (here beside the store) is complete at
    once, like a rename out of inbox/.tmp/; settle_seconds is 30."""
    store = make_store(tmp_path / "memory", {"inbox": {"settle_seconds": 30.0}})
    d = InProcessDaemon(store, short_tmp / "s.sock")
    inbox = store / "inbox"
    try:
        elsewhere = tmp_path / "drafts"
        elsewhere.mkdir()
        (elsewhere / "note.json").write_text(json.dumps({"content": "moved in from drafts"}))
        t0 = time.monotonic()
        os.rename(elsewhere / "note.json", inbox / "note.json")
        wait_for(lambda: not (inbox / "note.json").exists(), 10, "the moved-in file")
        assert time.monotonic() - t0 < 10
        assert head_contents(store) == ["moved in from drafts"]
        assert d.daemon.watcher.observer_kind == "inotify"
    finally:
        d.stop()


def test_two_bursts_are_ingested_back_to_back(
    tmp_path: Path, short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A burst that arrives while the last one is being committed is taken right after that
    commit: not after another debounce (the deletions of the last batch are no events)."""
    from clagd.ingest import watcher as watcher_mod

    # the whole 6-s debounce for any burst, as a slow writer gets it: a pass that waited
    # for one after the commit would take longer than the 2 s allowed below
    monkeypatch.setattr(watcher_mod, "DEBOUNCE_MIN_GAPS", 10**9)
    store = make_store(
        tmp_path / "memory", {"inbox": {"settle_seconds": 30.0, "debounce_seconds": 6.0}}
    )
    d = InProcessDaemon(store, short_tmp / "s.sock")
    inbox = store / "inbox"
    watcher = d.daemon.watcher
    real_ingest = watcher.ingest
    committing, commit_may_go = threading.Event(), threading.Event()
    calls: list[tuple[float, float]] = []  # (start, end) of each ingest commit

    def slow_commit(items: list, files: int) -> object:
        started = time.monotonic()
        committing.set()
        commit_may_go.wait(30)  # a slow commit: the second burst arrives meanwhile
        try:
            return real_ingest(items, files)
        finally:
            calls.append((started, time.monotonic()))

    watcher.ingest = slow_commit
    try:
        # the first burst is one file of 20 memories: 20 files could be split by the first
        # pass when the observer's thread lags a loaded machine by more than the debounce
        first = [{"content": f"first burst {i}"} for i in range(20)]
        _rename_in(inbox, "a.json", json.dumps(first))
        assert committing.wait(30)
        for i in range(20):
            _rename_in(inbox, f"b{i:02d}.json", json.dumps({"content": f"second burst {i}"}))
        # the watcher has taken in the second burst's events (on a busy machine its thread
        # can lag; a file whose event comes after the next pass waits for a new debounce)
        second = {f"b{i:02d}.json" for i in range(20)}
        wait_for(lambda: second <= set(watcher.tracker.ready()[0]), 20, "the second burst seen")
        commit_may_go.set()
        wait_for(lambda: not any(p.is_file() for p in inbox.iterdir()), 20, "both bursts")
        # the second pass starts as the first commit ends, well under the 6 s debounce
        # (timed between the commits, so a loaded machine's slow git does not count)
        assert len(calls) == 2 and calls[1][0] - calls[0][1] < 2.0, calls
        added = git(store, "log", "--format=%(trailers:key=Clagd-Added,valueonly)").split()
        assert added[:2] == ["20", "20"]  # one commit per burst, the second one last
        contents = head_contents(store)
        assert sorted(contents) == sorted(
            [f"first burst {i}" for i in range(20)] + [f"second burst {i}" for i in range(20)]
        )
    finally:
        d.stop()


def test_start_up_takes_in_the_inbox_without_a_debounce(tmp_path: Path) -> None:
    """The first pass runs at once: an empty inbox does not hold start-up back, and files
    already there are taken in before the daemon serves, not a debounce later."""
    from clagd.config import load_config
    from clagd.ingest.watcher import InboxWatcher

    store = make_store(tmp_path / "memory", {"inbox": {"debounce_seconds": 60.0}})
    cfg = load_config(store).inbox
    taken: list[int] = []
    empty = InboxWatcher(store / "inbox", cfg, lambda items, files: taken.append(files))
    empty.start()
    try:
        assert empty.wait_backlog(0)  # nothing to wait for: done before the first pass
    finally:
        empty.stop()
    for i in range(3):
        (store / "inbox" / f"m{i}.json").write_text(json.dumps({"content": f"memory {i}"}))
        old = time.time() - 60  # complete: written long before the start
        os.utime(store / "inbox" / f"m{i}.json", (old, old))
    full = InboxWatcher(store / "inbox", cfg, lambda items, files: taken.append(files) or None)
    full.start()
    try:
        assert full.wait_backlog(20)  # a 60 s debounce would make this time out
        assert sum(taken) == 3
    finally:
        full.stop()


def test_the_debounce_is_short_for_a_burst_written_in_a_tight_loop(
    tmp_path: Path, short_tmp: Path
) -> None:
    """With `debounce_seconds` 3, thirty files renamed in one after the other are one
    commit well before 3 s: the quiet waited for is a few times the gaps between them."""
    store = make_store(
        tmp_path / "memory", {"inbox": {"settle_seconds": 30.0, "debounce_seconds": 3.0}}
    )
    d = InProcessDaemon(store, short_tmp / "s.sock")
    inbox = store / "inbox"
    watcher = d.daemon.watcher
    real_ingest, started = watcher.ingest, []

    def timed_commit(items: list, files: int) -> object:
        started.append(time.monotonic())  # the pass's commit, after its debounce and reads
        return real_ingest(items, files)

    watcher.ingest = timed_commit
    try:
        for i in range(30):
            _rename_in(inbox, f"t{i:02d}.json", json.dumps({"content": f"tight loop note {i}"}))
        t0 = time.monotonic()
        wait_for(lambda: not any(p.is_file() for p in inbox.iterdir()), 20, "the burst")
        # timed to the commit's start: a loaded machine's slow git does not count
        assert started and started[0] - t0 < 1.5
        added = git(store, "log", "--format=%(trailers:key=Clagd-Added,valueonly)").split()
        assert added[0] == "30"  # one commit for the burst
    finally:
        d.stop()


def test_the_quiet_waited_for_follows_the_gaps_between_a_bursts_files() -> None:
    from clagd.ingest.watcher import DEBOUNCE_MIN_SECONDS, quiet_needed

    assert quiet_needed([], 0.3) == 0.3  # one file: the whole debounce
    assert quiet_needed([0.001, 0.002], 0.3) == 0.3  # too few gaps to go by
    assert quiet_needed([0.0002] * 10, 0.3) == DEBOUNCE_MIN_SECONDS  # a tight loop
    assert quiet_needed([0.001, 0.02, 0.002], 0.3) == pytest.approx(0.08)  # its longest gap
    assert quiet_needed([0.1, 0.1, 0.1], 0.3) == 0.3  # a slow writer: never past the debounce
    assert quiet_needed([0.0002] * 10, 0.01) == 0.01  # nor past a debounce below the minimum


def _watcher_without_events(tmp_path: Path) -> tuple[Any, list[str], Path]:
    """A real watcher on a real inbox, not started: the test drives its debounce's
    read-ahead and its pass on this thread, and plays the observer's "renamed in"."""
    from clagd.config import load_config
    from clagd.ingest.watcher import InboxWatcher

    store = make_store(tmp_path / "memory")
    taken: list[str] = []
    w = InboxWatcher(
        store / "inbox",
        load_config(store).inbox,
        lambda items, files: taken.extend(it.content for it in items),
    )
    return w, taken, store / "inbox"


def _complete(w: Any, inbox: Path, name: str, text: str, age: float = 5.0) -> Path:
    path = inbox / name
    path.write_text(text)
    old = time.time() - age
    os.utime(path, (old, old))
    w.tracker.mark_complete(name)  # as the observer does when a file is renamed in
    return path


def test_files_read_ahead_are_taken_only_while_unchanged(tmp_path: Path) -> None:
    """During the debounce the complete files are read ahead. The pass takes those items
    only from a file that is exactly what was read (inode, size, mtime): a file rewritten
    since is read again, a removed one is gone, a malformed one is rejected with its
    reason by the pass, as without the read-ahead."""
    w, taken, inbox = _watcher_without_events(tmp_path)
    _complete(w, inbox, "a.json", json.dumps({"content": "note a as read ahead"}))
    b = _complete(w, inbox, "b.json", json.dumps({"content": "note b before"}))
    c = _complete(w, inbox, "c.json", json.dumps({"content": "note c, removed"}))
    _complete(w, inbox, "d.json", "{not json")
    w._read_ahead(time.monotonic() + 10)
    b.write_text(json.dumps({"content": "note b rewritten, same name"}))
    later = time.time() - 2  # a different mtime, and old enough to be read ahead
    os.utime(b, (later, later))
    w.tracker.mark_complete("b.json")
    c.unlink()
    assert w.process() == 3  # a, b, and d rejected
    assert sorted(taken) == ["note a as read ahead", "note b rewritten, same name"]
    assert w.read_ahead == 1  # a only
    assert (inbox / "rejected" / "d.json").exists()
    assert "d.json" not in {p.name for p in inbox.iterdir()}
    assert "JSON" in (inbox / "rejected" / "d.json.error").read_text()


def test_a_file_modified_just_now_is_not_read_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A change within one tick of the kernel's coarse clock would keep the mtime: a file
    modified less than READ_AHEAD_MIN_AGE ago is left to the pass, which reads it when it
    runs (the age is raised to 30 s here, so that no timing of the test's own matters)."""
    import clagd.ingest.watcher as watcher

    monkeypatch.setattr(watcher, "READ_AHEAD_MIN_AGE", 30.0)
    w, taken, inbox = _watcher_without_events(tmp_path)
    path = _complete(w, inbox, "n.json", json.dumps({"content": "fresh note"}), age=5.0)
    w._read_ahead(time.monotonic() + 10)
    assert w.process() == 1 and taken == ["fresh note"] and w.read_ahead == 0
    _complete(w, inbox, "o.json", json.dumps({"content": "older note"}), age=60.0)
    w._read_ahead(time.monotonic() + 10)
    assert w.process() == 1 and taken == ["fresh note", "older note"] and w.read_ahead == 1
    assert not path.exists()


def test_an_items_id_is_its_normalized_contents_whichever_way_it_came(store: Path) -> None:
    """A validated item (inbox, socket) is normalized already and its id is only hashed;
    an item made by hand is normalized first: both give one memory, stored once."""
    from clagd.engine.core import Engine
    from clagd.ingest.inbox import Item, validate_item
    from clagd.model import memory_id

    checked = validate_item({"content": "  café\tau   lait \n"})
    assert checked.normalized and checked.content == "café au lait"
    eng = Engine(store)
    try:
        first = eng.ingest([checked], "test")
        again = eng.ingest([Item("cafe\u0301  au lait", None, {})], "test")  # not NFC
        assert first.added == [memory_id("café au lait")] and again.duplicates == first.added
    finally:
        eng.close()


def test_a_file_over_the_size_limit_names_the_setting_and_what_to_do(tmp_path: Path) -> None:
    big = tmp_path / "big.txt"
    big.write_text("x" * 2000)
    with pytest.raises(InboxRejected) as err:
        read_file(big, 1000, 10)
    assert str(err.value) == (
        "file is 2000 bytes, over the limit of 1000 (inbox.max_file_bytes in clagd.yaml): "
        "split it into smaller files, or raise inbox.max_file_bytes"
    )


@pytest.mark.parametrize("value", [0, 0.5, 1, 1.0])
def test_importance_on_its_scale_is_kept(value: float) -> None:
    [item] = parse_text("a.json", json.dumps({"content": "x", "metadata": {"importance": value}}))
    assert item.metadata == {"importance": value}


@pytest.mark.parametrize("value", [4, 5, -0.1, 1.01, "high", True, None, [1]])
def test_importance_off_its_scale_is_refused_on_every_path(
    value: object, daemon: InProcessDaemon
) -> None:
    raw = {"content": "The user likes tea", "metadata": {"importance": value}}
    want = f"'importance' must be a number from 0 (unimportant) to 1 (vital); 0.5 when left out, got {value!r}"
    with pytest.raises(InboxRejected) as err:  # an inbox file, and what import reads
        parse_text("a.json", json.dumps(raw))
    assert str(err.value) == f"file: metadata: {want}"
    with daemon.client() as c, pytest.raises(ClientError) as cerr:  # add over the socket
        c.add_many([raw])
    assert str(cerr.value) == f"item 1: metadata: {want}"
