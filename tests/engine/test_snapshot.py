"""The warm start (the start-up pickle of the state and index): a fast start that is never wrong. Whatever happened since the
snapshot (commits, a kill, hand edits, a corrupt file), the loaded store equals the files."""

from __future__ import annotations

import gc
import pickle
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import InProcessDaemon, assert_same_as_files, git, make_store

from clagd.engine.core import Engine
from clagd.engine.warmstart import WARMSTART_MAGIC, WarmStart
from clagd.ingest.inbox import Item


def _add(eng: Engine, *texts: str) -> None:
    eng.ingest([Item(t, None, {}) for t in texts], source="test")


def test_clean_restart_loads_the_snapshot(tmp_path: Path) -> None:
    root = make_store(tmp_path / "m")
    eng = Engine(root)
    _add(eng, "alpha memory about boats", "beta memory about trains")
    before = eng.query("boats", count_round=False).memories
    eng.close()
    eng = Engine(root)
    try:
        assert eng.load_source == "warmstart"
        assert_same_as_files(eng)
        assert eng.query("boats", count_round=False).memories[0].id == before[0].id
    finally:
        eng.close()


def test_the_warm_start_keeps_the_loads_gc_pause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine pauses the cyclic GC over its whole load; unpickling inside it must not
    end that pause (the first collection after would scan the whole loaded store: ~0.2 s
    before the first answer at 100k)."""
    root = make_store(tmp_path / "m")
    eng = Engine(root)
    _add(eng, "alpha memory about boats")
    eng.close()
    seen: list[bool] = []
    real = WarmStart._catch_up

    def catch_up(self: WarmStart, *args: Any) -> Any:
        seen.append(gc.isenabled())
        return real(self, *args)

    monkeypatch.setattr(WarmStart, "_catch_up", catch_up)
    assert gc.isenabled()
    eng = Engine(root)
    try:
        assert eng.load_source == "warmstart" and seen == [False]
        assert gc.isenabled()  # and the pause ends with the load
    finally:
        eng.close()


def test_snapshot_behind_head_is_brought_up_to_date(tmp_path: Path) -> None:
    root = make_store(tmp_path / "m")
    eng = Engine(root)
    _add(eng, "first memory about the garden")
    eng.close()  # snapshot at this commit
    eng = Engine(root)
    _add(eng, "second memory about the kitchen")
    eng.recluster("test")  # moves memories between files
    eng.writer.stop()  # like a kill: no new snapshot
    # and a hand edit while no daemon runs
    cluster = next((root / "clusters").glob("c-*.yaml"))
    data = yaml.safe_load(cluster.read_text())
    data["name"] = "Edited while stopped"
    cluster.write_text(yaml.safe_dump(data, sort_keys=False))
    eng = Engine(root)
    try:
        assert eng.load_source == "warmstart"
        assert any("brought up to date" in n for n in eng.notes)
        assert_same_as_files(eng)
        assert any(c.name == "Edited while stopped" for c in eng.clusters().clusters)
        assert (
            eng.query("kitchen", count_round=False).memories[0].content
            == "second memory about the kitchen"
        )
    finally:
        eng.close()


def test_corrupt_or_foreign_snapshot_means_a_full_load(tmp_path: Path) -> None:
    root = make_store(tmp_path / "m")
    eng = Engine(root)
    _add(eng, "a memory that must survive")
    eng.close()
    snap = root / ".clagd" / "warmstart.pickle"
    snap.write_bytes(b"not a pickle")
    eng = Engine(root)
    assert eng.load_source == "files"
    assert_same_as_files(eng)
    eng.close()
    # a snapshot of a commit that no longer exists (history rewritten by the user)
    head = git(root, "rev-parse", "HEAD").strip()
    git(root, "commit", "--amend", "-m", "rewritten", "--allow-empty")
    git(root, "reflog", "expire", "--expire=now", "--all")
    git(root, "gc", "-q", "--prune=now")
    gone = subprocess.run(["git", "cat-file", "-e", head], cwd=root, capture_output=True)
    assert gone.returncode != 0
    eng = Engine(root)
    try:
        assert eng.load_source == "files"
        assert_same_as_files(eng)
    finally:
        eng.close()


def _old_layout_pickle(root: Path, marker: Path) -> bytes:
    """What the daemon before the layer subpackages wrote: a bare pickle of a dict, no
    header line. Its objects name classes by their old modules; one of them here, if ever
    unpickled, would create `marker`, which proves it is refused before unpickling."""
    state = {"memories": ["a memory that must survive"], "touch": _Touch(marker)}
    return pickle.dumps(
        {"key": {"format": 1}, "head": git(root, "rev-parse", "HEAD").strip(), "state": state},
        protocol=pickle.HIGHEST_PROTOCOL,
    )


class _Touch:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[Path]]:
        return (Path.touch, (self.path,))


def test_a_warm_start_file_of_the_old_layout_is_refused_and_the_daemon_loads_the_files(
    tmp_path: Path, short_tmp: Path
) -> None:
    root = make_store(tmp_path / "m")
    eng = Engine(root)
    _add(eng, "a memory that must survive", "another one about trains")
    eng.close()
    runtime = root / ".clagd"
    good = (runtime / "warmstart.pickle").read_bytes()
    assert good.startswith(WARMSTART_MAGIC)
    marker = tmp_path / "unpickled"
    old = _old_layout_pickle(root, marker)
    # the old name (what the old layout left behind) and a header-less file at the new name
    (runtime / "snapshot.pickle").write_bytes(old)
    (runtime / "warmstart.pickle").write_bytes(old)
    d = InProcessDaemon(root, short_tmp / "s.sock")
    try:
        with d.client() as c:
            st = c.status()
            hits = c.query("must survive").memories
        assert st["load_source"] == "files"
        assert st["counts"]["memories"] == 2
        assert [h.content for h in hits][:1] == ["a memory that must survive"]
        assert_same_as_files(d.engine)
        assert not marker.exists()  # refused by its header, never unpickled
        assert not (runtime / "snapshot.pickle").exists()  # the old file is gone for good
    finally:
        d.stop()
    # the clean stop wrote a file of the current format, and the next start uses it
    assert (runtime / "warmstart.pickle").read_bytes().startswith(WARMSTART_MAGIC)
    eng = Engine(root)
    try:
        assert eng.load_source == "warmstart"
        assert_same_as_files(eng)
    finally:
        eng.close()


def test_a_warm_start_file_of_an_older_format_is_refused(tmp_path: Path) -> None:
    root = make_store(tmp_path / "m")
    eng = Engine(root)
    _add(eng, "a memory about the previous format")
    eng.close()
    path = root / ".clagd" / "warmstart.pickle"
    body = path.read_bytes()[len(WARMSTART_MAGIC) :]
    # the header of format 2 (the layer subpackages, before the file was renamed)
    path.write_bytes(b"clagd-startup-snapshot 2\n" + body)
    eng = Engine(root)
    try:
        assert eng.load_source == "files"
        assert_same_as_files(eng)
    finally:
        eng.close()


def test_a_warm_start_of_format_3_is_refused_before_unpickling(tmp_path: Path) -> None:
    """Format 3 pickled the index of one module (`retrieval.index`, before its cut by job):
    its header is refused, nothing of it is unpickled, the store loads from its files."""
    root = make_store(tmp_path / "m")
    eng = Engine(root)
    _add(eng, "a memory from before the cut", "another one about boats")
    eng.close()
    path = root / ".clagd" / "warmstart.pickle"
    assert path.read_bytes().startswith(WARMSTART_MAGIC)
    marker = tmp_path / "unpickled"
    path.write_bytes(b"clagd-warm-start 3\n" + _old_layout_pickle(root, marker))
    eng = Engine(root)
    try:
        assert eng.load_source == "files"
        assert_same_as_files(eng)
        assert not marker.exists()
        hits = eng.query("boats", count_round=False).memories
        assert hits[0].content == "another one about boats"
    finally:
        eng.close()
