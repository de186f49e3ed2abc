"""`get`, `list` and `where` against a real daemon over its Unix socket, through the
client: a filtered query fills its answer; bad input is refused naming what was typed."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner, Result
from helpers import InProcessDaemon

from clagd.cli import main
from clagd.client import Client, ClientError, MemoryList, MemoryRecord
from clagd.errors import ClagdError


def _fill(c: Client) -> None:
    web = [
        {"content": f"watered the garden tomatoes, round {i}", "metadata": {"source": "web"}}
        for i in range(20)
    ]
    chat = [
        {
            "content": f"the user asked about the garden fence, time {i}",
            "metadata": {"source": "chat", "user": "alice" if i % 2 else "bob"},
            "created_at": f"2026-01-0{i + 1}T10:00:00Z",
        }
        for i in range(6)
    ]
    c.add_many(web + chat)


def test_a_filtered_query_fills_its_answer_from_the_matches(daemon: InProcessDaemon) -> None:
    with daemon.client() as c:
        _fill(c)
        c.recluster()
        plain = c.query("garden", max_memories=4)
        assert {m.metadata["source"] for m in plain.memories} == {"web"}
        res = c.query("garden", max_memories=4, where={"source": "chat"})
        assert len(res.memories) == 4, res.context
        assert {m.metadata["source"] for m in res.memories} == {"chat"}
        both = c.query("garden fence", where={"source": "chat", "user": "alice"})
        assert len(both.memories) == 3
        assert {m.metadata["user"] for m in both.memories} == {"alice"}
        assert c.query("garden", where={"source": "mail"}).memories == []


def test_get_one_memory_and_its_errors(daemon: InProcessDaemon) -> None:
    with daemon.client() as c:
        _fill(c)
        hit = c.query("fence", max_memories=1).memories[0]
        got = c.get(hit.id)
        assert isinstance(got, MemoryRecord)
        assert (got.id, got.content, got.metadata) == (hit.id, hit.content, hit.metadata)
        assert got.cluster_id == hit.cluster_id and got.archived is False
        with pytest.raises(ClientError) as unknown:
            c.get("m-00000000000000ff")
        assert unknown.value.code == "not_found" and "m-00000000000000ff" in unknown.value.message
        with pytest.raises(ClientError) as bad:
            c.get("hello")
        assert bad.value.code == "bad_request" and "'hello'" in bad.value.message


def test_list_filters_orders_and_limits(daemon: InProcessDaemon) -> None:
    with daemon.client() as c:
        _fill(c)
        everything = c.list_memories(limit=1000)
        assert isinstance(everything, MemoryList) and everything.total == 26
        chat = c.list_memories(where={"source": "chat"}, limit=4)
        assert (chat.total, chat.limit, len(chat.memories)) == (6, 4, 4)
        assert [m.created_at[:10] for m in chat.memories] == [
            "2026-01-06",
            "2026-01-05",
            "2026-01-04",
            "2026-01-03",
        ]
        since = c.list_memories(where={"source": "chat"}, since="2026-01-05")
        assert [m.created_at[:10] for m in since.memories] == ["2026-01-06", "2026-01-05"]
        recent = c.list_memories(since="1h")  # the web notes were made just now
        assert recent.total == 20
        with pytest.raises(ClientError) as bad_since:
            c.list_memories(since="last tuesday")
        assert bad_since.value.code == "bad_request"
        assert "'last tuesday'" in bad_since.value.message
        with pytest.raises(ClientError) as bad_where:
            c.list_memories(where={"tags": ["a", "b"]})
        assert bad_where.value.code == "bad_request" and "'tags'" in bad_where.value.message
        with pytest.raises(ClientError) as bad_limit:
            c.list_memories(limit=0)
        assert "'limit'" in bad_limit.value.message


def _cli(daemon: InProcessDaemon, *args: str) -> Result:
    return CliRunner().invoke(main, ["--socket", str(daemon.socket), *args])


def test_cli_get_list_and_query_where(daemon: InProcessDaemon) -> None:
    with daemon.client() as c:
        _fill(c)
    listed = _cli(daemon, "list", "--where", "source=chat", "--where", "user=alice", "--json")
    assert listed.exit_code == 0, listed.output
    data = json.loads(listed.output)
    assert data["total"] == 3 and {m["metadata"]["user"] for m in data["memories"]} == {"alice"}
    text = _cli(daemon, "list", "--where", "source=chat", "-n", "2")
    assert text.exit_code == 0
    lines = text.output.splitlines()
    assert len(lines) == 3 and lines[-1] == "(2 of 6, newest first; --limit N for more)"
    first_id = lines[0].split()[0]
    assert "2026-01-06T10:00:00" in lines[0] and "garden fence, time 5" in lines[0]
    got = _cli(daemon, "get", first_id)
    assert got.exit_code == 0
    assert got.output.splitlines()[0] == first_id and "source=chat" in got.output
    q = _cli(daemon, "query", "garden", "-k", "3", "--where", "source=chat", "--json")
    assert {m["metadata"]["source"] for m in json.loads(q.output)["memories"]} == {"chat"}
    assert len(json.loads(q.output)["memories"]) == 3


def test_cli_bad_input_names_what_was_typed(daemon: InProcessDaemon) -> None:
    bad_where = _cli(daemon, "list", "--where", "sourcechat")
    assert bad_where.exit_code == 2 and "'sourcechat'" in bad_where.output
    assert "KEY=VALUE" in bad_where.output
    bad_q = _cli(daemon, "query", "x", "--where", "=chat")
    assert bad_q.exit_code == 2 and "'=chat'" in bad_q.output
    bad_since = _cli(daemon, "list", "--since", "yesterdayish")
    assert bad_since.exit_code == 2 and "'yesterdayish'" in bad_since.output
    unknown = _cli(daemon, "get", "m-00000000000000ff")
    assert unknown.exit_code == 1
    assert "m-00000000000000ff" in unknown.output and "no memory" in unknown.output
    typo = _cli(daemon, "get", "m-123")
    assert typo.exit_code == 1 and "'m-123' is not a memory id" in typo.output


def test_get_and_list_see_only_their_scopes(daemon: InProcessDaemon) -> None:
    with daemon.client() as c:
        alice = c.add("Alice is allergic to peanuts", metadata={"user": "alice"}, scope="alice")
        c.add("Bob is allergic to shellfish", metadata={"user": "alice"}, scope="bob")
        c.add_messages([{"role": "user", "content": "I live in Berlin"}], scope="alice")
        (mid,) = alice["ids"]
        assert c.get(mid, scope="alice").scope == "alice"
        for scope in ("bob", None):  # another scope's id is not found, as one never stored
            with pytest.raises(ClientError) as other:
                c.get(mid, scope=scope)
            assert other.value.code == "not_found" and mid in other.value.message
        assert c.get(mid, scope="bob", scopes=["alice"]).content == "Alice is allergic to peanuts"
        mine = c.list_memories(scope="alice")
        assert {m.content for m in mine.memories} == {
            "Alice is allergic to peanuts",
            "I live in Berlin",
        }
        assert {m.scope for m in mine.memories} == {"alice"}
        # a metadata route across scopes finds nothing: the filter works inside the scope
        assert c.list_memories(where={"user": "alice"}, scope="bob").memories[0].scope == "bob"
        assert c.list_memories().total == 0  # the default scope holds nothing
        both = c.query("allergic", scope="bob", where={"user": "alice"})
        assert [m.content for m in both.memories] == ["Bob is allergic to shellfish"]
        with pytest.raises(ClagdError) as bad:  # refused by the client before it is sent
            c.list_memories(scope="Not A Scope")
        assert bad.value.code == "bad_scope" and "'Not A Scope'" in str(bad.value)
        with pytest.raises(ClientError) as bad_extra:  # refused by the daemon
            c.list_memories(scopes=["Nope!"])
        assert bad_extra.value.code == "bad_scope" and "'Nope!'" in bad_extra.value.message


def test_list_leaves_out_superseded_memories_unless_asked(daemon: InProcessDaemon) -> None:
    with daemon.client() as c:
        (old,) = c.add("Alice lives in Berlin", metadata={"user": "alice"}).ids
        new = c.update(old, "Alice moved to Lisbon").id
        listed = c.list_memories()
        assert [m.id for m in listed.memories] == [new] and listed.total == 1
        both = c.list_memories(superseded=True)
        assert {m.id for m in both.memories} == {old, new}
        assert c.get(old).metadata["superseded_by"] == new  # get shows it, marked
    text = _cli(daemon, "list", "--superseded")
    assert text.exit_code == 0 and "Alice lives in Berlin" in text.output
    assert "Alice lives in Berlin" not in _cli(daemon, "list").output
