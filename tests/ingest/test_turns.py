"""Conversation turns in (`ingest.turns`): chat messages, from an inbox `.jsonl` or `.json`
file or `Client.add_messages`, become one memory per user turn (and per assistant turn
with `ingest.assistant_turns`), each with `role` and `speaker` metadata, against a real
daemon, its inbox and its socket; a malformed message rejects the file with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import InProcessDaemon, head_contents, make_store, wait_for

from clagd.client import ClientError
from clagd.errors import InboxRejected
from clagd.ingest.inbox import parse_text

CHAT = [
    {"role": "system", "content": "You are a helpful travel agent."},
    {
        "role": "user",
        "content": "I want to fly to Lisbon in May",
        "created_at": "2026-03-01T09:00:00Z",
    },
    {"role": "assistant", "content": "Lisbon in May is lovely. Window or aisle?"},
    {"role": "user", "name": "alice", "content": [{"type": "text", "text": "Window, always"}]},
]


def _drained(inbox: Path, *names: str) -> bool:
    return not any((inbox / n).exists() for n in names)


def test_parse_gives_turns_with_role_and_speaker() -> None:
    text = "\n".join(json.dumps(m) for m in CHAT) + "\n\n"
    items = parse_text("chat.jsonl", text)
    assert [i.role for i in items] == ["system", "user", "assistant", "user"]
    user = items[1]
    assert user.metadata == {"role": "user", "speaker": "user"}
    assert user.created_at == "2026-03-01T09:00:00Z"
    assert items[3].content == "Window, always" and items[3].metadata["speaker"] == "alice"
    conv = {"messages": CHAT[1:2], "metadata": {"session": "s1"}, "created_at": "2026-01-01"}
    (one,) = parse_text("conv.json", json.dumps(conv))
    assert one.metadata == {"session": "s1", "role": "user", "speaker": "user"}
    assert one.created_at == "2026-03-01T09:00:00Z"  # its own time wins over the shared one
    plain = parse_text("notes.jsonl", json.dumps({"content": "a plain memory"}))
    assert plain[0].role is None  # a line without a role is a memory as ever


@pytest.mark.parametrize(
    "name,text,reason",
    [
        ("a.jsonl", '{"role": "user", "content": "hi"}\n{nope', "bad JSON on line 2"),
        ("b.jsonl", '{"role": "robot", "content": "beep"}', "'role' must be one of"),
        ("c.json", '[{"role": "user"}]', "message 1: no 'content'"),
        ("d.json", '[{"role": "user", "content": [{"type": "image"}]}]', "no text part"),
        ("e.json", '{"messages": []}', "'messages' must be a non-empty list"),
        ("f.json", '{"messages": [{"role": "user", "content": "x"}], "user": 1}', "not 'user'"),
        ("g.jsonl", '{"role": "user", "content": "   "}', "'content' is empty"),
    ],
)
def test_malformed_messages_are_refused_with_the_reason(name: str, text: str, reason: str) -> None:
    with pytest.raises(InboxRejected, match=reason.replace("(", r"\(")):
        parse_text(name, text)


def test_inbox_turns_user_only_by_default_malformed_rejected(daemon: InProcessDaemon) -> None:
    inbox = daemon.root / "inbox"
    (inbox / "chat.jsonl").write_text("\n".join(json.dumps(m) for m in CHAT))
    (inbox / "bad.jsonl").write_text('{"role": "user", "content": "ok"}\n{"role": "bot"}\n')
    wait_for(
        lambda: _drained(inbox, "chat.jsonl") and (inbox / "rejected" / "bad.jsonl.error").exists(),
        what="the inbox to be drained",
    )
    assert sorted(head_contents(daemon.root)) == [
        "I want to fly to Lisbon in May",
        "Window, always",
    ]
    error = (inbox / "rejected" / "bad.jsonl.error").read_text()
    assert "message 2: 'role' must be one of user, assistant, system, tool" in error
    with daemon.client() as c:
        listed = c.list_memories(where={"role": "user", "speaker": "alice"})
    assert [m.content for m in listed.memories] == ["Window, always"]


def test_add_messages_through_the_client(daemon: InProcessDaemon) -> None:
    with daemon.client() as c:
        res = c.add_messages(CHAT, metadata={"conversation": "trip-1"})
        assert res["added"] == 2 and res["skipped"] == 2
        listed = c.list_memories(where={"conversation": "trip-1"})
        assert {m.metadata["role"] for m in listed.memories} == {"user"}
        again = c.add_messages(CHAT[1:2])
        assert again["added"] == 0 and again["duplicates"] == 1
        with pytest.raises(ClientError) as bad:
            c.add_messages([{"role": "user", "content": "fine"}, {"content": "no role"}])
        assert bad.value.code == "invalid_memory" and "message 2" in bad.value.message
        with pytest.raises(ClientError) as empty:
            c.add_messages([])
        assert empty.value.code == "bad_request"
    assert len(head_contents(daemon.root)) == 2  # the refused request stored nothing


def test_assistant_turns_are_stored_when_configured(tmp_path: Path, short_tmp: Path) -> None:
    store = make_store(tmp_path / "memory", {"ingest": {"assistant_turns": True}})
    d = InProcessDaemon(store, short_tmp / "s.sock")
    try:
        (store / "inbox" / "chat.json").write_text(json.dumps({"messages": CHAT}))
        wait_for(lambda: _drained(store / "inbox", "chat.json"), what="the inbox to be drained")
        with d.client() as c:
            turns = c.list_memories(where={"role": "assistant"})
        assert [m.content for m in turns.memories] == ["Lisbon in May is lovely. Window or aisle?"]
        assert turns.memories[0].metadata["speaker"] == "assistant"
        assert len(head_contents(store)) == 3  # the system turn is never stored
    finally:
        d.stop()
