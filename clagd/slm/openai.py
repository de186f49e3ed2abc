"""OpenAI-compatible backend: `/v1/chat/completions` with a JSON-schema `response_format`.

One client for llama.cpp's server, llama-cpp-python's server, vLLM, LM Studio and Ollama's
`/v1`. It uses the official `openai` package (the `openai` extra) rather than raw httpx, so
that `OPENAI_BASE_URL` and `OPENAI_API_KEY` mean exactly what they mean to every other tool
the user runs against the same server; retries are off (`max_retries=0`: the session decides
what a failure means) and every call has an explicit timeout.

Servers differ in how they take a schema: the OpenAI form `{"type": "json_schema",
"json_schema": {...}}` (llama.cpp's server, vLLM, LM Studio, Ollama) or llama-cpp-python's
`{"type": "json_object", "schema": ...}`. `response_format: auto` tries the first and, when
the server refuses that form (HTTP 400/422, or llama-cpp-python's 500 naming
`response_format`), the second, and remembers what worked.
"""

from __future__ import annotations

import importlib.util
import os
import time
from typing import Any

from clagd.config import OpenAIConfig
from clagd.errors import BackendError
from clagd.slm.base import ChatResult, TokenCalibration, checked_answer

PROBE_TIMEOUT = 2.0
DEFAULT_BASE_URL = "https://api.openai.com/v1"
# local servers ignore the key, but the official client refuses to start without one
NO_KEY = "sk-no-key-required"


def openai_installed() -> bool:
    try:
        return importlib.util.find_spec("openai") is not None
    except (ImportError, ValueError):
        return False


def _short(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:160]


class OpenAIBackend:
    name = "openai"

    def __init__(
        self,
        cfg: OpenAIConfig,
        env: dict[str, str] | None = None,
        probe_timeout: float = PROBE_TIMEOUT,
    ) -> None:
        env = dict(os.environ if env is None else env)
        self.cfg = cfg
        # as the official client: explicit setting, else OPENAI_BASE_URL, else api.openai.com
        self.host = (cfg.base_url or env.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
        self.api_key = env.get("OPENAI_API_KEY") or NO_KEY
        self.model = cfg.model
        self.context_tokens = cfg.context_tokens
        self.probe_timeout = probe_timeout
        self.response_format: str = cfg.response_format  # the form that worked, once known
        self.tokens = TokenCalibration()

    @property
    def seed(self) -> int:
        return int(self.cfg.seed)

    def configured(self, env: dict[str, str] | None = None) -> bool:
        """Whether the user pointed clagd at a server: `auto` never sends memories to a
        default cloud endpoint nobody asked for."""
        env = dict(os.environ if env is None else env)
        return bool(self.cfg.base_url or env.get("OPENAI_BASE_URL"))

    def _client(self, timeout: float) -> Any:
        import openai

        return openai.OpenAI(
            base_url=self.host, api_key=self.api_key, timeout=timeout, max_retries=0
        )

    def available(self) -> tuple[bool, str]:
        if not openai_installed():
            return (
                False,
                "the openai package is not installed (pip install '.[openai]' in a checkout of clagd)",
            )
        import openai

        try:
            with self._client(self.probe_timeout) as client:
                names = [m.id for m in client.models.list()]
        except (openai.APIError, openai.OpenAIError) as exc:
            return False, f"no OpenAI-compatible server at {self.host} ({_short(exc)})"
        if not self.model:
            if not names:
                return False, f"the server at {self.host} lists no model"
            self.model = names[0]
        elif names and self.model not in names:
            shown = ", ".join(names[:5])
            return False, f"the server at {self.host} has no model {self.model!r} (it has {shown})"
        return True, f"OpenAI-compatible server at {self.host} with {self.model}"

    def count_tokens(self, messages: list[dict[str, str]]) -> int:
        """The estimate, calibrated on the server's `usage.prompt_tokens`."""
        return self.tokens.count(messages)

    def _formats(self, schema: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        json_schema = {
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema, "strict": True},
        }
        json_object = {"type": "json_object", "schema": schema}
        if self.response_format == "json_schema":
            return [("json_schema", json_schema)]
        if self.response_format == "json_object":
            return [("json_object", json_object)]
        return [("json_schema", json_schema), ("json_object", json_object)]

    def _create(
        self, messages: list[dict[str, str]], schema: dict[str, Any], seed: int, timeout: float
    ) -> Any:
        import openai

        formats = self._formats(schema)
        with self._client(timeout) as client:
            for i, (kind, fmt) in enumerate(formats):
                try:
                    resp = client.chat.completions.create(
                        model=self.model,
                        messages=messages,
                        response_format=fmt,
                        temperature=self.cfg.temperature,
                        seed=seed,
                        max_tokens=self.cfg.max_tokens,
                    )
                except openai.APIStatusError as exc:
                    # llama-cpp-python answers 500 (a validation error naming
                    # response_format), others 400/422
                    refused = exc.status_code in (400, 422) or "response_format" in str(exc)
                    if refused and i + 1 < len(formats):
                        continue  # this server takes the schema in the other form
                    raise
                self.response_format = kind
                return resp
        raise BackendError("openai: no response format left to try")  # pragma: no cover

    def chat_json(
        self,
        messages: list[dict[str, str]],
        schema: dict[str, Any],
        seed: int | None = None,
        timeout: float | None = None,
    ) -> ChatResult:
        import openai

        timeout = self.cfg.timeout if timeout is None else timeout
        start = time.monotonic()
        try:
            resp = self._create(messages, schema, self.cfg.seed if seed is None else seed, timeout)
        except openai.APITimeoutError:
            raise BackendError(
                f"openai: no answer from {self.host} within {timeout:g}s (model {self.model})"
            ) from None
        except openai.APIConnectionError:
            raise BackendError(f"openai: cannot reach a server at {self.host}") from None
        except openai.NotFoundError as exc:
            raise BackendError(
                f"openai: model {self.model!r} or the chat endpoint is not available at "
                f"{self.host} ({_short(exc)})"
            ) from None
        except openai.APIStatusError as exc:
            text = " ".join(str(exc).split())
            if "response_format" in text:
                raise BackendError(
                    f"openai: the server at {self.host} refused response_format "
                    f"{self.response_format!r} (HTTP {exc.status_code}); set "
                    "backend.openai.response_format to auto or json_object"
                ) from None
            raise BackendError(f"openai: HTTP {exc.status_code}: {text[:240]}") from None
        except openai.APIError as exc:
            raise BackendError(f"openai: {_short(exc)}") from None
        seconds = time.monotonic() - start
        if not resp.choices:
            raise BackendError(f"openai: the server at {self.host} sent no answer")
        choice = resp.choices[0]
        raw = choice.message.content or ""
        usage = resp.usage
        prompt_tokens = int(usage.prompt_tokens) if usage else 0
        completion_tokens = int(usage.completion_tokens) if usage else 0
        self.tokens.observe(messages, prompt_tokens)
        data = checked_answer(
            raw,
            schema,
            "openai",
            finish_reason=choice.finish_reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            max_tokens=self.cfg.max_tokens,
            context_tokens=self.context_tokens,
        )
        return ChatResult(data, prompt_tokens, completion_tokens, seconds, raw)

    def close(self) -> None:
        pass
