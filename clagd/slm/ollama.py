"""Ollama backend: the official client, structured outputs (`format=` a JSON schema)."""

from __future__ import annotations

import os
import time
from typing import Any

import httpx
import ollama

from clagd.config import OllamaConfig
from clagd.errors import BackendError
from clagd.slm.base import ChatResult, TokenCalibration, checked_answer

PROBE_TIMEOUT = 2.0


def _same_model(wanted: str, have: str) -> bool:
    if wanted == have:
        return True
    # "qwen2.5" means "qwen2.5:latest", as in `ollama run`
    return ":" not in wanted and have == f"{wanted}:latest"


class OllamaBackend:
    name = "ollama"

    def __init__(self, cfg: OllamaConfig, probe_timeout: float = PROBE_TIMEOUT) -> None:
        self.cfg = cfg
        self.model = cfg.model
        self.context_tokens = cfg.num_ctx
        self.host = cfg.host or os.environ.get("OLLAMA_HOST", "") or "http://127.0.0.1:11434"
        self.probe_timeout = probe_timeout
        self.tokens = TokenCalibration()

    def count_tokens(self, messages: list[dict[str, str]]) -> int:
        """Ollama has no tokenize endpoint: the estimate, calibrated on `prompt_eval_count`."""
        return self.tokens.count(messages)

    @property
    def seed(self) -> int:
        return int(self.cfg.seed)

    def _client(self, timeout: float) -> ollama.Client:
        return ollama.Client(host=self.host, timeout=timeout)

    def available(self) -> tuple[bool, str]:
        try:
            with self._client(self.probe_timeout) as client:
                # /api/version: is anything listening that speaks Ollama? (the client has no
                # method for it, so use its own httpx session)
                version = client._client.get("/api/version").json().get("version", "?")
                names = [m.model or "" for m in client.list().models]
        except (httpx.HTTPError, ConnectionError, ollama.ResponseError, ValueError) as exc:
            return False, f"no Ollama server at {self.host} ({_short(exc)})"
        if not any(_same_model(self.model, n) for n in names):
            return False, (
                f"Ollama {version} at {self.host} does not have model {self.model!r}; "
                f"run `ollama pull {self.model}`"
            )
        return True, f"Ollama {version} at {self.host} with {self.model}"

    def chat_json(
        self,
        messages: list[dict[str, str]],
        schema: dict[str, Any],
        seed: int | None = None,
        timeout: float | None = None,
    ) -> ChatResult:
        timeout = self.cfg.timeout if timeout is None else timeout
        options = {
            "temperature": self.cfg.temperature,
            "num_ctx": self.cfg.num_ctx,
            "seed": self.cfg.seed if seed is None else seed,
        }
        start = time.monotonic()
        try:
            with self._client(timeout) as client:
                resp = client.chat(
                    model=self.model,
                    messages=messages,
                    format=schema,
                    options=options,
                    keep_alive=self.cfg.keep_alive,
                    stream=False,
                )
        except httpx.TimeoutException:
            raise BackendError(
                f"ollama: no answer from {self.host} within {timeout:g}s (model {self.model})"
            ) from None
        except ConnectionError:
            raise BackendError(f"ollama: cannot reach a server at {self.host}") from None
        except ollama.ResponseError as exc:
            if exc.status_code == 404 or "not found" in str(exc.error).lower():
                raise BackendError(
                    f"ollama: model {self.model!r} is not available at {self.host}; "
                    f"run `ollama pull {self.model}`"
                ) from None
            raise BackendError(f"ollama: {exc.error} (HTTP {exc.status_code})") from None
        except httpx.HTTPError as exc:
            raise BackendError(f"ollama: {_short(exc)}") from None
        seconds = time.monotonic() - start
        raw = resp.message.content or ""
        prompt_tokens = int(resp.prompt_eval_count or 0)
        completion_tokens = int(resp.eval_count or 0)
        self.tokens.observe(messages, prompt_tokens)
        data = checked_answer(
            raw,
            schema,
            "ollama",
            finish_reason=getattr(resp, "done_reason", None),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            max_tokens=None,
            context_tokens=self.cfg.num_ctx,
        )
        return ChatResult(data, prompt_tokens, completion_tokens, seconds, raw)

    def close(self) -> None:
        pass


def _short(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:160]
