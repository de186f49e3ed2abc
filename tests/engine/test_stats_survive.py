"""Access statistics survive cleaning the store (`.git/clagd-stats.json`, beside the lock),
and no statistics means "unknown", not "cold": a store that lost them archives nothing by
their absence. Finding 5 of issue 26: after `git clean -fdx` and a restart, two clusters
queried 40 times just before (created 60 days earlier) were archived."""

from __future__ import annotations

import json
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import yaml
from helpers import InProcessDaemon, git, make_store

TOPICS = {
    "espresso": ["espresso grinder burr setting {}", "espresso shot pulled {}"],
    "marathon": ["marathon training tempo run {}", "marathon long run pace {}"],
}


def _old_clusters(store: Path, sock: Path) -> list[str]:
    """Two clusters whose files say they were made and changed 60 days ago (committed by
    the person), each queried 20 times."""
    d = InProcessDaemon(store, sock)
    try:
        with d.client() as c:
            for topic in TOPICS.values():
                c.add_many([{"content": t.format(i)} for i in range(4) for t in topic])
            assert c.recluster()["status"] in ("accepted", "fallback")
            old = (datetime.now(timezone.utc) - timedelta(days=60)).isoformat()
            for f in (store / "clusters").glob("*.yaml"):
                data = yaml.safe_load(f.read_text())
                data["created_at"] = data["updated_at"] = old
                f.write_text(yaml.safe_dump(data, sort_keys=False))
            git(store, "commit", "-qam", "the clusters are 60 days old")
            d.engine.check_outside()
            for _ in range(20):
                for word in TOPICS:
                    assert c.query(f"{word} run shot").memories
            assert c.archive(dry_run=True)["clusters"] == []  # read just now
            return sorted(c.clusters()["clusters"][i]["id"] for i in range(2))
    finally:
        d.stop()


def _cold_after_restart(store: Path, sock: Path) -> tuple[list[str], int]:
    """What a restarted daemon would archive, and the clusters' access count in all."""
    d = InProcessDaemon(store, sock)
    try:
        with d.client() as c:
            reads = sum(x["access_count"] for x in c.clusters()["clusters"])
            return list(c.archive(dry_run=True)["clusters"]), reads
    finally:
        d.stop()


def test_access_statistics_survive_git_clean(tmp_path: Path, short_tmp: Path) -> None:
    store = make_store(tmp_path / "memory", {"archive": {"cold_after_days": 30, "min_size": 1}})
    _old_clusters(store, short_tmp / "s.sock")
    stats = store / ".git" / "clagd-stats.json"
    assert json.loads(stats.read_text())["clusters"]
    subprocess.run(["git", "clean", "-q", "-fdx"], cwd=store, check=True)
    assert not (store / ".clagd").exists() and stats.exists()
    cold, reads = _cold_after_restart(store, short_tmp / "s.sock")
    assert cold == [] and reads >= 40


def test_no_statistics_means_unknown_not_cold(tmp_path: Path, short_tmp: Path) -> None:
    store = make_store(tmp_path / "memory", {"archive": {"cold_after_days": 30, "min_size": 1}})
    _old_clusters(store, short_tmp / "s.sock")
    (store / ".git" / "clagd-stats.json").unlink()  # lost altogether
    assert _cold_after_restart(store, short_tmp / "s.sock") == ([], 0)
    since = json.loads((store / ".git" / "clagd-stats.json").read_text())["since"]
    assert since > (datetime.now(timezone.utc) - timedelta(minutes=5)).timestamp()


def test_statistics_in_clagd_are_taken_over_once(tmp_path: Path, short_tmp: Path) -> None:
    """A store of before: `.clagd/stats.json` is read, saved under `.git/`, and removed
    (no second copy a forget would miss)."""
    store = make_store(tmp_path / "memory", {"archive": {"cold_after_days": 30, "min_size": 1}})
    ids = _old_clusters(store, short_tmp / "s.sock")
    new = store / ".git" / "clagd-stats.json"
    data = json.loads(new.read_text())
    del data["since"]
    legacy = store / ".clagd" / "stats.json"
    legacy.write_text(json.dumps(data))
    new.unlink()
    cold, reads = _cold_after_restart(store, short_tmp / "s.sock")
    assert cold == [] and reads >= 40
    assert not legacy.exists()
    taken = json.loads(new.read_text())
    assert taken["clusters"] == data["clusters"] and all(i in taken["clusters"] for i in ids)
