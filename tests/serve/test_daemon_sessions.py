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
    default_answer,
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


def test_a_model_session_plans_per_scope_and_its_conflicts_still_supersede(
    tmp_path: Path, short_tmp: Path, fake: FakeOllama
) -> None:
    """Issue 24: with a model the gate allows, each plan request holds one scope's memories
    only, no cluster mixes scopes, and a plan's `conflicts` (the model-driven supersede)
    still link the newer memory over the older, which then ranks below it."""
    import re

    from fake_ollama import is_plan_request

    from clagd.store.files import load_state

    root = make_store(
        tmp_path / "m",
        {
            "backend": {"kind": "ollama", "ollama": {"host": fake.url, "timeout": 5.0}},
            "session": {"validate_fraction": 1.0},
            "ingest": {"auto_supersede": False},  # only the model links them here
        },
    )
    d = InProcessDaemon(root, short_tmp / "s.sock")
    try:
        pass_gate(fake, d.daemon.backends.recheck(), d.daemon.config, root)
        gate_calls = len(fake.chats)
        alice = [
            "Alice lives in Berlin with her cat",
            "Alice's cat is called Miso",
            "Alice moved away from Berlin to Lisbon this spring",
        ]
        bob = ["Bob lives in Berlin near the zoo", "Bob's dog is called Rex"]

        def plan(req: dict) -> dict:
            ans = default_answer(req)
            lines = dict(re.findall(r"^(M\d+): (.*)$", req["messages"][-1]["content"], re.M))
            old = [a for a, t in lines.items() if t.startswith("Alice lives in Berlin")]
            new = [a for a, t in lines.items() if t.startswith("Alice moved away")]
            if old and new:  # a link is kept between memories of one cluster
                ans["content"]["assign"][new[0]] = ans["content"]["assign"][old[0]]
                ans["content"]["conflicts"] = [{"newer": new[0], "older": old[0]}]
            return ans

        fake.default = plan
        with d.client() as c:
            c.add_many(
                [
                    {"content": t, "created_at": f"2025-0{i + 1}-01T10:00:00Z"}
                    for i, t in enumerate(alice)
                ],
                scope="alice",
            )
            c.add_many([{"content": t} for t in bob], scope="bob")
            out = c.recluster()
            assert out["status"] == "accepted" and out["backend"] == "ollama", out
            plans = [r for r in fake.chats[gate_calls:] if is_plan_request(r)]
            assert plans, "the session asked the model for a plan"
            for r in plans:  # a plan request shows one scope's memories
                shown = re.findall(r"^M\d+: (.*)$", r["messages"][-1]["content"], re.M)
                owners = {
                    ("alice" if any(s.startswith(t) for t in alice) else "bob") for s in shown
                }
                assert len(owners) == 1, shown
            state = load_state(root)
            for cl in state.clusters.values():
                assert {m.scope for m in cl.memories} == {cl.scope}, cl.name
            links = {k: v for cl in state.clusters.values() for k, v in cl.supersedes.items()}
            ids = {m.content: m.id for m, _a, _k in state.all_memories()}
            assert links == {ids[alice[2]]: ids[alice[0]]}
            got = [
                h.content for h in c.query("Where does Alice live, Berlin?", scope="alice").memories
            ]
            assert alice[2] in got and got.index(alice[2]) < got.index(alice[0]), got
            bobs = [h.content for h in c.query("Who lives in Berlin?", scope="bob").memories]
            assert bobs and all(b in bob for b in bobs)
    finally:
        d.stop()
