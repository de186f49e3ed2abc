"""The inbox never stops: a file whose content makes any part fail is rejected with a reason
(the rest of its batch is stored), an environmental failure is retried with back-off and
shown in `status`, and a daemon with poison in its inbox is ready within seconds."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
from helpers import DaemonProcess, InProcessDaemon, head_contents, make_store, wait_for

from clagd.client import ClientError

DEEP = 1000

POISON = {
    "utf16.txt": "a memory saved as UTF-16".encode("utf-16-le"),
    "deep.yaml": ("content: x\nmetadata: " + "[" * DEEP + "]" * DEEP + "\n").encode(),
    "deepblock.yaml": (
        "content: x\nmetadata:\n"
        + "".join("  " * i + f"k{i}:\n" for i in range(1, 600))
        + "  " * 600
        + "v: 1\n"
    ).encode(),
    "deepfront.md": ("---\nx: " + "{a: " * DEEP + "1" + "}" * DEEP + "\n---\nbody\n").encode(),
    "bigint.yaml": ("content: big number\nmetadata: {n: " + "9" * 5000 + "}\n").encode(),
    "bigint.json": (
        '{"content": "big json number", "metadata": {"n": ' + "9" * 5000 + "}}"
    ).encode(),
    "late.yaml": b"content: far future\ncreated_at: 9999-12-31T23:59:59-14:00\n",
    "surrogate.json": b'{"content": "broken \\ud800 text"}',
    "nan.json": b'{"content": "not a number", "metadata": {"x": NaN}}',
    "nul.json": b'{"content": "nul \\u0000 inside"}',
}


def _drop_bytes(inbox: Path, name: str, data: bytes) -> None:
    tmp = inbox / ".tmp" / name
    tmp.write_bytes(data)
    os.rename(tmp, inbox / name)


def test_poison_files_are_rejected_and_their_batch_is_stored(daemon: InProcessDaemon) -> None:
    inbox = daemon.root / "inbox"
    for i in range(5):
        _drop_bytes(inbox, f"good{i}.txt", f"good memory number {i} beside poison".encode())
    for name, data in POISON.items():
        _drop_bytes(inbox, name, data)
    wait_for(lambda: not any(p.is_file() for p in inbox.iterdir()), 30, "the inbox to empty")
    rejected = daemon.root / "inbox" / "rejected"
    for name in POISON:
        err = rejected / f"{name}.error"
        assert err.exists(), name
        assert err.read_text().strip(), name
    contents = head_contents(daemon.root)
    for i in range(5):
        assert contents.count(f"good memory number {i} beside poison") == 1
    with daemon.client() as c:
        st = c.status()
        assert st["inbox"]["loop_errors"] == 0
        assert st["writer"]["alive"] and daemon.daemon.watcher.alive()
        # the loop still runs: a later file is ingested
        _drop_bytes(inbox, "after.txt", b"a memory after the poison")
        wait_for(lambda: not (inbox / "after.txt").exists(), 15, "a later file")


@pytest.mark.parametrize(
    "item,reason",
    [
        ({"content": "nul \u0000 inside"}, "NUL"),
        ({"content": "broken \ud800 text"}, "surrogate"),
        ({"content": "far future", "created_at": "9999-12-31T23:59:59-14:00"}, "out of range"),
        ({"content": "meta", "metadata": {"n": 10**30}}, "too large"),
    ],
)
def test_bad_add_gets_a_clear_error_not_internal(
    daemon: InProcessDaemon, item: dict, reason: str
) -> None:
    # sent as an agent would (ASCII JSON, \\u escapes): the client library itself
    # refuses to encode a lone surrogate
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(30)
        s.connect(str(daemon.socket))
        s.sendall(json.dumps({"id": 1, "op": "add", "items": [item]}).encode() + b"\n")
        reply = json.loads(s.makefile("rb").readline())
    assert not reply["ok"]
    assert reply["error"]["code"] == "invalid_memory", reply
    assert reason in reply["error"]["message"] and "git" not in reply["error"]["message"]
    with daemon.client() as c:
        assert c.add("still fine")["added"] == 1


def test_a_held_branch_lock_is_retried_and_shown(daemon: InProcessDaemon) -> None:
    root = daemon.root
    lock = root / ".git" / "refs" / "heads" / "main.lock"
    lock.write_text("")
    try:
        _drop_bytes(root / "inbox", "locked.txt", b"memory while the branch is locked")
        with daemon.client() as c:
            st = wait_for(lambda: (s := c.status())["inbox"]["failures"] > 0 and s, 15, "a failure")
            assert "main" in st["inbox"]["last_error"]
            assert (root / "inbox" / "locked.txt").exists()
    finally:
        lock.unlink()
    wait_for(lambda: not (root / "inbox" / "locked.txt").exists(), 40, "the retry")
    assert head_contents(root).count("memory while the branch is locked") == 1


def test_ready_within_seconds_with_poison_in_the_inbox(tmp_path: Path, short_tmp: Path) -> None:
    store = make_store(tmp_path / "memory")
    inbox = store / "inbox"
    for name, data in POISON.items():
        _drop_bytes(inbox, name, data)
    _drop_bytes(inbox, "good.txt", b"a good memory among the poison")
    p = DaemonProcess(store, short_tmp / "s.sock")
    t0 = time.monotonic()
    p.start()
    try:
        assert time.monotonic() - t0 < 15
        with p.client() as c:
            st = c.status()
        assert st["inbox"]["files_rejected"] == len(POISON)
        assert head_contents(store).count("a good memory among the poison") == 1
    finally:
        assert p.terminate() == 0


def test_nan_metadata_never_makes_a_reply_non_strict_json(daemon: InProcessDaemon) -> None:
    with daemon.client() as c:
        with pytest.raises(ClientError):
            c.add_many([{"content": "nan meta", "metadata": {"x": float("nan")}}])
        json.loads(json.dumps(c.status().raw), parse_constant=_refuse)


def _refuse(name: str) -> None:
    raise AssertionError(f"non-strict JSON constant {name}")
