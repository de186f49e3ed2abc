"""The start-up snapshot: a fast start that is never wrong. Whatever happened since the
snapshot (commits, a kill, hand edits, a corrupt file), the loaded store equals the files."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml
from helpers import assert_same_as_files, git, make_store

from clagd.engine.core import Engine
from clagd.ingest.inbox import Item


def _add(eng: Engine, *texts: str) -> None:
    eng.ingest([Item(t, None, {}) for t in texts], source="test")


def test_clean_restart_loads_the_snapshot(tmp_path: Path) -> None:
    root = make_store(tmp_path / "m")
    eng = Engine(root)
    _add(eng, "alpha memory about boats", "beta memory about trains")
    before = eng.query("boats", count_round=False)["memories"]
    eng.close()
    eng = Engine(root)
    try:
        assert eng.load_source == "warmstart"
        assert_same_as_files(eng)
        assert eng.query("boats", count_round=False)["memories"][0]["id"] == before[0]["id"]
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
        assert any(c["name"] == "Edited while stopped" for c in eng.clusters()["clusters"])
        assert (
            eng.query("kitchen", count_round=False)["memories"][0]["content"]
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
