"""A model allowed to `name` but not to `organize`: sessions keep the lexical organizer's
grouping and the model writes the profiles of the clusters the session creates or changes,
in batched, time-bounded calls, with the real `ollama` client against the scripted loopback
server, a real store and the real writer."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from competent import Competent
from fake_ollama import FakeOllama
from helpers import git, head_contents

from clagd.engine.core import Engine
from clagd.model import Cluster
from clagd.organize.gate import GateResult, TaskScore
from clagd.organize.lexical import organize
from clagd.organize.naming import BATCH
from clagd.organize.organizers import NamingOrganizer, organizer_for
from clagd.organize.session import run_session
from clagd.slm.ollama import OllamaBackend

# six topics a day apart: the lexical organizer makes six clusters
TOPICS = [
    ("User is always cold in the evening", "User asked where the heating switch is"),
    ("Anna is the user's sister", "Anna lives in Lyon with two cats"),
    ("User likes green tea in the afternoon", "User drinks black coffee in the morning"),
    ("The quarterly report is due on 30 April", "Tom reviews the quarterly report"),
    ("User runs 5 km on Tuesdays", "User signed up for a half marathon"),
    ("The car needs new tyres", "The mechanic quoted 300 euros for the brakes"),
]


def verdict(**allowed: bool) -> GateResult:
    res = GateResult("ollama", "qwen2.5:1.5b-instruct", "k", "2026-12-02T00:00:00Z")
    for task in ("route", "organize", "name", "judge"):
        ok = allowed.get(task, False)
        res.tasks[task] = TaskScore(0.5, 0.4, ok, "set by the test")
    return res


def profiles(req: dict[str, Any]) -> dict[str, Any]:
    """A naming answer: each group named after its first memory's distinctive word."""
    user = req["messages"][-1]["content"]
    out, key = {}, ""
    for line in user.splitlines():
        head = re.match(r"^(G\d+) \(", line)
        if head:
            key = head.group(1)
        elif line.startswith("- ") and key and key not in out:
            word = max(re.findall(r"[A-Za-z]+", line[2:]), key=len)
            out[key] = {
                "name": f"model named {word}",
                "description": f"Everything about {word}.",
                "tags": [word.casefold(), "model"],
            }
    return {"content": {"groups": out}}


def groups_of(clusters: Iterable[Cluster]) -> set[frozenset[str]]:
    """The clusters' contents, each cluster one set."""
    return {frozenset(m.content for m in c.memories) for c in clusters}


def grouped(pairs: Iterable[tuple[str, str]]) -> set[frozenset[str]]:
    """(text, group) pairs as the sets of texts of each group."""
    out: dict[str, set[str]] = {}
    for text, group in pairs:
        out.setdefault(group, set()).add(text)
    return {frozenset(v) for v in out.values()}


@pytest.fixture
def eng(store: Path, fake: FakeOllama) -> Iterator[Engine]:
    e = Engine(store)
    e.config.backend.kind = "ollama"
    e.config.backend.ollama.host = fake.url
    e.config.backend.ollama.timeout = 5.0
    items = [
        {"content": t, "created_at": f"2025-03-{day + 1:02d}T10:0{j}:00Z"}
        for day, pair in enumerate(TOPICS)
        for j, t in enumerate(pair)
    ]
    e.add(items)
    yield e
    e.close()


def run(eng: Engine, gate: GateResult) -> Any:
    backend = OllamaBackend(eng.config.backend.ollama)
    return run_session(eng.writer.submit, backend, eng.config, eng.paths.prompts, gate=gate)


def test_the_permissions_pick_the_organizer(eng: Engine, fake: FakeOllama) -> None:
    backend = OllamaBackend(eng.config.backend.ollama)
    cfg = eng.config.session
    assert isinstance(organizer_for(backend, cfg, None, verdict(name=True)), NamingOrganizer)
    assert organizer_for(backend, cfg, None, verdict()).backend.name == "none"
    grouping = organizer_for(backend, cfg, None, verdict(organize=True))
    assert type(grouping).__name__ == "ModelOrganizer" and not grouping.may_name
    both = organizer_for(backend, cfg, None, verdict(organize=True, name=True))
    assert type(both).__name__ == "ModelOrganizer" and both.may_name


def test_model_grouping_lexical_names(eng: Engine, fake: FakeOllama) -> None:
    """Allowed to organize but not to name: the model's groups, the lexical names."""
    # a grouping the lexical organizer would not make: the drinks go with the cold evenings
    reference = {t: f"reference {i}" for i, pair in enumerate(TOPICS) for t in pair}
    reference.update({t: "reference 0" for t in TOPICS[2]})
    fake.default = Competent(reference)
    before = sorted(head_contents(eng.root))
    out = run(eng, verdict(organize=True))
    assert out.status == "accepted", out.reasons
    assert sorted(head_contents(eng.root)) == before  # nothing lost
    clusters = list(eng.state.clusters.values())
    assert groups_of(clusters) == grouped(reference.items())  # the model's grouping
    names = [c.name for c in clusters]
    assert not any(n.startswith("reference") for n in names), names  # not the model's names
    assert len({n.casefold() for n in names}) == len(names) == len(TOPICS) - 1
    assert all(c.description.endswith(".") and c.tags for c in clusters)
    assert any("may not name" in r and "lexical names" in r for r in out.reasons), out.reasons


def test_lexical_grouping_model_names(eng: Engine, fake: FakeOllama) -> None:
    fake.default = profiles
    before = sorted(head_contents(eng.root))
    mems = [m for ms in eng.state.unsorted.values() for m in ms]
    lexical = organize(mems, [], eng.config.session)
    out = run(eng, verdict(name=True))
    assert out.status == "accepted", out.reasons
    assert sorted(head_contents(eng.root)) == before  # nothing lost
    clusters = list(eng.state.clusters.values())
    # the lexical organizer's grouping, exactly
    groups = groups_of(clusters)
    contents = {m.id: m.content for m in mems}
    assert groups == grouped((contents[mid], ref) for mid, ref in lexical.assign.items())
    assert len(groups) == len(TOPICS)
    # the model's profiles, in batched calls (no plan call: the model does not group)
    assert all(c.name.startswith("model named ") for c in clusters), [c.name for c in clusters]
    assert all(c.description.startswith("Everything about") and "model" in c.tags for c in clusters)
    asked = fake.chats
    assert len(asked) == -(-len(TOPICS) // BATCH) and all(
        "groups" in r["format"]["properties"] for r in asked
    )
    assert out.named == len(TOPICS) and out.naming_seconds > 0 and out.calls == len(asked)
    note = next(r for r in out.reasons if "named" in r)
    assert f"named {len(TOPICS)} of {len(TOPICS)} clusters in {len(asked)} calls" in note
    assert "s per cluster" in note
    body = git(eng.root, "log", "-1", "--format=%B")
    assert "Clagd-Naming: model" in body and "lexical, ollama names" in body


def test_a_slow_or_bad_namer_leaves_the_lexical_names(eng: Engine, fake: FakeOllama) -> None:
    eng.config.session.naming_timeout = 1.0
    mems = [m for ms in eng.state.unsorted.values() for m in ms]
    lexical = {pc.name for pc in organize(mems, [], eng.config.session).clusters}

    def slow_then_bad(req: dict[str, Any]) -> dict[str, Any]:
        if len(fake.chats) == 1:
            return {**profiles(req), "delay": 3.0}  # past the timeout
        answer = profiles(req)
        for p in answer["content"]["groups"].values():
            p["name"] = "x"  # one word: not a name
        return answer

    fake.default = slow_then_bad
    out = run(eng, verdict(name=True))
    assert out.status == "accepted", out.reasons
    assert {c.name for c in eng.state.clusters.values()} == lexical
    assert out.named == 0 and any("naming:" in r for r in out.reasons)


def test_the_naming_deadline_stops_asking(eng: Engine, fake: FakeOllama) -> None:
    eng.config.session.naming_seconds = 0.5
    fake.default = lambda req: {**profiles(req), "delay": 0.8}
    out = run(eng, verdict(name=True))
    assert out.status == "accepted", out.reasons
    assert len(fake.chats) == 1  # the second batch was not asked
    assert any("deadline" in r for r in out.reasons)
    named = [c for c in eng.state.clusters.values() if c.name.startswith("model named")]
    assert len(named) == BATCH and out.named == BATCH  # the first batch, in time


def test_a_naming_call_shows_one_scopes_memories(store: Path, fake: FakeOllama) -> None:
    """Issue 24: clusters never mix scopes, their names included. The naming calls are
    batched per scope, so no call shows the model two users' memories: a name it writes
    for Alice's cluster cannot carry a word of Bob's."""
    e = Engine(store)
    try:
        e.config.backend.kind = "ollama"
        e.config.backend.ollama.host = fake.url
        e.config.backend.ollama.timeout = 5.0
        for who in ("alice", "bob"):
            e.add(
                [
                    {"content": f"{who}: {t}", "created_at": f"2025-03-{d + 1:02d}T10:0{j}:00Z"}
                    for d, pair in enumerate(TOPICS[:3])
                    for j, t in enumerate(pair)
                ],
                scope=who,
            )
        fake.default = profiles
        out = run(e, verdict(name=True))
        assert out.status == "accepted", out.reasons
        asked = [r["messages"][-1]["content"] for r in fake.chats]
        assert len(asked) == 2  # 3 clusters each, one call per scope (BATCH 4)
        for text in asked:
            owners = {w for w in ("alice", "bob") if f"- {w}:" in text}
            assert len(owners) == 1, text
        for c in e.state.clusters.values():
            assert {m.scope for m in c.memories} == {c.scope}
            assert c.name.startswith("model named"), c.name
    finally:
        e.close()


def test_a_model_measured_only_as_a_namer_names_the_lexical_clusters(
    eng: Engine, fake: FakeOllama
) -> None:
    """`backend.gate.tasks: name` (how the 1.5B model was measured for issue 27): the gate
    makes only its naming calls, allows naming, and a session through the engine takes
    the lexical grouping with the model's profiles; `status` counts the clusters it named
    (the eval reports them as `organization.named`)."""
    competent = Competent()

    def answer(req: dict[str, Any]) -> dict[str, Any]:
        props = (req.get("format") or {}).get("properties", {})
        session = any(t in str(req) for pair in TOPICS for t in pair)  # not the gate's scenes
        return profiles(req) if "groups" in props and session else competent(req)

    fake.default = answer
    eng.config.backend.gate.tasks = "name"
    out = eng.recluster("manual")
    assert out.status == "accepted", out.reasons
    assert not any(r.get("format", {}).get("properties", {}).get("assign") for r in fake.chats)
    assert out.named == len(TOPICS), out.reasons
    assert all(c.name.startswith("model named ") for c in eng.state.clusters.values())
    assert eng.status().counters["named"] == len(TOPICS)


def answering(name_for: Any) -> Any:
    """A naming answer that names each group `name_for(first memory, request)` (None: as
    `profiles` does), the rest of the profile as `profiles` writes it."""

    def answer(req: dict[str, Any]) -> dict[str, Any]:
        out = profiles(req)
        firsts = re.findall(r"^(G\d+) \(.*\n- (.*)$", req["messages"][-1]["content"], re.M)
        for key, first in firsts:
            name = name_for(first, req)
            if name is not None:
                out["content"]["groups"][key]["name"] = name
        return out

    return answer


def test_a_namer_that_copies_the_prompts_example_answer_still_names_every_group(
    eng: Engine, fake: FakeOllama
) -> None:
    """Issue 27's cause: the naming prompt showed `"name": "two to five words"`, and
    Qwen2.5-Coder-1.5B wrote exactly that for every group of most calls (LoCoMo
    conversation 1: 9 of 52 clusters named, the first copy among them). This model copies
    the name the prompt's example answer shows, as it did; the prompt shows none."""

    def copied(_first: str, req: dict[str, Any]) -> str | None:
        shown = re.search(r'"name": "([^"]+)"', req["messages"][0]["content"])
        return shown.group(1) if shown else None

    fake.default = answering(copied)
    out = run(eng, verdict(name=True))
    assert out.status == "accepted", out.reasons
    names = [c.name for c in eng.state.clusters.values()]
    assert all(n.startswith("model named ") for n in names), names
    assert out.named == out.naming_asked == len(TOPICS) and out.naming_rejected == 0


def lexical_names(eng: Engine) -> dict[str, str]:
    """Each unsorted memory's text -> the name the lexical organizer gives its cluster."""
    mems = [m for ms in eng.state.unsorted.values() for m in ms]
    plan = organize(mems, [], eng.config.session)
    names = {pc.ref: pc.name for pc in plan.clusters}
    return {m.content: names[plan.assign[m.id]] for m in mems}


def model_name(first: str) -> str:
    """The name `profiles` gives a group whose first memory is `first`."""
    return f"model named {max(re.findall(r'[A-Za-z]+', first), key=len)}"


def test_copied_and_taken_names_are_rejected_and_the_session_says_why(
    eng: Engine, fake: FakeOllama
) -> None:
    """A name made of the prompt's own words, and one another group already has, are not
    used (those clusters keep the lexical profile); the session's outcome says how many
    groups were asked, named and rejected, and why."""
    lexical = lexical_names(eng)

    def bad(first: str, req: dict[str, Any]) -> str | None:
        if first == TOPICS[1][0]:  # the instructions' first words
            return " ".join(re.findall(r"[A-Za-z']+", req["messages"][0]["content"])[1:4])
        if first == TOPICS[4][0]:  # the name of another group, asked in an earlier call
            return model_name(TOPICS[3][0])
        return None

    fake.default = answering(bad)
    out = run(eng, verdict(name=True))
    assert out.status == "accepted", out.reasons
    by_text = {m.content: c.name for c in eng.state.clusters.values() for m in c.memories}
    for i, pair in enumerate(TOPICS):
        want = lexical[pair[0]] if i in (1, 4) else model_name(pair[0])
        assert by_text[pair[0]] == want, (i, by_text)
    assert (out.naming_asked, out.named, out.naming_rejected) == (len(TOPICS), 4, 2)
    why = out.naming_reasons
    assert len(why) == 2 and "copies the prompt" in why[0] and "is taken" in why[1], why
    assert any("naming rejected: name" in r for r in out.reasons), out.reasons
    assert any("2 answers rejected" in r for r in out.reasons), out.reasons


def test_a_name_a_rejection_leaves_to_a_cluster_is_not_given_twice(
    eng: Engine, fake: FakeOllama
) -> None:
    """A group whose name is not used keeps its lexical name; a model's name equal to that
    one is not used either, and so on down the chain: the plan never names two clusters
    alike (before, the last link made the writer refuse the plan, and the session fell
    back to the lexical names for every cluster)."""
    lexical = lexical_names(eng)
    chain = {
        TOPICS[1][0]: model_name(TOPICS[0][0]),  # taken: keeps its lexical name
        TOPICS[2][0]: lexical[TOPICS[1][0]],  # that one: keeps its own
        TOPICS[3][0]: lexical[TOPICS[2][0]],  # and that one
    }
    fake.default = answering(lambda first, _req: chain.get(first))
    out = run(eng, verdict(name=True))
    assert out.status == "accepted", out.reasons
    by_text = {m.content: c.name for c in eng.state.clusters.values() for m in c.memories}
    for i, pair in enumerate(TOPICS):
        want = lexical[pair[0]] if i in (1, 2, 3) else model_name(pair[0])
        assert by_text[pair[0]] == want, (i, by_text)
    assert (out.naming_asked, out.named, out.naming_rejected) == (len(TOPICS), 3, 3)
    assert sum("lexical name" in r for r in out.naming_reasons) == 2, out.naming_reasons
