"""Token accounting with the real `ollama` client against the loopback server: the limit
that cut an answer, the tokens of failed answers, prompt budgets calibrated on the server's
own counts; and the GGUF checks (base vs instruct) on what GGUF metadata says."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_ollama import FakeOllama, invalid_json

from clagd.config import OllamaConfig
from clagd.engine.core import Engine
from clagd.errors import BackendError
from clagd.organize.session import run_session
from clagd.slm.base import TokenCalibration
from clagd.slm.llamacpp_worker import model_kind
from clagd.slm.ollama import OllamaBackend

SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
MSGS = [{"role": "user", "content": "Tell me a long story about the sea and the wind."}]


def _backend(fake: FakeOllama, num_ctx: int = 2048) -> OllamaBackend:
    return OllamaBackend(OllamaConfig(host=fake.url, num_ctx=num_ctx, timeout=5.0))


def test_truncation_blames_the_context_window_when_it_cut(fake: FakeOllama) -> None:
    cut = {"content": '{"a": "once upon a ti', "done_reason": "length"}
    fake.script.append({**cut, "prompt_eval_count": 1566, "eval_count": 482})
    with pytest.raises(BackendError) as info:
        _backend(fake).chat_json(MSGS, SCHEMA)
    msg = str(info.value)
    assert "cut off by the context window (1,566 prompt + 482 answer tokens = 2,048)" in msg
    assert info.value.prompt_tokens == 1566 and info.value.completion_tokens == 482
    # a short answer cut while the window had room: not the window (Ollama sets no
    # max_tokens here, so a server-side limit)
    fake.script.append({**cut, "prompt_eval_count": 300, "eval_count": 100})
    with pytest.raises(BackendError, match="server-side limit after 100 answer tokens"):
        _backend(fake).chat_json(MSGS, SCHEMA)


def test_prompt_budget_is_calibrated_on_the_servers_counts(fake: FakeOllama) -> None:
    b = _backend(fake)
    raw = TokenCalibration.raw(MSGS)
    assert b.count_tokens(MSGS) > raw  # starts on the safe side (x1.4)
    fake.script.append({"content": {"a": "x"}, "prompt_eval_count": raw * 2, "eval_count": 3})
    b.chat_json(MSGS, SCHEMA)
    assert b.count_tokens(MSGS) >= raw * 2  # the server said twice the estimate
    fake.script.append({"content": {"a": "x"}, "prompt_eval_count": raw // 2, "eval_count": 3})
    b.chat_json(MSGS, SCHEMA)  # a cached prefix reports fewer: the budget does not shrink
    assert b.count_tokens(MSGS) >= raw * 2


def test_session_counts_the_tokens_of_failed_answers(store: Path, fake: FakeOllama) -> None:
    eng = Engine(store)
    try:
        eng.add([{"content": f"note {i} about the garden"} for i in range(4)])
        fake.script += [
            {**invalid_json(), "prompt_eval_count": 1000, "eval_count": 300},
            {**invalid_json(), "prompt_eval_count": 1100, "eval_count": 310},
        ]
        out = run_session(eng.writer.submit, _backend(fake), eng.config, eng.paths.prompts)
        assert out.status == "fallback" and out.calls == 2
        assert out.prompt_tokens == 2100 and out.completion_tokens == 610
    finally:
        eng.close()


@pytest.mark.parametrize(
    ("meta", "path", "kind"),
    [
        ({"general.name": "Smollm2 135M", "general.finetune": "8k-lc100k"}, "SmolLM2-135M-Instruct.Q4_1.gguf", "instruct"),
        ({"general.name": "gemma-3-270m", "general.basename": "gemma-3"}, "gemma-3-270m-it-Q4_K_M.gguf", "instruct"),
        ({"general.name": "Gemma 3 270m", "general.type": "model"}, "gemma3-270m-base.Q4_K_M.gguf", "base"),
        ({"general.name": "Qwen2.5 1.5B Instruct"}, "model.gguf", "instruct"),
        ({"general.name": "gemma-3-270m"}, "gemma-3-270m-Q4_K_M.gguf", "unknown"),
    ],
)  # fmt: skip
def test_model_kind_from_gguf_metadata(meta: dict, path: str, kind: str) -> None:
    assert model_kind(meta, path) == kind
