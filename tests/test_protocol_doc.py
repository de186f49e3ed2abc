"""docs/protocol.md against a real daemon: every op sent over its Unix socket, each reply
checked field by field against the op's table (a field missing, of another type, or not in
the doc fails), and the error codes the code can send against the doc's list."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

from helpers import InProcessDaemon, git

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "protocol.md"
JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
    "array": (list,),
    "object": (dict,),
}
Rows = dict[str, tuple[set[str], bool]]


def _sections() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    name = ""
    for line in DOC.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^## (?:`(\w+)`|(Error codes))$", line)
        if m:
            name = m.group(1) or "errors"
            out[name] = []
        elif name and line.startswith("| `"):
            out[name].append(line)
    return out


def _rows(lines: list[str]) -> Rows:
    """Each row's field path: its JSON types and whether it may be absent."""
    rows: Rows = {}
    for line in lines:
        cells = [c.strip() for c in line.strip("|").split("|")]
        path, kind = cells[0].strip("`"), cells[1]
        optional = kind.endswith(", optional")
        types = {t.strip() for t in kind.removesuffix(", optional").split(" or ")}
        assert types <= set(JSON_TYPES), f"{path}: unknown type in {kind!r}"
        rows[path] = (types, optional)
    return rows


def _check(value: object, rows: Rows, prefix: str = "") -> None:
    """`value` (an object at `prefix`) against the rows under it, recursively."""
    assert isinstance(value, dict), f"{prefix or 'result'}: not an object"
    children = {p[len(prefix) :]: r for p, r in rows.items() if p.startswith(prefix)}
    own = {k: r for k, r in children.items() if "." not in k and "[]" not in k}
    if not own:
        return  # free keys
    extra = set(value) - set(own)
    assert not extra, f"{prefix or 'result'}: fields not in docs/protocol.md: {sorted(extra)}"
    for key, (types, optional) in own.items():
        path = prefix + key
        if key not in value:
            assert optional, f"{path}: missing from the reply"
            continue
        v = value[key]
        ok = any(
            isinstance(v, JSON_TYPES[t]) and not (t in ("integer", "number") and v is True)
            for t in types
        )
        assert ok and not (isinstance(v, bool) and "boolean" not in types), (
            f"{path}: {v!r} is not {' or '.join(sorted(types))}"
        )
        if isinstance(v, dict):
            _check(v, rows, path + ".")
        elif isinstance(v, list):
            for item in v:
                if any(p.startswith(path + "[].") for p in rows):
                    _check(item, rows, path + "[].")


class Conn:
    """One connection to the daemon: a request line out, a reply line back."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(120)
        self.sock.connect(str(path))
        self.file = self.sock.makefile("rb")
        self.n = 0

    def send(self, line: bytes) -> dict:
        self.sock.sendall(line + b"\n")
        reply = json.loads(self.file.readline())
        assert isinstance(reply, dict)
        return reply

    def call(self, op: str, **params: object) -> dict:
        self.n += 1
        reply = self.send(json.dumps({"id": self.n, "op": op, **params}).encode())
        assert reply["id"] == self.n and reply["ok"] is True, reply
        assert set(reply) == {"id", "ok", "result"}
        result = reply["result"]
        assert isinstance(result, dict)
        return result

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def test_every_op_replies_as_the_doc_says(daemon: InProcessDaemon) -> None:
    tables = {op: _rows(lines) for op, lines in _sections().items() if op != "errors"}
    server = daemon.daemon.server
    assert server is not None
    assert set(tables) == set(server.dispatcher.ops), "an op the doc does not list"
    c = Conn(daemon.socket)
    try:
        seen: dict[str, list[dict]] = {op: [] for op in tables}

        def call(op: str, **params: object) -> dict:
            out = c.call(op, **params)
            seen[op].append(out)
            return out

        call("ping")
        tea = call("add", content="Alice drinks green tea", metadata={"source": "chat"})
        call("update", memory_id=tea["ids"][0], content="Alice drinks mint tea")
        items = [{"content": f"a note about the garden, number {i}"} for i in range(4)]
        call("add", items=items)
        chat = [
            {"role": "user", "content": "I fly to Lisbon"},
            {"role": "assistant", "content": "ok"},
        ]
        call("add", messages=chat, metadata={"conversation": "c1"})
        found = call("query", text="what does alice drink", max_memories=3)
        call("query", text="what does alice drink", where={"source": "chat"})
        call("get", memory_id=found["memories"][0]["id"])
        call("list", where={"source": "chat"}, since="1h", limit=10)
        call("list", include_archive=True)
        call("query", text="what does alice drink", superseded=True)
        call("round", n=2)
        call("recluster", backend="none", scope="alice")  # nothing of alice's: a noop
        session = call("recluster", backend="none")
        call("clusters", include_archive=True)
        call("log", n=5)
        assert session["commits"], session
        call("revert", ref=session["session_id"])
        call("add", content="The user's PIN is 4321")
        call("forget", match="pin is 4321")
        call("archive", dry_run=True)
        call("archive")
        call("recluster", wait=False)
        git(daemon.root, "checkout", "-q", "-b", "elsewhere")  # the person's git moves
        git(daemon.root, "checkout", "-q", "-")
        assert call("status", scope="default")["counts"]["scope"] == "default"
        status = call("status")
        assert status["last_session"] is not None and status["query_processes"]["processes"]
        for op, replies in seen.items():
            if op == "sync":
                continue  # a follower's op: tests/serve/test_follow.py checks its reply
            assert replies, f"{op} was not sent"
            for reply in replies:
                _check(reply, tables[op])
    finally:
        c.close()


def test_error_replies_have_the_doc_shape_and_codes(daemon: InProcessDaemon) -> None:
    codes = {line.split("|")[1].strip().strip("`") for line in _sections()["errors"]}
    c = Conn(daemon.socket)
    try:
        for line, code in (
            (b"{not json", "bad_json"),
            (b'{"id": 1, "op": "no_such_op"}', "unknown_op"),
            (b'{"id": 2, "op": "query", "text": ""}', "bad_request"),
            (b'{"id": 3, "op": "revert", "ref": "0123abcd"}', "not_found"),
            (b'{"id": 4, "op": "add", "content": ""}', "invalid_memory"),
            (b'{"id": 5, "op": "get", "memory_id": "m-0000000000000000"}', "not_found"),
            (b'{"id": 6, "op": "list", "since": "last tuesday"}', "bad_request"),
            (b'{"id": 7, "op": "query", "text": "x", "where": {"k": [1]}}', "bad_request"),
        ):
            reply = c.send(line)
            assert set(reply) == {"id", "ok", "error"} and reply["ok"] is False, reply
            assert set(reply["error"]) == {"code", "message"}, reply
            assert reply["error"]["code"] == code and code in codes, reply
    finally:
        c.close()


def test_every_error_code_a_reply_can_carry_is_in_the_doc() -> None:
    """The codes of the domain exceptions (a reply carries the code of what an op raised)
    and those the socket layer sends itself."""
    documented = {line.split("|")[1].strip().strip("`") for line in _sections()["errors"]}
    sent = set(re.findall(r'^\s+code = "(\w+)"', (ROOT / "clagd/errors.py").read_text(), re.M))
    # the base class's; the client's own (no daemon); a bad config and a held lock stop
    # the daemon's start, they are never a reply
    sent -= {"error", "not_running", "config", "locked"}
    for name in ("server.py", "query_worker.py", "queryproc.py", "daemon.py"):
        text = (ROOT / "clagd" / "serve" / name).read_text(encoding="utf-8")
        sent |= set(re.findall(r'error_reply\(\s*\w+,\s*"(\w+)"', text))
        sent |= set(re.findall(r'ClagdError\(\s*f?"[^"]*",\s*"(\w+)"', text, re.S))
    assert sent - documented == set(), "codes sent but not in docs/protocol.md"
