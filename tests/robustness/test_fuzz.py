"""Fuzzing the two doors into the daemon: inbox files (hypothesis against the parser, then a
smaller set through a real daemon) and the socket (garbage, truncation, huge lines, slow and
vanishing clients, 200 at once) with the daemon's memory watched."""

from __future__ import annotations

import json
import os
import random
import socket
import threading
import time
from pathlib import Path

import pytest
from helpers import DaemonProcess, InProcessDaemon, head_contents, make_store, wait_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clagd.client import Client
from clagd.errors import InboxRejected
from clagd.ingest.inbox import SUFFIXES, Item, parse_text, read_file

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
SUFFIX = st.sampled_from(sorted(SUFFIXES) + [".bin", ""])

json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=40)
)
json_value = st.recursive(
    json_leaf,
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4)
    ),
    max_leaves=25,
)


def _check(result_or_exc: object) -> None:
    if isinstance(result_or_exc, list):
        assert result_or_exc and all(isinstance(i, Item) for i in result_or_exc)
        for it in result_or_exc:
            assert it.content.strip() and isinstance(it.metadata, dict)
            json.dumps(it.metadata)  # plain data only


def _parse(name: str, text: str) -> object:
    try:
        return parse_text(name, text, max_items=1000)
    except InboxRejected as exc:
        assert str(exc)  # a reason, always
        return exc


# -- the parser, many examples ------------------------------------------------------------


@FUZZ
@given(data=st.binary(max_size=4096), suffix=SUFFIX)
def test_random_bytes_are_parsed_or_rejected(tmp_path: Path, data: bytes, suffix: str) -> None:
    p = tmp_path / f"f{suffix}"
    p.write_bytes(data)
    try:
        _check(read_file(p, 1_048_576, 1000))
    except InboxRejected as exc:
        assert str(exc)


@FUZZ
@given(text=st.text(max_size=2000), suffix=SUFFIX)
def test_random_text_is_parsed_or_rejected(text: str, suffix: str) -> None:
    _check(_parse(f"x{suffix}", text))


@FUZZ
@given(value=json_value, wrap=st.booleans())
def test_wrong_types_are_rejected_with_a_reason(value: object, wrap: bool) -> None:
    doc = {"content": value} if wrap else value
    for name, text in (("a.json", json.dumps(doc)), ("a.yaml", json.dumps(doc))):
        _check(_parse(name, text))


@FUZZ
@given(
    depth=st.integers(1, 20_000),
    kind=st.sampled_from(["json_list", "json_obj", "yaml_flow", "yaml_block", "md_front"]),
)
def test_deep_nesting_never_crashes(depth: int, kind: str) -> None:
    if kind == "json_list":
        name, text = (
            "a.json",
            '{"content": "x", "metadata": {"a": ' + "[" * depth + "]" * depth + "}}",
        )
    elif kind == "json_obj":
        name, text = (
            "a.json",
            '{"content": "x", "metadata": ' + '{"a": ' * depth + "1" + "}" * (depth + 1),
        )
    elif kind == "yaml_flow":
        name, text = "a.yaml", "content: x\nmetadata: " + "{a: " * depth + "1" + "}" * depth
    elif kind == "yaml_block":
        d = min(depth, 3000)
        name = "a.yaml"
        text = "content: x\nmetadata:\n" + "".join("  " * (i + 1) + "a:\n" for i in range(d))
        text += "  " * (d + 1) + "1\n"
    else:
        name, text = "a.md", "---\nmetadata: " + "[" * depth + "]" * depth + "\n---\nbody\n"
    res = _parse(name, text)
    if isinstance(res, list):
        assert depth <= 21 or kind == "md_front"  # metadata is bounded at 20 levels
    _check(res)


ALIAS_BOMB = """
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
content: *i
"""


@pytest.mark.parametrize("name", ["bomb.yaml", "bomb.yml"])
def test_alias_bomb_is_rejected_quickly(name: str) -> None:
    t0 = time.monotonic()
    with pytest.raises(InboxRejected, match="alias"):
        parse_text(name, ALIAS_BOMB)
    with pytest.raises(InboxRejected, match="alias"):
        parse_text("bomb.md", "---\n" + ALIAS_BOMB.replace("content:", "x:") + "---\nbody\n")
    assert time.monotonic() - t0 < 1.0


def test_huge_lines() -> None:
    line = "word " * 13_000  # 65,000 characters on one line: accepted
    assert parse_text("a.txt", line)[0].content == line.strip()
    with pytest.raises(InboxRejected, match="over the limit of 65536 per memory"):
        parse_text("a.txt", "x" * 70_000)
    with pytest.raises(InboxRejected):
        parse_text("a.yaml", "content: " + "y" * 70_000)


# -- a real daemon, fewer examples --------------------------------------------------------

ODD_NAMES = [
    "with spaces in it.txt",
    "ünïcødé-名前-🙂.txt",
    "a..b.txt",
    "..double-dot-start.txt",  # a dot name: ignored by the Maildir rule, stays
    "x" * 251 + ".txt",  # 255 bytes, the longest a name can be
    "é" * 125 + ".md",  # 254 bytes of UTF-8
    "semi;colon$(rm -rf x)`id`.txt",
    "-starts-with-dash.yaml",
    "new\nline.txt",
    "no-suffix",
    "UPPER.TXT",
]
BAD_CONTENTS = [
    b"\xff\xfe\x00garbage",
    ALIAS_BOMB.encode(),
    b'{"content": ' + b"[" * 5000,
    b"content: [1, 2]\n",
    b"",
    b"   \n\t\n",
    b"---\nno end of front matter\n",
]


def test_odd_files_through_a_real_daemon(tmp_path: Path, short_tmp: Path) -> None:
    store = make_store(tmp_path / "memory")
    d = InProcessDaemon(store, short_tmp / "s.sock")
    inbox = store / "inbox"
    rng = random.Random(5)
    good: dict[str, str] = {}
    try:
        for i, name in enumerate(ODD_NAMES):
            text = f"odd name memory {i} " + rng.choice(["alpha", "beta", "gamma"])
            body = (
                text
                if not name.endswith((".yaml", ".md"))
                else (
                    f"content: {text}\n"
                    if name.endswith(".yaml")
                    else f"---\ntags: [x]\n---\n{text}\n"
                )
            )
            (inbox / name).write_text(body, encoding="utf-8")
            good[name] = text
        for i, data in enumerate(BAD_CONTENTS):
            (inbox / f"bad-{i}.yaml").write_bytes(data)
        for i in range(20):  # random bytes under every suffix
            suffix = rng.choice(sorted(SUFFIXES))
            (inbox / f"rnd-{i}{suffix}").write_bytes(os.urandom(rng.randint(0, 300)))
        wait_for(
            lambda: {p.name for p in inbox.iterdir() if p.is_file()} <= {"..double-dot-start.txt"},
            30,
            "every file to be ingested or rejected",
        )
        rejected = {p.name for p in (inbox / "rejected").iterdir()}
        for name in [n for n in rejected if not n.endswith(".error")]:
            assert f"{name}.error" in rejected, name
            assert (inbox / "rejected" / f"{name}.error").read_text().strip()
        for i in range(len(BAD_CONTENTS)):
            assert f"bad-{i}.yaml" in rejected
        assert "no-suffix" in rejected and "UPPER.TXT" not in rejected
        have = set(head_contents(store))
        for name, text in good.items():
            if name in ("no-suffix", "..double-dot-start.txt"):
                continue
            assert text in have, name
        with d.client() as c:
            assert c.ping()["pong"]
        assert all(p.resolve().is_relative_to(store) for p in store.rglob("*"))
    finally:
        d.stop()


# -- the socket ---------------------------------------------------------------------------


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _send(path: Path, payload: bytes, timeout: float = 10) -> list[dict]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(str(path))
    try:
        s.sendall(payload)
    except (BrokenPipeError, ConnectionResetError):
        pass
    try:
        s.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    data = b""
    while True:
        try:
            chunk = s.recv(65536)
        except (TimeoutError, ConnectionResetError):
            break
        if not chunk:
            break
        data += chunk
    s.close()
    return [json.loads(line) for line in data.splitlines() if line.strip()]


@pytest.fixture
def proc(store: Path, short_tmp: Path):
    p = DaemonProcess(store, short_tmp / "s.sock").start()
    with p.client() as c:
        c.add_many([{"content": f"socket fuzz memory {i} about tea"} for i in range(50)])
    yield p
    if p.proc is not None and p.proc.poll() is None:
        p.kill()


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(payload=st.binary(max_size=512) | st.text(max_size=300).map(str.encode))
def test_random_bytes_get_error_replies(proc: DaemonProcess, payload: bytes) -> None:
    for reply in _send(proc.socket, payload.replace(b"\n", b" ") + b"\n"):
        assert set(reply) >= {"id", "ok"}
        if not reply["ok"]:
            assert reply["error"]["code"] and reply["error"]["message"]


def test_socket_abuse_leaves_other_clients_served(proc: DaemonProcess) -> None:
    assert proc.proc is not None
    pid = proc.proc.pid
    with proc.client() as c:
        c.query("tea")
    rss0 = _rss_kb(pid)
    good = json.dumps({"id": 1, "op": "query", "text": "tea"}).encode()
    # truncated JSON, then a valid request on the same connection
    replies = _send(proc.socket, good[:-5] + b"\n" + good + b"\n")
    assert replies[0]["error"]["code"] == "bad_json" and replies[1]["ok"] is True
    # wrong shapes
    for bad in (b"[]", b"42", b'{"op": 7}', b'{"op": "nope"}', b'{"op": "query", "text": 5}'):
        (r,) = _send(proc.socket, bad + b"\n")
        assert r["ok"] is False and r["error"]["code"] in ("bad_request", "unknown_op"), r
    # a 4 MiB line (over the 1 MiB limit): refused, connection closed
    (r,) = _send(proc.socket, b'{"op": "ping", "pad": "' + b"x" * (4 << 20) + b'"}\n', 30)
    assert r["error"]["code"] == "too_large"
    # clients that connect and vanish, some half-way through a request
    for i in range(100):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(str(proc.socket))
        if i % 2:
            s.sendall(good[: i % len(good)])
        s.close()
    # a slow client (a byte every 0.2 s) while others are served
    slow_reply: list[dict] = []

    def slow() -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(30)
        s.connect(str(proc.socket))
        msg = b'{"id": 9, "op": "ping"}\n'
        for b in msg:
            s.sendall(bytes([b]))
            time.sleep(0.2)
        slow_reply.append(json.loads(s.makefile("rb").readline()))
        s.close()

    t = threading.Thread(target=slow)
    t.start()
    # 200 concurrent clients, each with a few queries
    errors: list[BaseException] = []
    latencies: list[float] = []

    def worker(k: int) -> None:
        try:
            with Client(proc.socket, timeout=60) as c:
                for _ in range(3):
                    t0 = time.monotonic()
                    assert c.query(f"tea memory {k % 50}").memories
                    latencies.append(time.monotonic() - t0)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(200)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors, errors[:3]
    assert len(latencies) == 600
    t.join(30)
    assert slow_reply and slow_reply[0]["ok"] and slow_reply[0]["id"] == 9
    with proc.client() as c:
        assert c.ping()["pong"] and c.status()["writer"]["alive"]
    rss1 = _rss_kb(pid)
    print(f"RSS {rss0} kB -> {rss1} kB")
    assert rss1 - rss0 < 150_000, f"RSS grew from {rss0} kB to {rss1} kB"
