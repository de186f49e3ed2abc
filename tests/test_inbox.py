from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from helpers import InProcessDaemon, git, head_contents, wait_for

from clagd.errors import InboxRejected
from clagd.inbox import ignored_name, parse_text, read_file


def test_formats() -> None:
    assert parse_text("a.txt", "  just text \n")[0].content == "just text"
    it = parse_text(
        "a.yaml",
        "content: hi\nmetadata: {importance: 0.9}\ncreated_at: 2024-05-01T10:00:00+02:00\n",
    )[0]
    assert (it.content, it.metadata, it.created_at) == (
        "hi",
        {"importance": 0.9},
        "2024-05-01T08:00:00Z",
    )
    items = parse_text("a.yml", "- content: one\n- content: two\n  task_type: chat\n")
    assert [i.content for i in items] == ["one", "two"] and items[1].metadata == {
        "task_type": "chat"
    }
    assert [
        i.content for i in parse_text("a.json", json.dumps([{"content": "x"}, {"content": "y"}]))
    ] == ["x", "y"]
    md = parse_text(
        "n.md", "---\nsource: notes\ncreated_at: 2024-01-02\n---\n# Title\n\nBody text\n"
    )[0]
    assert md.content == "# Title Body text" and md.metadata == {"source": "notes"}
    assert md.created_at == "2024-01-02T00:00:00Z"
    assert parse_text("plain.md", "no front matter")[0].content == "no front matter"


@pytest.mark.parametrize(
    "name,text,reason",
    [
        ("a.yaml", "content: [unclosed\n", "bad YAML"),
        ("a.json", "{nope", "bad JSON"),
        ("a.json", '{"metadata": {}}', "no 'content'"),
        ("a.json", '{"content": 42}', "must be a string"),
        ("a.yaml", "content: '   '\n", "empty"),
        ("a.yaml", "a: &x hello\ncontent: *x\n", "aliases"),
        ("a.json", "[]", "empty"),
        ("a.json", '[{"content": "ok"}, 3]', "item 2"),
        ("a.json", '{"content": "x", "metadata": [1]}', "'metadata' must be a mapping"),
        ("a.yaml", "content: x\ncreated_at: yesterday-ish\n", "created_at"),
        ("a.md", "---\nsource: x\nno end", "never ends"),
        ("a.csv", "content,x", "unsupported file type"),
        ("a.json", "[" * 5000 + "]" * 5000, "bad JSON"),
    ],
)
def test_rejections_say_why(name: str, text: str, reason: str) -> None:
    with pytest.raises(InboxRejected, match=reason):
        parse_text(name, text)


def test_size_and_encoding_limits(tmp_path: Path) -> None:
    big = tmp_path / "big.txt"
    big.write_text("x" * 2000)
    with pytest.raises(InboxRejected, match="over the limit"):
        read_file(big, 1000, 10)
    latin = tmp_path / "l.txt"
    latin.write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(InboxRejected, match="not UTF-8"):
        read_file(latin, 1000, 10)


def test_ignored_names() -> None:
    for n in (".hidden.yaml", "a.yaml.tmp", "a.part", "a.swp", "a.txt~"):
        assert ignored_name(n)
    assert not ignored_name("a.yaml")


def test_daemon_ingests_existing_and_new_files_and_rejects_bad(daemon: InProcessDaemon) -> None:
    inbox = daemon.root / "inbox"
    (inbox / "one.txt").write_text("The user's cat is called Miso")
    (inbox / "two.yaml").write_text("content: The user's cat is called Miso\n")  # a duplicate
    (inbox / "bad.json").write_text("{nope")
    (inbox / ".tmp" / "three.json").write_text(json.dumps({"content": "Renamed in, Maildir style"}))
    os.rename(inbox / ".tmp" / "three.json", inbox / "three.json")
    (inbox / "four.md.part").write_text("being written")
    wait_for(
        lambda: (
            not (inbox / "one.txt").exists()
            and not (inbox / "three.json").exists()
            and not (inbox / "two.yaml").exists()
            and (inbox / "rejected" / "bad.json.error").exists()
        ),
        what="inbox drained",
    )
    contents = head_contents(daemon.root)
    assert sorted(contents) == ["Renamed in, Maildir style", "The user's cat is called Miso"]
    assert (inbox / "rejected" / "bad.json").read_text() == "{nope"
    assert "bad JSON" in (inbox / "rejected" / "bad.json.error").read_text()
    assert (inbox / "four.md.part").exists()  # ignored names are left alone
    log = git(daemon.root, "log", "--format=%B")
    assert "Clagd-Kind: ingest" in log and "Clagd-Batch: b-" in log


def test_file_written_in_place_slowly_is_read_only_when_complete(daemon: InProcessDaemon) -> None:
    inbox = daemon.root / "inbox"
    path = inbox / "slow.json"
    text = inbox / "slow.txt"
    with open(path, "w") as fh, open(text, "w") as th:
        fh.write('{"content": "written ')
        fh.flush()
        for i in range(4):
            # A slow writer (the point of this test, so a real pause): the JSON file is
            # incomplete and stays so for longer than settle_seconds; the text file gets
            # a write more often than that. Neither may be read or rejected meanwhile.
            for _ in range(5):
                time.sleep(0.1)
                th.write(f"text part {i} ")
                th.flush()
            fh.write(f"slowly part {i} ")
            fh.flush()
            assert path.exists() and not (inbox / "rejected" / "slow.json").exists()
            assert text.exists()
        fh.write('over seconds"}')
    wait_for(lambda: not path.exists() and not text.exists(), what="slow files ingested")
    assert sorted(head_contents(daemon.root)) == [
        " ".join(f"text part {i}" for i in range(4) for _ in range(5)),
        "written slowly part 0 slowly part 1 slowly part 2 slowly part 3 over seconds",
    ]
    assert not (inbox / "rejected" / "slow.json").exists()
