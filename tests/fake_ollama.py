"""A loopback HTTP server that speaks enough of Ollama's API for the real `ollama` client.

It answers `/api/chat` (non-streaming) from a SCRIPT: a queue of answers, each a dict
(`content` text or JSON-able value, `delay` seconds, `status`/`error` for HTTP errors, token
counts) or a callable `request_json -> answer`. When the script is empty it answers like a
well-behaved model honouring `format`: a valid plan for a plan schema, all "yes" for a
validation schema. Every request is recorded (`server.requests`) so tests can assert which
`format` schema and `options` were sent. Usable as a context manager, from tests and benchmarks.

    with FakeOllama(models=["qwen2.5:1.5b-instruct"]) as srv:
        srv.script += [invalid_json(), good_plan()]
        OllamaConfig(host=srv.url)
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Answer = dict[str, Any]
Script = list[Answer | Callable[[dict[str, Any]], Answer]]


# -- answers ------------------------------------------------------------------------------


def _aliases(req: dict[str, Any]) -> tuple[list[str], list[str], list[str]]:
    """(memory aliases, existing cluster aliases, new cluster aliases) from a plan schema."""
    props = req["format"]["properties"]
    mems = list(props["assign"]["required"])
    targets = props["clusters"]["items"]["properties"]["id"]["enum"]
    return (
        mems,
        [t for t in targets if t.startswith("C")],
        [t for t in targets if t.startswith("N")],
    )


def is_plan_request(req: dict[str, Any]) -> bool:
    fmt = req.get("format")
    return isinstance(fmt, dict) and "assign" in fmt.get("properties", {})


def _plan(
    req: dict[str, Any], names: tuple[str, ...] = ("user daily notes", "user extra notes")
) -> dict[str, Any]:
    """Memories split in halves over up to two new clusters: valid for any plan schema."""
    mems, _existing, new = _aliases(req)
    half = max(1, len(mems) // 2) if len(new) > 1 and len(mems) > 1 else len(mems)
    groups = [(new[0], mems[:half])]
    if half < len(mems):
        groups.append((new[1], mems[half:]))
    return {
        "clusters": [
            {"id": ref, "name": names[i], "description": f"Notes group {i + 1}.", "tags": ["notes"]}
            for i, (ref, _m) in enumerate(groups)
        ],
        "assign": {m: ref for ref, ms in groups for m in ms},
        "conflicts": [],
        "reason": "grouped by the fake model",
    }


def default_answer(req: dict[str, Any]) -> Answer:
    fmt = req.get("format")
    if is_plan_request(req):
        return {"content": _plan(req)}
    if isinstance(fmt, dict) and "verdicts" in fmt.get("properties", {}):
        keys = fmt["properties"]["verdicts"]["required"]
        return {"content": {"verdicts": {k: "yes" for k in keys}}}
    return {"content": {} if fmt else "ok"}


def good_plan(names: tuple[str, ...] = ("user daily notes", "user extra notes")) -> Callable:
    return lambda req: {"content": _plan(req, names)}


def invalid_json() -> Answer:
    return {"content": '{"clusters": [{"id": "N1", "name": "unfinished'}


def delay(seconds: float, then: Answer | None = None) -> Callable:
    return lambda req: {**(then or default_answer(req)), "delay": seconds}


def unknown_id() -> Callable:
    def make(req: dict[str, Any]) -> Answer:
        plan = _plan(req)
        first = next(iter(plan["assign"]))
        plan["assign"][first] = "C999"
        return {"content": plan}

    return make


def dropped_memory() -> Callable:
    def make(req: dict[str, Any]) -> Answer:
        plan = _plan(req)
        plan["assign"].pop(next(reversed(plan["assign"])))
        return {"content": plan}

    return make


def assigned_twice() -> Callable:
    """The same memory key twice in `assign` (only expressible as raw JSON text)."""

    def make(req: dict[str, Any]) -> Answer:
        plan = _plan(req)
        first, ref = next(iter(plan["assign"].items()))
        other = next((c["id"] for c in plan["clusters"] if c["id"] != ref), "N2")
        text = json.dumps(plan)
        dup = f'"assign": {{"{first}": "{other}", '
        return {"content": text.replace('"assign": {', dup, 1)}

    return make


def empty_cluster() -> Callable:
    def make(req: dict[str, Any]) -> Answer:
        plan = _plan(req)
        _m, _c, new = _aliases(req)
        used = {c["id"] for c in plan["clusters"]}
        spare = next(n for n in new if n not in used)
        plan["clusters"].append(
            {"id": spare, "name": "nothing in here", "description": "Empty.", "tags": []}
        )
        return {"content": plan}

    return make


def duplicate_names() -> Callable:
    return lambda req: {"content": _plan(req, ("user daily notes", "User Daily Notes"))}


def verdicts(answer: str) -> Callable:
    def make(req: dict[str, Any]) -> Answer:
        keys = req["format"]["properties"]["verdicts"]["required"]
        return {"content": {"verdicts": {k: answer for k in keys}}}

    return make


def http_error(status: int, error: str) -> Answer:
    return {"status": status, "error": error}


# -- the server ---------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib name
        pass

    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client gave up (a timeout test)
            pass

    def do_GET(self) -> None:
        owner = self.server.owner
        owner.record(self.path, None)
        if owner.probe_delay:  # a server that is slow to say what it is
            owner.stopping.wait(owner.probe_delay)
        if self.path == "/api/version":
            self._send(200, {"version": owner.version})
        elif self.path == "/api/tags":
            models = [
                {"name": m, "model": m, "modified_at": "2025-01-01T00:00:00Z", "size": 1}
                for m in owner.models
            ]
            self._send(200, {"models": models})
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self) -> None:
        owner = self.server.owner
        length = int(self.headers.get("Content-Length") or 0)
        try:
            req = json.loads(self.rfile.read(length) or b"{}")
        except json.JSONDecodeError:
            self._send(400, {"error": "bad json"})
            return
        owner.record(self.path, req)
        if self.path != "/api/chat":
            self._send(404, {"error": "not found"})
            return
        if req.get("model") not in owner.models:
            self._send(404, {"error": f"model '{req.get('model')}' not found"})
            return
        answer = owner.next_answer(req)
        if answer.get("delay"):
            owner.stopping.wait(float(answer["delay"]))
        if "status" in answer:
            self._send(int(answer["status"]), {"error": answer.get("error", "error")})
            return
        content = answer.get("content", "")
        if not isinstance(content, str):
            content = json.dumps(content)
        prompt_text = " ".join(str(m.get("content", "")) for m in req.get("messages", []))
        self._send(
            200,
            {
                "model": req["model"],
                "created_at": "2025-01-01T00:00:00Z",
                "message": {"role": "assistant", "content": content},
                "done": True,
                "done_reason": answer.get("done_reason", "stop"),
                "prompt_eval_count": answer.get("prompt_eval_count", len(prompt_text) // 4),
                "eval_count": answer.get("eval_count", max(1, len(content) // 4)),
            },
        )


class _Server(ThreadingHTTPServer):
    daemon_threads = False
    block_on_close = True
    owner: FakeOllama

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up during a delay is expected


class FakeOllama:
    def __init__(self, models: list[str] | None = None, version: str = "0.6.0-fake") -> None:
        self.models = list(models or ["qwen2.5:1.5b-instruct"])
        self.version = version
        self.script: Script = []
        # what answers when the script is empty (a well-behaved model by default; tests put
        # a competent stand-in here, see competent.py)
        self.default: Callable[[dict[str, Any]], Answer] = default_answer
        self.requests: list[tuple[str, dict[str, Any] | None]] = []
        self.probe_delay = 0.0  # seconds before each GET (`/api/version`, `/api/tags`)
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.owner = self
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def chats(self) -> list[dict[str, Any]]:
        return [r for p, r in self.requests if p == "/api/chat" and r is not None]

    def record(self, path: str, req: dict[str, Any] | None) -> None:
        with self._lock:
            self.requests.append((path, req))

    def next_answer(self, req: dict[str, Any]) -> Answer:
        with self._lock:
            item = self.script.pop(0) if self.script else self.default
        return item(req) if callable(item) else item

    def start(self) -> FakeOllama:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> FakeOllama:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def wait_until(pred: Callable[[], bool], timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return pred()
