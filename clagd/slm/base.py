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

    def close(self) -> None: ...


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
    model, else llamacpp if installed with a GGUF, else None (the lexical organizer).

    Bounded in time (an Ollama probe of a few seconds at most, no model loading), so the
    scheduler can call it periodically. `current` is reused when it is still the choice, so a
    loaded llama.cpp worker survives a re-check.
    """
    from clagd.slm.llamacpp import LlamaCppBackend
    from clagd.slm.ollama import OllamaBackend

    cfg = config.backend
    kind = cfg.kind

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

    if kind == "none":
        if current is not None:
            current.close()
        return None, "backend.kind is none: lexical organizer"
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
