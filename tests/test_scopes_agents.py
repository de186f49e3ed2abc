"""Two users, one agent, one store: a replayed agent loop and an adversary, against a real
daemon (`clagd run` as a process) on its real socket, with real inbox files and a real MCP
server over stdio. Every memory a user is shown must be hers: one cross-scope hit fails."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO, DaemonProcess, wait_for

from clagd.client import Client, ClientError
from clagd.store.files import load_state

USERS = ("alice", "bob")
# (user, kind, text): kind "fact" stores it (socket), "file" drops it into inbox/<user>/,
# "chat" hands a transcript to add_messages, "ask" queries; "update" replaces the user's
# memory holding the first text with the second; "session" runs a clustering session
LOOP: list[tuple[str, str, str]] = [
    ("alice", "fact", "I am allergic to peanuts"),
    ("bob", "fact", "I am allergic to shellfish and peanuts"),
    ("alice", "fact", "I live in Berlin"),
    ("bob", "fact", "I live in Berlin"),  # the same text in another scope: another memory
    ("alice", "ask", "Am I allergic to anything?"),
    ("bob", "ask", "Am I allergic to anything?"),
    ("alice", "file", "My daughter Mia plays the violin on Tuesdays"),
    ("bob", "file", "My son Leo plays football on Tuesdays"),
    ("alice", "chat", "I started a new job as a nurse at the Charite hospital"),
    ("bob", "chat", "I started a new job as a baker near the hospital"),
    ("alice", "ask", "What does my child do on Tuesdays?"),
    ("bob", "ask", "What does my child do on Tuesdays?"),
    ("alice", "fact", "My phone number is 0151 111 2222"),
    ("bob", "fact", "My phone number is 0171 333 4444"),
    ("alice", "ask", "What is my phone number?"),
    ("bob", "ask", "Where do I work?"),
    ("alice", "session", ""),
    ("alice", "update", "I live in Berlin|I live in Lisbon now, no longer in Berlin"),
    ("alice", "ask", "Where do I live now?"),
    ("bob", "ask", "Where do I live now?"),
    ("bob", "fact", "My favourite food is pad thai, without peanuts"),
    ("alice", "fact", "My favourite food is pasta with pesto"),
    ("alice", "ask", "What food do I like and what must I avoid?"),
    ("bob", "ask", "What food do I like and what must I avoid?"),
    ("bob", "session", ""),
    ("alice", "ask", "Tell me about my family, my job and my home"),
    ("bob", "ask", "Tell me about my family, my job and my home"),
    ("alice", "forget", "My phone number is 0151 111 2222"),
    ("alice", "ask", "What is my phone number?"),
    ("bob", "ask", "What is my phone number?"),
]


@pytest.fixture
def running(daemon_proc: DaemonProcess) -> Iterator[DaemonProcess]:
    yield daemon_proc.start()


def _drop(root: Path, user: str, name: str, text: str) -> None:
    """An inbox file Maildir-style: written in inbox/.tmp/, renamed into inbox/<user>/."""
    folder = root / "inbox" / user
    folder.mkdir(exist_ok=True)
    tmp = root / "inbox" / ".tmp" / f"{user}-{name}"
    tmp.write_text(text + "\n", encoding="utf-8")
    os.rename(tmp, folder / name)


class Loop:
    """The replay: what each user stored (by id), and every cross-scope hit seen."""

    def __init__(self, d: DaemonProcess, c: Client) -> None:
        self.d, self.c = d, c
        self.owned: dict[str, set[str]] = {u: set() for u in USERS}
        self.texts: dict[tuple[str, str], str] = {}  # (user, text) -> id
        self.crossed: list[str] = []
        self.asked = 0
        self.shown = 0  # memories the questions returned, every one checked
        self.forgotten: set[str] = set()

    def step(self, i: int, user: str, kind: str, text: str) -> None:
        getattr(self, kind)(i, user, text)

    def fact(self, _i: int, user: str, text: str) -> None:
        res = self.c.add(text, metadata={"user_id": user}, scope=user)
        self._own(user, text, (res["ids"] or res["duplicate_ids"])[0])

    def file(self, i: int, user: str, text: str) -> None:
        _drop(self.d.root, user, f"note-{i}.md", text)
        wait_for(lambda: self._find(user, text), 20, f"{user}'s inbox file to be served")

    def chat(self, _i: int, user: str, text: str) -> None:
        msgs = [{"role": "user", "content": text}, {"role": "assistant", "content": "Noted!"}]
        self.c.add_messages(msgs, scope=user)
        wait_for(lambda: self._find(user, text), 20, f"{user}'s chat turn")

    def ask(self, _i: int, user: str, text: str) -> None:
        self.asked += 1
        res = self.c.query(text, max_memories=20, scope=user)
        self.shown += len(res.memories)
        for h in res.memories:
            if h.scope != user or h.id not in self.owned[user]:
                self.crossed.append(f"{user} asked {text!r}, got {h.scope}'s {h.content!r}")
        for cs in res.clusters:
            if cs.id not in self._clusters_of(user):
                self.crossed.append(f"{user} asked {text!r}, got cluster {cs.name!r}")

    def session(self, _i: int, _user: str, _text: str) -> None:
        self.c.recluster()
        for cl in load_state(self.d.root).clusters.values():
            assert {m.scope for m in cl.memories} == {cl.scope}, cl.name

    def update(self, _i: int, user: str, text: str) -> None:
        old, new = text.split("|")
        res = self.c.update(self.texts[(user, old)], new, scope=user)
        self._own(user, new, res.id)

    def forget(self, _i: int, user: str, text: str) -> None:
        mid = self.texts[(user, text)]
        assert self.c.forget([mid], scope=user).forgotten == [mid]
        self.owned[user].discard(mid)
        self.forgotten.add(mid)

    def _own(self, user: str, text: str, mid: str) -> None:
        self.owned[user].add(mid)
        self.texts[(user, text)] = mid

    def _find(self, user: str, text: str) -> bool:
        for m in self.c.list_memories(limit=1000, scope=user).memories:
            if m.content == text:
                self._own(user, text, m.id)
                return True
        return False

    def _clusters_of(self, user: str) -> set[str]:
        return {c["id"] for c in self.c.clusters(True, scope=user)["clusters"]}


def test_a_two_user_agent_loop_never_crosses_scopes(running: DaemonProcess) -> None:
    with running.client(timeout=120) as c:
        loop = Loop(running, c)
        for i, (user, kind, text) in enumerate(LOOP):
            loop.step(i, user, kind, text)
        assert loop.asked >= 14 and loop.shown > 0
        print(
            f"two-user loop: {len(LOOP)} steps, {loop.asked} questions, {loop.shown} memories "
            f"shown, {len(loop.crossed)} cross-scope hits"
        )
        assert loop.crossed == [], "\n".join(loop.crossed)
        # both users' Berlin memories were separate; Alice's is superseded, Bob's is not
        assert loop.texts[("alice", "I live in Berlin")] != loop.texts[("bob", "I live in Berlin")]
        bob_home = [h.content for h in c.query("Where do I live?", scope="bob").memories]
        assert "I live in Berlin" in bob_home
        alice_home = [h.content for h in c.query("Where do I live?", scope="alice").memories]
        assert "I live in Lisbon now, no longer in Berlin" in alice_home
        assert "I live in Berlin" not in alice_home  # superseded: hers, and left out
        # every user's memories are where they belong, on disk too; the forgotten one is gone
        stored = load_state(running.root)
        for m, _area, _key in stored.all_memories():
            assert m.id in loop.owned[m.scope] or m.metadata.get("superseded_by"), m
        assert loop.forgotten and not loop.forgotten & {m.id for m, _a, _k in stored.all_memories()}
        assert "0151" not in " ".join(h.content for h in c.query("phone", scope="alice").memories)
        status = c.status()["counts"]["scopes"]
        assert set(status) == {"alice", "bob"}


def test_an_adversary_cannot_cross_scopes(running: DaemonProcess) -> None:
    with running.client(timeout=120) as c:
        secret = c.add(
            "Alice's bank PIN is 4321",
            metadata={"user_id": "bob", "source": "chat"},  # metadata claiming to be bob's
            scope="alice",
        )["ids"][0]
        c.add_many(
            [{"content": f"Alice's bank account note {i}: PIN 4321"} for i in range(4)],
            scope="alice",
        )
        c.add("Bob's library card number is 77", scope="bob")
        c.recluster()
        alice_clusters = c.clusters(scope="alice")["clusters"]
        assert alice_clusters, "alice's memories were clustered"
        # metadata: a where on user_id=bob sees bob's scope only
        got = c.query("bank PIN", scope="bob", where={"user_id": "bob"})
        assert got.memories == []
        assert c.list_memories(where={"user_id": "bob"}, scope="bob").total == 0
        # cluster names: asking with alice's cluster's own words finds none of hers
        for cl in alice_clusters:
            res = c.query(f"{cl['name']} {cl['description']}", scope="bob", max_memories=20)
            assert all(h.scope == "bob" for h in res.memories)
            assert all(x.id not in {a["id"] for a in alice_clusters} for x in res.clusters)
        assert not {x["id"] for x in c.clusters(scope="bob")["clusters"]} & {
            a["id"] for a in alice_clusters
        }
        # ids: get, update and a scoped revert of alice's memory and commit, as bob
        for call in (
            lambda: c.get(secret, scope="bob"),
            lambda: c.update(secret, "Alice's PIN is 0000", scope="bob"),
        ):
            with pytest.raises(ClientError) as refused:
                call()
            assert refused.value.code == "not_found"
        alice_commit = c.log(50, scope="alice")["entries"][-1]["commit"]
        with pytest.raises(ClientError) as refused:
            c.revert(alice_commit, scope="bob")
        assert refused.value.code == "bad_scope"
        # a request naming a made-up or hostile scope is refused, not defaulted
        for hostile in ("../alice", "Alice", "alice bob", ""):
            if hostile:
                with pytest.raises(ClientError) as bad:
                    c.request("query", {"text": "PIN", "scope": hostile})
                assert bad.value.code == "bad_scope"
    # explicit cluster ids, as the SLM refinement passes them: ignored for another scope
    from clagd.engine.core import Engine

    eng = Engine(running.root)
    try:
        ix = eng.index
        res = ix.search("bank PIN 4321", clusters=[a["id"] for a in alice_clusters], scopes={"bob"})
        assert res.memories == [] and res.clusters == []
        assert ix.cluster_candidates("bank PIN", 10, {"bob"}) == []
    finally:
        eng.close()


def test_a_pinned_mcp_server_cannot_reach_another_scope(running: DaemonProcess) -> None:
    pytest.importorskip("mcp", reason="the MCP SDK is not installed (pip install '.[mcp]')")
    import anyio
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    with running.client() as c:
        bob_id = c.add("Bob's locker code is 1234", scope="bob")["ids"][0]
        bob_commit = c.log(1, scope="bob")["entries"][0]["commit"]
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "clagd.mcp_server", "--socket", str(running.socket), "--scope", "alice"],
        env={"PYTHONPATH": str(REPO)},
        cwd=str(REPO),
    )

    async def body(s: ClientSession) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out["remember"] = await s.call_tool("remember", {"content": "Alice's locker is 9"})
        out["remember_bob"] = await s.call_tool("remember", {"content": "planted", "scope": "bob"})
        out["recall"] = await s.call_tool("recall", {"query": "locker code"})
        out["recall_bob"] = await s.call_tool("recall", {"query": "locker", "scope": "bob"})
        out["get_bob"] = await s.call_tool("get", {"id": bob_id})
        out["list"] = await s.call_tool("list", {})
        out["history"] = await s.call_tool("memory_history", {"n": 50})
        out["revert_bob"] = await s.call_tool("revert", {"ref": bob_commit})
        out["clusters"] = await s.call_tool("list_clusters", {})
        out["forget_bob"] = await s.call_tool("forget", {"ids": [bob_id]})
        out["forget_match"] = await s.call_tool("forget", {"match": "locker code is 1234"})
        out["forget_scope"] = await s.call_tool("forget", {"match": "locker", "scope": "bob"})
        out["update_bob"] = await s.call_tool("update", {"memory_id": bob_id, "content": "x"})
        return out

    async def main() -> dict[str, Any]:
        with open(running.root.parent / "mcp.err", "w") as err:
            async with (
                stdio_client(params, errlog=err) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                with anyio.fail_after(60):
                    return await body(session)

    out = anyio.run(main)
    assert not out["remember"].is_error
    for refused in ("remember_bob", "recall_bob"):
        assert out[refused].is_error
        text = out[refused].content[0].text
        assert "pinned to scope 'alice'" in text and "'bob'" in text
    recalled = out["recall"].structured_content["memories"]
    assert [m["content"] for m in recalled] == ["Alice's locker is 9"]
    assert out["get_bob"].is_error and "not_found" in out["get_bob"].content[0].text
    assert [m["scope"] for m in out["list"].structured_content["memories"]] == ["alice"]
    history = out["history"].structured_content["entries"]
    assert bob_commit not in {e["commit"] for e in history}
    assert out["revert_bob"].is_error and "bad_scope" in out["revert_bob"].content[0].text
    for refused in ("forget_bob", "forget_match", "update_bob"):  # as if it did not exist
        assert out[refused].is_error and "not_found" in out[refused].content[0].text, refused
    assert out["forget_scope"].is_error
    assert "pinned to scope 'alice'" in out["forget_scope"].content[0].text
    with running.client() as c:
        assert c.get(bob_id, scope="bob").content == "Bob's locker code is 1234"
        assert c.query("planted", scope="bob").memories == []
    assert json.dumps(out["clusters"].structured_content).count("bob") == 0
