"""The SLM backend protocol, JSON answer checking, and `auto` backend selection.

Every backend answers `chat_json(messages, schema)` with a parsed, schema-checked mapping or
raises `BackendError` with a message a user can act on. Nothing here retries: the session
decides what a failure means (retry with another seed, or the lexical fallback).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from clagd.config import Config
from clagd.errors import BackendError
from clagd.slm.schema import schema_errors
from clagd.text import estimate_tokens


@dataclass
class ChatResult:
    data: dict[str, Any]
    prompt_tokens: int
    completion_tokens: int
    seconds: float
    raw: str


@runtime_checkable
class Backend(Protocol):
    name: str  # "ollama" | "llamacpp" | "none"
    model: str  # model name or GGUF path, as shown in trailers and `status`
    context_tokens: int  # the context window the session must fit each call into

    @property
    def seed(self) -> int:
        """The seed a session's first plan is asked with (the next attempt adds to it)."""
        ...

    def available(self) -> tuple[bool, str]:
        """Cheap, time-bounded check: can this backend answer now? (ok, reason)."""
        ...

    def chat_json(
        self,
        messages: list[dict[str, str]],
        schema: dict[str, Any],
        seed: int | None = None,
        timeout: float | None = None,
    ) -> ChatResult: ...

    def count_tokens(self, messages: list[dict[str, str]]) -> int:
        """The prompt's size in the model's own tokens (exact, or calibrated on answers)."""
        ...

    def close(self) -> None: ...


# a chat template wraps every message in a few special tokens (role, start, end)
MESSAGE_OVERHEAD = 8
# the word-based estimate undercounts real prompts (measured ~26% with SmolLM2's tokenizer)
INITIAL_RATIO = 1.4


class TokenCalibration:
    """Prompt sizes for backends that cannot tokenize before the call (Ollama, an OpenAI
    server): the word-based estimate scaled by the largest real/estimate ratio the server's
    own counts (`prompt_eval_count`, `usage.prompt_tokens`) have shown so far. Starts on the
    safe side, so the first chunk of a session does not overflow the context window."""

    def __init__(self, ratio: float = INITIAL_RATIO) -> None:
        self.ratio = ratio
        self.observed = 0

    @staticmethod
    def raw(messages: list[dict[str, str]]) -> int:
        return sum(estimate_tokens(m.get("content", "")) + MESSAGE_OVERHEAD for m in messages)

    def count(self, messages: list[dict[str, str]]) -> int:
        return int(self.raw(messages) * self.ratio) + 1

    def observe(self, messages: list[dict[str, str]], real_prompt_tokens: int) -> None:
        est = self.raw(messages)
        if real_prompt_tokens <= 0 or est <= 0:
            return
        seen = real_prompt_tokens / est
        # the first real count replaces the guess; later ones only raise it (a server that
        # caches a prompt prefix reports fewer tokens, which must not shrink the budget)
        self.ratio = seen if self.observed == 0 else max(self.ratio, seen)
        self.observed += 1


def truncation_limit(
    prompt_tokens: int, completion_tokens: int, max_tokens: int | None, context_tokens: int
) -> str:
    """Which limit cut an answer off: the context window or max_tokens, with the numbers."""
    if context_tokens and prompt_tokens + completion_tokens >= context_tokens - 1:
        return (
            f"the context window ({prompt_tokens:,} prompt + {completion_tokens:,} answer "
            f"tokens = {context_tokens:,})"
        )
    if max_tokens:
        return f"max_tokens={max_tokens} ({completion_tokens:,} answer tokens)"
    return f"a server-side limit after {completion_tokens:,} answer tokens"


def checked_answer(
    raw: str,
    schema: dict[str, Any],
    who: str,
    *,
    finish_reason: str | None,
    prompt_tokens: int,
    completion_tokens: int,
    max_tokens: int | None,
    context_tokens: int,
) -> dict[str, Any]:
    """`parse_json_answer`, and when it fails: say which limit cut the answer (if one did),
    and carry the tokens the failed answer used, so the session counts them."""
    try:
        return parse_json_answer(raw, schema, who)
    except BackendError as exc:
        msg = str(exc)
        if finish_reason == "length":
            cut = truncation_limit(prompt_tokens, completion_tokens, max_tokens, context_tokens)
            msg = f"{who}: the answer was cut off by {cut}: {msg.removeprefix(who + ': ')}"
        raise BackendError(
            msg, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens
        ) from None


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise BackendError(f"the answer names key {key!r} twice")
        out[key] = value
    return out


def parse_json_answer(raw: str, schema: dict[str, Any], who: str) -> dict[str, Any]:
    """Parse a model's answer and check it against the schema it was constrained with.

    A constrained decoder should never produce a mismatch, but a server may ignore `format`
    (old Ollama versions do) and a truncated answer is invalid JSON: both are reported.
    """
    try:
        data = json.loads(raw, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as exc:
        snippet = raw[:80].replace("\n", " ")
        raise BackendError(
            f"{who}: the answer is not valid JSON ({exc.msg}): {snippet!r}"
        ) from None
    problems = schema_errors(data, schema)
    if problems:
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        raise BackendError(
            f"{who}: the answer does not match the schema: {'; '.join(problems[:3])}{more}"
        )
    if not isinstance(data, dict):
        raise BackendError(f"{who}: the answer is not a JSON object")
    return data


def select_backend(config: Config, current: Backend | None = None) -> tuple[Backend | None, str]:
    """Pick the backend `backend.kind` asks for; `auto` = ollama if it answers and has the
    model, else an OpenAI-compatible server if one is configured (`backend.openai.base_url`
    or OPENAI_BASE_URL) and answers, else llamacpp if installed with a GGUF, else None (the
    lexical organizer).

    Bounded in time (an Ollama probe of a few seconds at most, no model loading), so the
    scheduler can call it periodically. `current` is reused when it is still the choice, so a
    loaded llama.cpp worker survives a re-check.
    """
    cfg = config.backend
    kind = cfg.kind
    if kind == "none":  # before the backends' imports (~0.3 s: httpx, openai)
        if current is not None:
            current.close()
        return None, "backend.kind is none: lexical organizer"
    from clagd.slm.llamacpp import LlamaCppBackend
    from clagd.slm.ollama import OllamaBackend
    from clagd.slm.openai import OpenAIBackend

    def reuse(candidate: Backend) -> Backend:
        if (
            current is not None
            and current.name == candidate.name
            and current.model == candidate.model
            and getattr(current, "host", None) == getattr(candidate, "host", None)
        ):
            return current
        if current is not None:
            current.close()
        return candidate

    reasons: list[str] = []
    if kind in ("auto", "ollama"):
        oll = OllamaBackend(cfg.ollama)
        ok, why = oll.available()
        if ok:
            return reuse(oll), f"ollama: {why}"
        if kind == "ollama":
            if current is not None:
                current.close()
            return None, f"ollama unavailable ({why}): lexical organizer"
        reasons.append(f"ollama: {why}")
    if kind == "openai" or (kind == "auto" and OpenAIBackend(cfg.openai).configured()):
        oai = OpenAIBackend(cfg.openai)
        ok, why = oai.available()
        if ok:
            reasons.append(f"openai: {why}")
            return reuse(oai), "; ".join(reasons)
        if kind == "openai":
            if current is not None:
                current.close()
            return None, f"openai unavailable ({why}): lexical organizer"
        reasons.append(f"openai: {why}")
    if kind in ("auto", "llamacpp"):
        llc = LlamaCppBackend(cfg.llamacpp)
        ok, why = llc.available()
        if ok:
            reasons.append(f"llamacpp: {why}")
            return reuse(llc), "; ".join(reasons)
        reasons.append(f"llamacpp: {why}")
    if current is not None:
        current.close()
    return None, "; ".join(reasons) + ": lexical organizer"
