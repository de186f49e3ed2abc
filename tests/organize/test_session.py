"""Clustering sessions with the real `ollama` client against a scripted loopback server, a
real store (git) and the real writer: good plans are kept, every bad answer leaves HEAD
holding exactly the memories it held before."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from competent import Competent
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
from helpers import git, head_contents

import clagd.organize.session as session_mod
from clagd.engine.core import Engine
from clagd.organize.plan_apply import apply_plan
from clagd.organize.session import engine_session_runner, run_session
from clagd.slm.manager import BackendManager
from clagd.slm.ollama import OllamaBackend

TEXTS = [
    "User is always cold in the evening",
    "User asked where the heating switch is",
    "Anna is the user's sister",
    "Anna lives in Lyon",
    "User likes green tea in the afternoon",
    "User drinks black coffee in the morning",
    "The quarterly report is due on 30 April",
    "User's manager is called Tom",
]

REFERENCE = dict(
    zip(
        TEXTS,
        ["home heating comfort"] * 2
        + ["sister Anna"] * 2
        + ["drinks the user likes"] * 2
        + ["work at the office"] * 2,
    )
)


@pytest.fixture
def eng(store: Path, fake: FakeOllama) -> Iterator[Engine]:
    e = Engine(store)
    e.config.backend.kind = "ollama"
    e.config.backend.ollama.host = fake.url
    e.config.backend.ollama.timeout = 5.0
    e.config.session.validate_fraction = 0.5
    e.add(
        [
            {"content": t, "created_at": f"2025-03-0{i % 9 + 1}T10:00:00Z"}
            for i, t in enumerate(TEXTS)
        ]
    )
    yield e
    e.close()


def run(eng: Engine, **kw: object) -> session_mod.SessionOutcome:
    backend = OllamaBackend(eng.config.backend.ollama)
    return run_session(eng.writer.submit, backend, eng.config, eng.paths.prompts, **kw)  # type: ignore[arg-type]


def log_kinds(root: Path) -> list[tuple[str, str]]:
    out = git(root, "log", "--format=%s%x09%(trailers:key=Clagd-Kind,valueonly,separator=)")
    return [tuple(line.split("\t")) for line in out.splitlines()]  # type: ignore[misc]


def test_good_plan_is_applied_and_committed(eng: Engine, fake: FakeOllama) -> None:
    before = sorted(head_contents(eng.root))
    out = run(eng, trigger="test")
    assert out.status == "accepted", out.reasons
    assert out.backend == "ollama" and out.model == "qwen2.5:1.5b-instruct"
    assert out.sampled == len(TEXTS) and out.moved == len(TEXTS) and out.prompt_tokens > 0
    assert sorted(head_contents(eng.root)) == before
    assert {c.name for c in eng.state.clusters.values()} == {"user daily notes", "user extra notes"}
    assert not eng.state.unsorted
    msg = git(eng.root, "log", "-1", "--format=%B")
    for trailer in (
        "Clagd-Kind: cluster",
        f"Clagd-Session: {out.session_id}",
        "Clagd-Trigger: test",
        "Clagd-Backend: ollama",
        "Clagd-Model: qwen2.5:1.5b-instruct",
    ):
        assert trailer in msg
    assert "Reason: grouped by the fake model" in msg
    # the plan call was schema-constrained with enumerated aliases, then one validation call
    plan_req, check_req = fake.chats
    assert plan_req["format"]["properties"]["assign"]["required"] == [f"M{i}" for i in range(1, 9)]
    assert plan_req["options"]["temperature"] == eng.config.backend.ollama.temperature
    assert "verdicts" in check_req["format"]["properties"]
    assert "user comfort" in plan_req["messages"][0]["content"]  # few-shot examples


BAD = {
    "invalid_json": (invalid_json, "not valid JSON"),
    "timeout": (lambda: delay(3.0), "no answer"),
    "unknown_id": (unknown_id, "C999"),
    "dropped": (dropped_memory, "is missing"),
    "assigned_twice": (assigned_twice, "twice"),
    "empty_cluster": (empty_cluster, "is empty"),
    "duplicate_names": (duplicate_names, "duplicate cluster name"),
}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_bad_answers_keep_every_memory(eng: Engine, fake: FakeOllama, kind: str) -> None:
    make, message = BAD[kind]
    eng.config.backend.ollama.timeout = 0.5
    before = sorted(head_contents(eng.root))
    fake.script += [make(), make()]
    out = run(eng)
    assert out.attempts == 2
    assert out.status in ("fallback", "failed"), out
    assert any(message in r for r in out.reasons), out.reasons
    assert sorted(head_contents(eng.root)) == before
    assert not git(eng.root, "status", "--porcelain", "clusters", "unsorted")
    # the failure is in the history (a lexical commit naming it, or a session record)
    assert message in git(eng.root, "log", "--format=%B", "-3")


def test_validation_no_reverts_then_falls_back(eng: Engine, fake: FakeOllama) -> None:
    before = sorted(head_contents(eng.root))
    fake.script += [good_plan(), verdicts("no"), good_plan(), verdicts("no")]
    out = run(eng)
    assert out.status == "fallback", out.reasons
    assert any("validation error rate 100%" in r for r in out.reasons)
    kinds = [k for _s, k in log_kinds(eng.root)]
    assert kinds.count("revert") == 2 and kinds.count("cluster") >= 2
    assert sorted(head_contents(eng.root)) == before
    reverts = git(eng.root, "log", "--format=%B", "--grep=validation error rate")
    assert "This reverts commit" in reverts and "Clagd-Status: rolled_back" in reverts


def test_retry_with_another_seed(eng: Engine, fake: FakeOllama) -> None:
    fake.script += [invalid_json(), good_plan()]
    out = run(eng)
    assert out.status == "accepted" and out.attempts == 2
    seeds = [r["options"]["seed"] for r in fake.chats[:2]]
    assert seeds[0] != seeds[1]


def test_invariant_failure_is_reverted(
    eng: Engine, fake: FakeOllama, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug that loses a memory while applying is caught after the commit and reverted."""

    def lossy_apply(state, plan, now=None, touch=None):  # type: ignore[no-untyped-def]
        applied = apply_plan(state, plan, now=now, touch=touch)
        cid = sorted(applied.changed)[0]
        state.clusters[cid].memories.pop()
        return applied

    before = sorted(head_contents(eng.root))
    monkeypatch.setattr(session_mod, "apply_plan", lossy_apply)
    out = run(eng)
    monkeypatch.undo()
    assert any("invariant failed" in r and "lost" in r for r in out.reasons), out.reasons
    assert sorted(head_contents(eng.root)) == before
    assert [k for _s, k in log_kinds(eng.root)].count("revert") >= 1


def test_memories_arriving_during_the_session_stay_put(eng: Engine, fake: FakeOllama) -> None:
    def answer_after_an_add(req):  # type: ignore[no-untyped-def]
        eng.add([{"content": "A memory that arrived while the model was thinking"}])
        return good_plan()(req)

    fake.script.append(answer_after_an_add)
    out = run(eng)
    assert out.status == "accepted", out.reasons
    late = [m for mems in eng.state.unsorted.values() for m in mems]
    assert [m.content for m in late] == ["A memory that arrived while the model was thinking"]


def test_lexical_backend_and_engine_runner(eng: Engine, fake: FakeOllama) -> None:
    out = run_session(eng.writer.submit, None, eng.config, eng.paths.prompts)
    assert out.backend == "none" and out.status in ("accepted", "noop"), out.reasons
    manager = BackendManager(eng.config)
    eng.hooks.session_runner = engine_session_runner(manager)
    # passes the competence gate the runner applies first, then plans by this reference
    fake.default = Competent(REFERENCE)
    result = eng.recluster(trigger="manual")
    assert result.backend == "ollama" and result.status in ("accepted", "noop"), result.reasons
    assert eng.status().counters["sessions"] >= 1
    manager.close()


def test_nothing_to_do_is_noop(store: Path) -> None:
    e = Engine(store)
    try:
        out = run_session(e.writer.submit, None, e.config, e.paths.prompts)
        assert out.status == "noop" and out.commits == []
    finally:
        e.close()
