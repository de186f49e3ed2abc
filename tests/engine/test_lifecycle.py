"""Issue 5: archive and thaw, history and revert, outside edits, replication, export."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from helpers import InProcessDaemon, git, head_contents, make_store, remote_has, wait_for

from clagd.cli import main
from clagd.client import ClientError

TOPICS = {
    "garden": [
        "The tomatoes in the garden need water every morning",
        "Planted basil next to the garden tomatoes in May",
        "The garden hose leaks near the tomatoes",
    ],
    "car": [
        "The car needs new winter tyres before December",
        "Car insurance renews in March; the car broker is Lisa",
        "The car makes a noise when braking",
    ],
}


def _fill(d: InProcessDaemon) -> None:
    with d.client() as c:
        for i, texts in enumerate(TOPICS.values()):
            c.add_many(
                [
                    {"content": t, "created_at": f"2026-0{i + 1}-01T10:0{k}:00Z"}
                    for k, t in enumerate(texts)
                ]
            )


def data_texts(data: dict) -> list[str]:
    """Near-copies of a cluster's memories: what routing would send into that cluster."""
    return [m["content"] + " (again)" for m in data["memories"]]


def _tree(root: Path) -> dict[str, list[str]]:
    """Which memory ids each store file holds, read from the working tree."""
    out = {}
    for d in ("clusters", "archive", "unsorted"):
        for f in sorted((root / d).glob("*.yaml")):
            out[f"{d}/{f.name}"] = sorted(
                m["id"] for m in yaml.safe_load(f.read_text())["memories"]
            )
    return out


@pytest.fixture
def cold_daemon(tmp_path: Path, short_tmp: Path):
    root = make_store(tmp_path / "m", {"archive": {"cold_after_days": 0, "thaw_on_hit": True}})
    d = InProcessDaemon(root, short_tmp / "s.sock")
    yield d
    d.stop()


def test_archive_query_with_archive_then_thaw(cold_daemon: InProcessDaemon) -> None:
    d = cold_daemon
    _fill(d)
    with d.client() as c:
        out = c.recluster()
        assert out["status"] in ("fallback", "accepted"), out
        clusters = c.clusters()["clusters"]
        assert len(clusters) >= 2 and c.clusters()["unsorted"] == 0
        # pin the cluster holding the car memories by hand: it must never be archived
        car = next(
            x
            for x in clusters
            if any("car" in t.lower() for t in [x["name"]] + x["tags"])
            or x["size"]
            and "car"
            in " ".join(
                m["content"]
                for m in yaml.safe_load((d.root / "clusters" / f"{x['id']}.yaml").read_text())[
                    "memories"
                ]
            ).lower()
        )
        path = d.root / "clusters" / f"{car['id']}.yaml"
        data = yaml.safe_load(path.read_text())
        data["pinned"] = True
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        d.engine.check_outside()
        dry = c.archive(dry_run=True)
        assert dry["clusters"] and car["id"] not in dry["clusters"]
        assert git(d.root, "status", "--porcelain", "--", "archive") == ""
        res = c.archive()
        assert sorted(res["clusters"]) == sorted(dry["clusters"]) and res["commit"]
        for cid in res["clusters"]:
            assert (d.root / "archive" / f"{cid}.yaml").exists() and not (
                d.root / "clusters" / f"{cid}.yaml"
            ).exists()
        assert "Clagd-Kind: archive" in git(d.root, "log", "-1", "--format=%B")
        hot = c.query("tomatoes garden water", max_memories=3)
        assert all("tomato" not in m.content for m in hot.memories)
        cold = c.call("query", text="tomatoes garden water", include_archive=True, max_memories=3)
        assert (
            cold["memories"][0]["archived"] is True and "tomatoes" in cold["memories"][0]["content"]
        )
        thawed = cold["thawing"]
        wait_for(
            lambda: "Clagd-Kind: thaw" in git(d.root, "log", "-1", "--format=%B"),
            what="thaw commit",
        )
        assert all((d.root / "clusters" / f"{cid}.yaml").exists() for cid in thawed)
        wait_for(
            lambda: any("tomatoes" in m.content for m in c.query("tomatoes garden water").memories),
            what="thawed cluster in the index",
        )
        assert sorted(head_contents(d.root)) == sorted(t for ts in TOPICS.values() for t in ts)


def test_revert_of_a_session_restores_the_exact_previous_memories(daemon: InProcessDaemon) -> None:
    _fill(daemon)
    before = _tree(daemon.root)
    with daemon.client() as c:
        out = c.recluster()
        assert out["commits"], out
        assert _tree(daemon.root) != before
        res = c.revert(out["session_id"])
        assert res["reverted"]
        assert _tree(daemon.root) == before
        assert c.status()["counts"]["unsorted"] == 6
        kinds = [e["kind"] for e in c.log(10)["entries"]]
        assert "revert" in kinds and "cluster" in kinds
        # the revert commit is itself undoable, and the history keeps both
        c.revert(res["commits"][0])
        assert _tree(daemon.root) != before and c.status()["counts"]["unsorted"] == 0


def test_revert_that_conflicts_is_refused_and_leaves_the_store_as_it_was(
    daemon: InProcessDaemon,
) -> None:
    with daemon.client() as c:
        first = c.add_many([{"content": t} for t in TOPICS["garden"]])
        session = c.recluster()  # moves the memories out of the first batch's shard
        c.forget(ids=first["ids"][:1])  # and a later commit changes the session's cluster
        head = git(daemon.root, "rev-parse", "HEAD")
        tree = _tree(daemon.root)
        with pytest.raises(ClientError) as exc:
            c.revert(session["session_id"])
        assert exc.value.code == "conflict"
        assert "later commits changed the same files" in exc.value.message
        assert git(daemon.root, "rev-parse", "HEAD") == head and _tree(daemon.root) == tree
        assert git(daemon.root, "status", "--porcelain", "--", "clusters", "unsorted") == ""
        assert c.ping()["pong"]
        # the ingest itself is undone wherever its memories went since (issue 24)
        res = c.revert(first["commit"])
        assert res["reverted"] and head_contents(daemon.root) == []


def test_hand_edits_while_running(daemon: InProcessDaemon) -> None:
    _fill(daemon)
    with daemon.client() as c:
        c.recluster()
        cid = c.clusters()["clusters"][0]["id"]
        path = daemon.root / "clusters" / f"{cid}.yaml"
        good = path.read_text()
        data = yaml.safe_load(good)
        data["name"] = "Renamed by hand"
        data["memories"][0]["content"] = "An edited memory about the lighthouse keeper"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        wait_for(
            lambda: git(daemon.root, "log", "-1", "--format=%B").find("Clagd-Kind: edit") >= 0,
            what="edit commit",
        )
        # the commit is in git a moment before the daemon serves it (its branch moves on the
        # git thread, then the writer publishes): under load that moment is long
        wait_for(
            lambda: any(x["name"] == "Renamed by hand" for x in c.clusters()["clusters"]),
            what="the edit served",
        )
        # queries are answered by the query process, whose copy of the index takes the
        # edit in a moment later (a hand edit is no write request: nothing waits for it)
        wait_for(lambda: c.query("lighthouse keeper").memories, what="the edit queried")
        assert c.query("lighthouse keeper").memories[0].content.startswith("An edited memory")
        # a broken edit: reported, and the last good state keeps serving
        from clagd.model import Memory

        would = daemon.engine.index.route_many([Memory.new(t) for t in data_texts(data)])
        assert cid in would  # without the broken edit, these would be routed into its file
        path.write_text("id: [broken\n")
        wait_for(lambda: c.status()["outside_edit_error"], what="broken edit reported")
        assert c.query("lighthouse keeper").memories[0].content.startswith("An edited memory")
        added = c.add("Ingest still works during a broken edit")
        assert added["added"] == 1
        # a memory that would be routed into the broken cluster goes to unsorted instead
        routed = c.add_many([{"content": t} for t in data_texts(data)])
        assert routed["routed"] == 0
        with pytest.raises(ClientError) as exc:
            c.recluster()
        assert exc.value.code == "conflict"
        assert "id: [broken" in path.read_text()  # the user's file is never overwritten
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        wait_for(lambda: not c.status()["outside_edit_error"], what="recovery")
        assert c.status()["counters"]["outside_edit_errors"] >= 1


def test_user_git_revert_while_running(daemon: InProcessDaemon) -> None:
    with daemon.client() as c:
        c.add("Keep this memory")
        gone = c.add("The user will revert this memory")
        git(daemon.root, "revert", "--no-edit", gone["commit"])
        wait_for(lambda: c.status()["counts"]["memories"] == 1, what="reload after git revert")
        assert all("revert this" not in m.content for m in c.query("revert memory").memories)
        # the same memory can be added again afterwards
        assert c.add("The user will revert this memory")["added"] == 1


def test_push_to_a_bare_remote_and_a_failing_push(tmp_path: Path, short_tmp: Path) -> None:
    remote = tmp_path / "backup.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    root = make_store(
        tmp_path / "m", {"replication": {"remote": str(remote), "retry_seconds": 0.2}}
    )
    d = InProcessDaemon(root, short_tmp / "s.sock")
    try:
        with d.client() as c:
            res = c.add("Replicated memory")
            # `main` does not exist in the remote until the first push lands, and a
            # route pass may commit on top of the add before the push catches up
            wait_for(lambda: remote_has(remote, res["commit"]), what="push")
            assert c.status()["replication"]["pushes"] >= 1
    finally:
        d.stop()
    root2 = make_store(
        tmp_path / "m2",
        {"replication": {"remote": str(tmp_path / "missing.git"), "retry_seconds": 0.2}},
    )
    d2 = InProcessDaemon(root2, short_tmp / "s2.sock")
    try:
        with d2.client() as c:
            assert c.add("Not replicated, but stored")["added"] == 1
            wait_for(lambda: c.status()["replication"]["failures"] >= 2, what="push retries")
            assert c.status()["replication"]["last_error"]
            assert c.add("The writer is not blocked by a failing push")["added"] == 1
    finally:
        d2.stop()


def test_export_markdown(daemon: InProcessDaemon, tmp_path: Path) -> None:
    _fill(daemon)
    with daemon.client() as c:
        c.recluster()
        n = len(c.clusters()["clusters"])
        c.add("An unsorted memory to export")
    out = CliRunner().invoke(main, ["--store", str(daemon.root), "export", str(tmp_path / "md")])
    assert out.exit_code == 0, out.output
    files = sorted((tmp_path / "md").glob("*.md"))
    assert len(files) == n + 1
    text = "".join(f.read_text() for f in files)
    for t in [t for ts in TOPICS.values() for t in ts] + ["An unsorted memory to export"]:
        assert t in text
    assert all(f.read_text().startswith("# ") for f in files)


def test_reverting_what_is_already_reverted_says_so_and_changes_nothing(
    daemon: InProcessDaemon,
) -> None:
    _fill(daemon)
    with daemon.client() as c:
        out = c.recluster()
        first = c.revert(out["session_id"])
        head = c.status()["head"]
        tree = _tree(daemon.root)
        with pytest.raises(ClientError) as err:
            c.revert(out["session_id"])
        assert err.value.code == "already_reverted"
        assert str(err.value) == (
            f"session {out['session_id']} is already reverted "
            f"(by {first['commits'][0][:10]}): nothing changed"
        )
        # the same for the session's commit named by its id
        with pytest.raises(ClientError, match="is already reverted"):
            c.revert(out["commits"][0])
        assert c.status()["head"] == head and _tree(daemon.root) == tree
        # undoing the revert brings the session back; then the session can be reverted again
        c.revert(first["commits"][0])
        assert _tree(daemon.root) != tree
        again = c.revert(out["session_id"])
        assert len(again["commits"]) == len(first["commits"])
        assert _tree(daemon.root) == tree
    res = CliRunner().invoke(main, ["--socket", str(daemon.socket), "revert", out["session_id"]])
    assert res.exit_code == 1 and "is already reverted" in res.output
