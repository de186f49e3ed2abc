"""Session triggers (new memories, dialogue rounds), bulk import, and long store paths."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from helpers import InProcessDaemon, make_store, wait_for

from clagd.cli import main


def test_memory_threshold_triggers_a_session(tmp_path: Path, short_tmp: Path) -> None:
    root = make_store(tmp_path / "m", {"session": {"memory_add_threshold": 5}})
    d = InProcessDaemon(root, short_tmp / "s.sock")
    try:
        with d.client() as c:
            c.add_many([{"content": f"note {i} about the boat trip"} for i in range(4)])
            assert c.status()["counters"]["sessions"] == 0
            c.add("the fifth note about the boat trip")
            st = wait_for(
                lambda: (s := c.status())["counters"]["sessions"] >= 1 and s, what="a session"
            )
            assert st["last_session"]["trigger"] == "memories"
            assert st["counts"]["unsorted"] == 0 and st["new_since_session"] == 0
    finally:
        d.stop()


def test_dialogue_rounds_trigger_a_session(tmp_path: Path, short_tmp: Path) -> None:
    root = make_store(tmp_path / "m", {"session": {"dialogue_round_threshold": 3}})
    d = InProcessDaemon(root, short_tmp / "s.sock")
    try:
        with d.client() as c:
            c.add_many([{"content": "the user likes jazz"}, {"content": "the user plays piano"}])
            c.query("music")  # a query is a round
            c.round(2)
            st = wait_for(
                lambda: (s := c.status())["counters"]["sessions"] >= 1 and s, what="a session"
            )
            assert st["last_session"]["trigger"] == "rounds"
    finally:
        d.stop()


def test_bulk_import_with_rejects(daemon: InProcessDaemon, tmp_path: Path) -> None:
    src = tmp_path / "import"
    (src / "sub").mkdir(parents=True)
    (src / "a.json").write_text(
        json.dumps([{"content": f"imported memory {i}"} for i in range(30)])
    )
    (src / "sub" / "b.md").write_text("---\nsource: notes\n---\nA note from a folder\n")
    (src / "bad.yaml").write_text("content: [oops\n")
    out = CliRunner().invoke(
        main, ["--socket", str(daemon.socket), "import", str(src), "--batch", "7", "--json"]
    )
    assert out.exit_code == 1  # one file was rejected, and said so
    res = json.loads(out.output)
    assert (
        res["added"] == 31
        and res["files"] == 3
        and list(res["rejected"]) == [str(src / "bad.yaml")]
    )
    with daemon.client() as c:
        assert c.status()["counts"]["memories"] == 31
    again = CliRunner().invoke(
        main, ["--socket", str(daemon.socket), "import", str(src / "a.json")]
    )
    assert again.exit_code == 0 and "(30 already stored)" in again.output


def test_store_path_too_long_for_af_unix_uses_a_short_socket(tmp_path: Path) -> None:
    deep = tmp_path / ("x" * 60) / ("y" * 60)
    root = make_store(deep / "memory")
    d = InProcessDaemon(root)  # no explicit socket: the default for this store
    try:
        assert len(str(root / ".clagd" / "clagd.sock")) > 107
        assert len(str(d.socket)) <= 107
        out = CliRunner().invoke(main, ["--store", str(root), "status", "--json"])
        assert out.exit_code == 0, out.output
        assert json.loads(out.output)["store"] == str(root)
    finally:
        d.stop()


def test_status_activity_shows_a_queued_then_running_session() -> None:
    """`activity` never reads idle between a trigger and the end of its session."""
    import threading

    from clagd.serve.scheduler import Activity, Scheduler

    started, release, done = threading.Event(), threading.Event(), threading.Event()

    def session(trigger: str) -> None:
        started.set()
        release.wait(20)
        done.set()

    s = Scheduler(session, lambda: None, lambda: None, lambda: None, 0, 0, 3600, 0)
    s.start()
    try:
        assert s.activity() == Activity(session_queued=False, session_running=False)
        s.trigger_session("memories")
        seen = s.activity()
        assert seen.session_queued or seen.session_running
        assert started.wait(20)
        assert s.activity() == Activity(session_queued=False, session_running=True)
        s.trigger_session("rounds")  # queued behind the running one
        assert s.activity() == Activity(session_queued=True, session_running=True)
        release.set()
        wait_for(lambda: s.activity() == Activity(session_queued=False, session_running=False))
        assert done.is_set()
    finally:
        release.set()
        s.stop()
