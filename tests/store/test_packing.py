"""`git gc --auto` beside the daemon: the store's loose objects are packed, nothing is lost,
git's own thresholds and a person's `gc.auto = 0` decide, a failure is reported."""

from __future__ import annotations

import hashlib
import logging
import random
import subprocess
import zlib
from collections import Counter
from pathlib import Path

import pytest
from helpers import DaemonProcess, git, head_contents, make_store, wait_for

from clagd.engine.core import Engine
from clagd.ingest.inbox import Item
from clagd.store import packing
from clagd.store.packing import GcStatus


def _packs(root: Path) -> list[Path]:
    return sorted((root / ".git" / "objects" / "pack").glob("*.pack"))


def _loose(root: Path) -> list[Path]:
    objects = root / ".git" / "objects"
    return [f for d in objects.iterdir() if len(d.name) == 2 for f in d.iterdir()]


def _over_gc_auto(root: Path, size: int = 0) -> None:
    """Make git's own test say "too many loose objects" for `gc.auto = 1`. git estimates
    the loose objects from one fan-out folder (objects/17/, times 256): a small store has
    none there, so two blobs whose ids start with 17 are written (unreachable: they stay
    loose, the store's own objects are what gets packed), each `size` bytes and more."""
    found = 0
    pad = random.Random(17).randbytes(size)  # incompressible: `size` bytes on disk too
    for i in range(100_000):
        data = f"filler {i}\n".encode() + pad
        if hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest().startswith("17"):
            subprocess.run(
                ["git", "hash-object", "-w", "--stdin"], cwd=root, input=data, check=True
            )
            found += 1
            if found == 2:
                return
    raise AssertionError("no filler found")


def _ingest(eng: Engine, n_batches: int, tag: str) -> list[str]:
    texts = []
    for b in range(n_batches):
        batch = [f"{tag} batch {b} memory {i} about apples and pears" for i in range(3)]
        eng.ingest([Item(t, None, {}) for t in batch], "test")
        texts += batch
    return texts


def _finish(eng: Engine) -> GcStatus:
    wait_for(lambda: not eng.packer.poll(), 60, "git gc to finish")
    return eng.status().git_gc


def test_gc_packs_the_daemons_uncompressed_loose_objects_and_loses_nothing(
    store: Path,
) -> None:
    git(store, "config", "gc.auto", "1")  # git's threshold, low enough for a small store
    eng = Engine(store)
    try:
        texts = _ingest(eng, 6, "first")
        _over_gc_auto(store)
        loose = _loose(store)
        assert len(loose) > 10 and not _packs(store)
        # the daemon's own `git add` writes its objects uncompressed (zlib level 0)
        blobs = git(store, "ls-files", "-s", "--", "unsorted").split()[1::4]
        obj = store / ".git" / "objects" / blobs[0][:2] / blobs[0][2:]
        head = obj.read_bytes()[:2]
        assert head == b"\x78\x01", head  # zlib header: FLEVEL 0, no compression
        assert zlib.decompress(obj.read_bytes()).startswith(b"blob ")
        tree = git(store, "rev-parse", "HEAD^{tree}").strip()  # and its trees the same way
        obj = store / ".git" / "objects" / tree[:2] / tree[2:]
        assert obj.read_bytes()[:2] == b"\x78\x01", tree
        assert eng.packer.start()
        st = _finish(eng)
        assert st.runs == 1 and st.packed == 1 and st.failures == 0, st
        assert st.last_result.startswith("packed"), st
        assert _packs(store) and len(_loose(store)) < len(loose)
        git(store, "fsck", "--no-progress")  # raises on any broken or missing object
        assert Counter(head_contents(store)) == Counter(texts)
        # the daemon goes on committing on the packed store
        more = _ingest(eng, 1, "after")
        assert Counter(head_contents(store)) == Counter(texts + more)
    finally:
        eng.close()


def test_commits_made_while_gc_runs_are_all_kept(store: Path) -> None:
    git(store, "config", "gc.auto", "1")
    eng = Engine(store)
    try:
        texts = _ingest(eng, 4, "before")
        _over_gc_auto(store)
        assert eng.packer.start()
        texts += _ingest(eng, 4, "during")  # gc runs in its own process meanwhile
        st = _finish(eng)
        assert st.packed == 1 and st.failures == 0, st
        assert eng.packer.start()  # and once more, over what the commits left
        st = _finish(eng)
        assert st.failures == 0, st
        git(store, "fsck", "--no-progress")
        assert Counter(head_contents(store)) == Counter(texts)
        assert eng.check_outside() is None  # the working tree is still HEAD's
    finally:
        eng.close()


def test_a_persons_gc_auto_0_turns_packing_off(store: Path) -> None:
    git(store, "config", "gc.auto", "0")
    eng = Engine(store)
    try:
        _ingest(eng, 4, "kept loose")
        _over_gc_auto(store)
        before = len(_loose(store))
        assert eng.packer.start()
        st = _finish(eng)
        assert st.last_result == "nothing to pack" and st.packed == 0, st
        assert len(_loose(store)) == before and not _packs(store)
    finally:
        eng.close()


@pytest.mark.parametrize("gc_auto", ["", "0"])
def test_loose_objects_many_by_size_are_packed_unless_gc_auto_is_0(
    store: Path, monkeypatch: pytest.MonkeyPatch, gc_auto: str
) -> None:
    """git counts loose objects; the daemon's are large (uncompressed trees of `clusters/`),
    so their estimated size also decides, and a person's `gc.auto = 0` still wins."""
    if gc_auto:
        git(store, "config", "gc.auto", gc_auto)
    else:  # git's own default (the test stores turn packing off)
        git(store, "config", "--unset", "gc.auto")
    eng = Engine(store)
    try:
        texts = _ingest(eng, 3, "large")
        _over_gc_auto(store, size=4096)  # by count far below git's 6,700; ~2 MB by size
        assert packing.loose_bytes(store) > 2 * 256 * 4096
        monkeypatch.setattr(packing, "LOOSE_BYTES_LIMIT", 8 << 20)
        assert eng.packer.start()
        st = _finish(eng)
        assert st.last_result == "nothing to pack" and not _packs(store), st
        monkeypatch.setattr(packing, "LOOSE_BYTES_LIMIT", 1 << 20)
        assert eng.packer.start()
        st = _finish(eng)
        if gc_auto == "0":
            assert st.last_result == "nothing to pack" and not _packs(store), st
        else:
            assert st.packed == 1 and _packs(store), st
            git(store, "fsck", "--no-progress")
        assert Counter(head_contents(store)) == Counter(texts)
    finally:
        eng.close()


def test_a_failing_gc_is_reported_and_tried_again_later(
    store: Path, caplog: pytest.LogCaptureFixture
) -> None:
    git(store, "config", "gc.auto", "1")
    git(store, "config", "gc.pruneExpire", "not a date")  # the person's broken setting
    eng = Engine(store)
    try:
        texts = _ingest(eng, 2, "kept")
        _over_gc_auto(store)
        with caplog.at_level(logging.WARNING, logger="clagd.git"):
            assert eng.packer.start()
            st = _finish(eng)
        assert st.failures == 1 and st.last_result.startswith("failed: git gc"), st
        assert "pruneexpire" in st.last_result.lower(), st
        assert any("failed: git gc" in r.getMessage() for r in caplog.records)
        assert not eng.packer.due()  # not again before the interval is over
        assert Counter(head_contents(store)) == Counter(texts)
        git(store, "config", "--unset", "gc.pruneExpire")
        assert eng.packer.start()
        assert _finish(eng).packed == 1
    finally:
        eng.close()


def test_the_daemon_packs_by_itself_and_says_so_in_status(tmp_path: Path, short_tmp: Path) -> None:
    store = make_store(tmp_path / "m", {"git": {"gc_interval_minutes": 0.005}})
    git(store, "config", "gc.auto", "1")
    _over_gc_auto(store)
    d = DaemonProcess(store, short_tmp / "s.sock")
    d.start()
    try:
        for i in range(4):
            (store / "inbox" / f"n{i}.txt").write_text(f"note {i} about the garden and its pears\n")
            with d.client() as c:
                wait_for(lambda c=c, i=i: c.status()["counters"]["added"] > i, 30, "ingest")

        def packed() -> dict | None:
            with d.client() as c:
                st = c.status()["git_gc"]
            return st if st["packed"] >= 1 else None

        st = wait_for(packed, 60, "the housekeeping job to pack the store")
        assert st["enabled"] and st["failures"] == 0, st
        assert _packs(store)
        git(store, "fsck", "--no-progress")
        assert len(head_contents(store)) == 4
    finally:
        d.terminate()


def test_status_tells_the_person_when_the_daemons_gc_fails(tmp_path: Path, short_tmp: Path) -> None:
    from click.testing import CliRunner

    from clagd.cli import main

    store = make_store(tmp_path / "m", {"git": {"gc_interval_minutes": 0.005}})
    git(store, "config", "gc.auto", "1")
    git(store, "config", "gc.pruneExpire", "not a date")
    _over_gc_auto(store)
    d = DaemonProcess(store, short_tmp / "s.sock")
    d.start()
    try:

        def failed() -> bool:
            with d.client() as c:
                return c.status()["git_gc"]["failures"] >= 1

        wait_for(failed, 60, "the daemon's gc to fail")
        out = CliRunner().invoke(main, ["--socket", str(d.socket), "status"]).output
        line = next(ln for ln in out.splitlines() if ln.startswith("GIT GC"))
        assert "failed: git gc --auto" in line and "pruneexpire" in line.lower(), out
        # and the daemon goes on storing memories
        (store / "inbox" / "n.txt").write_text("a note after the failed gc\n")
        with d.client() as c:
            wait_for(lambda: c.status()["counters"]["added"] == 1, 30, "the ingest")
        assert head_contents(store) == ["a note after the failed gc"]
    finally:
        d.terminate()
