"""Issue 4 end to end: a real daemon whose SLM is the real `ollama` client talking to a
loopback server that speaks Ollama's API. Every bad answer leaves HEAD with exactly the
memories it had, shows in `clagd log` and `status`, and queries are served throughout."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from competent import pass_gate
from fake_ollama import (
    FakeOllama,
    assigned_twice,
    delay,
    dropped_memory,
    duplicate_names,
    empty_cluster,
    good_plan,
    invalid_json,
    unknown_id,
    verdicts,
)
from helpers import InProcessDaemon, git, head_contents, make_store

from clagd.cli import main

TEXTS = [
    "The user is sensitive to cold and wears a sweater indoors",
    "The user asked where the heating switch is in the flat",
    "The user prefers the bedroom window closed at night",
    "The user's sister Ana visits every second Sunday",
    "Ana likes lemon cake; bake one before her visit",
    "The user's car is due for an inspection in June",
    "The car inspection garage is on Mill Street",
    "The user takes the 8:15 train to work on weekdays",
]


@pytest.fixture
def slm_daemon(tmp_path: Path, short_tmp: Path, fake: FakeOllama) -> Iterator[InProcessDaemon]:
    root = make_store(
        tmp_path / "m",
        {
            "backend": {"kind": "ollama", "ollama": {"host": fake.url, "timeout": 1.0}},
            "session": {"validate_fraction": 1.0},
        },
    )
    d = InProcessDaemon(root, short_tmp / "s.sock")
    backend = d.daemon.backends.recheck()
    pass_gate(fake, backend, d.daemon.config, root)  # the gate's calls are not the script's
    with d.client() as c:
        c.add_many([{"content": t} for t in TEXTS])
    yield d
    d.stop()


class QueryLoad:
    """Queries the daemon in a loop while a session runs; every one must succeed."""

    def __init__(self, d: InProcessDaemon) -> None:
        self.d = d
        self.ok = 0
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.run)

    def run(self) -> None:
        with self.d.client() as c:
            while not self.stop.is_set():
                try:
                    assert c.query("heating cold sweater").memories
                    self.ok += 1
                except BaseException as exc:  # noqa: BLE001
                    self.errors.append(exc)

    def __enter__(self) -> QueryLoad:
        self.t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.t.join(30)


def test_good_plan_applied_committed_and_logged(
    slm_daemon: InProcessDaemon, fake: FakeOllama
) -> None:
    fake.script += [good_plan(), verdicts("yes")]
    with slm_daemon.client() as c, QueryLoad(slm_daemon) as load:
        assert c.status()["backend"]["active"] == "ollama"
        out = c.recluster()
        assert out["status"] == "accepted" and out["backend"] == "ollama", out
        names = {x["name"] for x in c.clusters()["clusters"]}
        assert names == {"user daily notes", "user extra notes"}
        st = c.status()
        assert (
            st["counters"]["sessions_accepted"] == 1 and st["last_session"]["status"] == "accepted"
        )
    assert not load.errors and load.ok > 0
    assert sorted(head_contents(slm_daemon.root)) == sorted(TEXTS)
    out_log = CliRunner().invoke(main, ["--socket", str(slm_daemon.socket), "log"])
    assert "cluster" in out_log.output and "backend=ollama" in out_log.output


BAD = {
    "invalid_json": [invalid_json(), invalid_json()],
    "timeout": [delay(3.0), delay(3.0)],
    "unknown_id": [unknown_id(), unknown_id()],
    "dropped": [dropped_memory(), dropped_memory()],
    "assigned_twice": [assigned_twice(), assigned_twice()],
    "empty_cluster": [empty_cluster(), empty_cluster()],
    "duplicate_names": [duplicate_names(), duplicate_names()],
    "judged_wrong": [good_plan(), verdicts("no"), good_plan(), verdicts("no")],
}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_bad_answers_roll_back_and_are_visible(
    slm_daemon: InProcessDaemon, fake: FakeOllama, kind: str
) -> None:
    fake.script += BAD[kind]
    before = sorted(head_contents(slm_daemon.root))
    with slm_daemon.client() as c, QueryLoad(slm_daemon) as load:
        out = c.recluster()
        assert out["status"] in ("fallback", "rolled_back"), out
        assert out["reasons"], out
        st = c.status()
        assert st["counters"][f"sessions_{out['status']}"] == 1
        assert st["backend"]["failures"] >= 1 and st["backend"]["last_error"]
        entries = c.log(20)["entries"]
    assert not load.errors and load.ok > 0
    assert sorted(head_contents(slm_daemon.root)) == before  # exactly the same memories
    statuses = {e["status"] for e in entries if e.get("session") == out["session_id"]}
    assert statuses & {"fallback", "rolled_back"}, entries
    subjects = git(slm_daemon.root, "log", "--format=%s")
    if kind == "judged_wrong":  # a plan was committed, judged wrong, and reverted: both in history
        assert subjects.count("revert: ") >= 1
    assert git(slm_daemon.root, "fsck", "--no-progress").strip() == ""
